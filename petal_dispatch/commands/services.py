"""Running the services: `up` (everything, supervised), `executor` and `ingress` (one each, as systemd runs them).

Each service is wired here: its refusals first (before it takes a lock, a port or the database), then where
the database is, then its config built from the settings, served until SIGTERM or SIGINT. Each command
imports the service it runs, and only that one.
"""

from __future__ import annotations

import argparse
import os

from petal_dispatch import config, datalock, dbfiles, dbserver, doctor, executor_wiring, ingress_wiring, ports, signals
from petal_dispatch.config import Settings
from shared import database, errors, logs

log = logs.get(__name__)


def up(args: argparse.Namespace, settings: Settings) -> int:
    from petal_dispatch import up as up_mod

    overrides = {k: v for k, v in {"ingress_host": args.host, "ingress_port": args.port, "mcp_port": args.mcp_port,
                                   "data_dir": args.data_dir}.items() if v is not None}
    if args.scenario is not None and not args.demo:
        raise errors.ConfigError("--scenario goes with --demo (it is what the scripted model plays)")
    return up_mod.run(config.absolute(settings.model_copy(update=overrides)), os.environ, demo=args.demo,
                      scenario=args.scenario)


def doctor_command(args: argparse.Namespace, settings: Settings) -> int:
    overrides = {k: v for k, v in {"ingress_port": args.port, "mcp_port": args.mcp_port}.items() if v is not None}
    return doctor.main(settings.model_copy(update=overrides), os.environ)


def executor(args: argparse.Namespace, settings: Settings) -> int:
    from executor import main as executor_main

    if args.name is not None:
        if not args.name.strip():
            raise errors.ConfigError("--name must not be empty")
        settings = settings.model_copy(update={"executor_name": args.name.strip()})
    executor_wiring.check_executor_bind(settings)
    # before anything starts: the checks of `doctor` (the sandbox probe among them: no unsandboxed spawn, ever)
    claude = doctor.require(settings, os.environ, scope="executor")
    settings = settings.model_copy(update={"claude_bin": str(claude)})
    sandbox = executor_wiring.sandbox_policy(settings, os.environ)
    dbfiles.check_data_dir(settings)  # its run files and keys live there, whichever database it uses
    # one executor per data directory (`up` runs its own under this lock): a second is refused at once,
    # naming the holder, before it binds a port or writes anything
    with datalock.acquire(settings, datalock.EXECUTOR):
        ports.check_free(settings.mcp_host, settings.mcp_port, "harness MCP server")
        info = dbserver.resolve(settings)
        database.wait_for_schema(info.executor_dsn, "petal-executor")  # started during an outage: it waits
        served = executor_wiring.executor_config(settings, os.environ, info.executor_dsn, sandbox)
        signals.serve_until_stopped(executor_main.serve, served, stop_within_s=executor_main.stop_within_s(served))
        log.info("executor_stopped")
    return 0


def ingress(args: argparse.Namespace, settings: Settings) -> int:
    from ingress import main as ingress_main

    ingress_wiring.check_ingress(settings)  # before waiting for the database: a set-up that cannot work says so at once
    ports.check_free(settings.ingress_host, settings.ingress_port, "ingress", shared=settings.ingress_reuse_port)
    info = dbserver.resolve(settings)
    database.wait_for_schema(info.ingress_dsn, "petal-ingress")  # started during an outage: it waits
    served = ingress_wiring.ingress_config(settings, info.ingress_dsn)
    # its stop is hypercorn's graceful one and the pool's close
    signals.serve_until_stopped(ingress_main.serve, served, stop_within_s=served.graceful_timeout_s + 15)
    return 0
