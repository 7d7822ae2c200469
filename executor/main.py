"""`petal-dispatch executor`: the supervisor, its journal writer and its LISTEN connection, as one process."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config

from executor import fleet, notify, projects, threads
from executor import harness as harness_mcp
from executor.harness import rules as gate_rules
from executor.journal_writer import HOLD_BYTES as JOURNAL_HOLD_BYTES
from executor.journal_writer import JournalWriter
from executor.settler import Settler, SettlerConfig
from executor.substrate import SubstrateConfig
from executor.supervisor import Supervisor, SupervisorConfig
from shared import database, dbserver, errors, logs, ports
from shared.database import OUTAGE_ERRORS, Availability, Database
from shared.settings import Settings

log = logs.get(__name__)

# Channels the executor listens on. Each carries an id; readers re-read the tables.
CHANNELS = ["task_pending", "stop_queue", "question_answered", "chat_queue", "thread_control_queue", "journal",
            "notify_queue", "task_changed", "project_queue",
            "gate_rule_queue"]
# At shutdown, how long the settler may act on the ends the stop itself caused (the next start does the rest).
FINAL_SETTLE_TIMEOUT_S = 10
# The per-spawn MCP config's timeout sits this far above the ask timeout, so the CLI never cuts an ask short.
MCP_TIMEOUT_MARGIN_S = 120
# The executor's loops wait this long for a pooled connection before counting the database as away.
ACQUIRE_TIMEOUT_S = 5.0


def substrate_config(settings: Settings, env: Mapping[str, str]) -> SubstrateConfig:
    return SubstrateConfig(
        claude_bin=settings.claude_bin,
        config_dir=settings.claude_config_dir,
        base_env=dict(env),
        max_retries=settings.claude_max_retries,
        api_timeout_ms=settings.claude_api_timeout_ms,
        byte_stream_idle_timeout_ms=settings.claude_stream_idle_timeout_ms,
    )


def supervisor_config(settings: Settings) -> SupervisorConfig:
    return SupervisorConfig(
        mcp_url=f"http://{settings.mcp_host}:{settings.mcp_port}{harness_mcp.PATH}",
        mcp_timeout_ms=int((settings.ask_timeout_s + MCP_TIMEOUT_MARGIN_S) * 1000),
        max_workers=settings.max_workers,
        stall_timeout_s=settings.stall_timeout_s,
        stop_grace_s=settings.stop_grace_s,
        max_runtime_s=settings.max_runtime_s,
        default_workdir=settings.workdir,
        run_dir=settings.data_dir.resolve() / "run",
        worktree_dir=settings.worktree_dir,
        keep_worktrees=settings.keep_worktrees,
        name=settings.executor_name or fleet.default_name(),
        labels=fleet.parse_labels(settings.executor_labels),
        lease_s=settings.lease_s,
        shared_claude_config=settings.shared_claude_config,
    )


def notify_config(settings: Settings) -> notify.NotifyConfig:
    return notify.NotifyConfig(
        data_dir=settings.data_dir.resolve(), vapid_private_key=settings.vapid_private_key,
        vapid_subject=settings.vapid_subject, ntfy_url=settings.ntfy_url, ntfy_token=settings.ntfy_token,
        public_url=settings.public_url, rate_limit_s=settings.notify_rate_limit_s,
        allow_loopback_push=settings.push_allow_loopback)


async def serve(dsn: str, substrate: SubstrateConfig, config: SupervisorConfig, stop: asyncio.Event, *,
                mcp_host: str = "127.0.0.1", mcp_port: int = 8002, ask_timeout_s: float = 300.0,
                extract: bool = True, backoff_base_s: float = 30.0,
                notify_config: notify.NotifyConfig | None = None,
                project_roots: tuple[Path, ...] = (),
                journal_hold_bytes: int = JOURNAL_HOLD_BYTES) -> None:
    # started during an outage, it waits for the database instead of exiting
    async with Database(dsn, name="petal-executor", acquire_timeout_s=ACQUIRE_TIMEOUT_S, at_start="wait",
                        stop=stop) as db:
        if stop.is_set():  # stopped while waiting for the database
            return
        writer = JournalWriter(db.pool, spill_dir=config.run_dir, hold_bytes=journal_hold_bytes)
        await writer.start()
        listener = db.listener(CHANNELS)
        wake = listener.subscribe(["task_pending", "stop_queue"])
        listening = asyncio.create_task(listener.run(), name="listener")
        with contextlib.suppress(TimeoutError):  # an outage right now: the listener goes on trying
            await asyncio.wait_for(listener.connected.wait(), 30)
        harness = harness_mcp.Harness(db, writer, listener, ask_timeout_s)
        mcp_stop = asyncio.Event()
        mcp_config = Config()
        mcp_config.bind = [f"{mcp_host}:{mcp_port}"]
        mcp_config.accesslog = None
        mcp_config.graceful_timeout = 2.0
        mcp_app = harness_mcp.asgi_app(harness_mcp.build(harness), mcp_host)
        # hypercorn types the app with its own ASGI scope TypedDicts, starlette with a plain mapping
        serving_mcp = asyncio.create_task(
            hypercorn_serve(mcp_app, mcp_config, shutdown_trigger=mcp_stop.wait),  # type: ignore[arg-type]
            name="harness-mcp")
        supervisor = Supervisor(db, writer, substrate, config)
        supervisor.on_credential_revoked = harness.forget
        conversations = threads.Threads(db.pool, writer)
        # every end is acted on from the store (extraction, the policy, the thread's turn boundary)
        settler = Settler(db.pool, SettlerConfig(extract=extract, backoff_base_s=backoff_base_s), conversations.wake)
        settle_sub = listener.subscribe(["task_changed"])
        settling = asyncio.create_task(
            _outliving_outages("settler", lambda: settler.run(settle_sub), db.availability), name="settler")
        supervising = asyncio.create_task(supervisor.run(wake), name="supervisor")
        thread_sub = listener.subscribe(["chat_queue", "thread_control_queue", "question_answered"])
        delivering = asyncio.create_task(
            _outliving_outages("threads", lambda: conversations.run(thread_sub), db.availability), name="threads")
        repos = projects.Projects(db.pool, writer, projects.ProjectsConfig(project_roots, config.keep_worktrees))
        project_sub = listener.subscribe(["project_queue"])
        managing = asyncio.create_task(
            _outliving_outages("projects", lambda: repos.run(project_sub), db.availability), name="projects")
        notifier = notify.Notifier(db.pool, notify_config or notify.NotifyConfig(),
                                   notify.Duty(dsn, notify.NOTIFIER_DUTY, config.name), name=config.name)
        await db.availability.retry(notifier.start, "notifier")
        notify_sub = listener.subscribe(["journal", "notify_queue"])
        notifying = asyncio.create_task(
            _outliving_outages("notifier", lambda: notifier.run(notify_sub), db.availability), name="notifier")
        rule_sub = listener.subscribe(["gate_rule_queue"])
        ruling = asyncio.create_task(_outliving_outages(
            "gate-rules", lambda: gate_rules.run_rule_queue(db.pool, writer, rule_sub), db.availability),
            name="gate-rules")
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({supervising, listening, stopping, serving_mcp, settling},
                               return_when=asyncio.FIRST_COMPLETED)
            supervisor.stop()
            await supervising  # re-raises a supervisor crash (e.g. another executor holds the lock)
            if serving_mcp.done():
                serving_mcp.result()  # e.g. the MCP port is taken
            if settling.done():
                settling.result()
            settling.cancel()
            await asyncio.gather(settling, return_exceptions=True)
            # the ends the stop itself caused; whatever is left is settled by the next start
            with contextlib.suppress(Exception):
                await asyncio.wait_for(settler.settle_pending(), FINAL_SETTLE_TIMEOUT_S)
        finally:
            settling.cancel()
            delivering.cancel()
            notifying.cancel()
            managing.cancel()
            ruling.cancel()
            await asyncio.gather(settling, delivering, notifying, managing, ruling, return_exceptions=True)
            mcp_stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(serving_mcp, 10)
            listening.cancel()
            stopping.cancel()
            await asyncio.gather(listening, stopping, return_exceptions=True)
            await writer.flush_and_stop()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(settings: Settings) -> None:
    """The harness MCP lets its caller dispatch workers that run Bash: it stays on loopback unless forced."""
    if not is_loopback(settings.mcp_host) and not settings.mcp_force_bind:
        raise errors.ConfigError(
            f"refusing to serve the harness MCP on PETAL_MCP_HOST={settings.mcp_host}: it must be a loopback "
            "address (127.0.0.1) unless PETAL_MCP_FORCE_BIND=1 says the network itself is trusted")


async def _outliving_outages(name: str, run: Callable[[], Awaitable[None]], availability: Availability) -> None:
    """Run a loop; a database error that escapes it restarts it after the outage back-off instead of
    ending it (each loop catches its own, this is the backstop)."""
    while True:
        try:
            return await run()
        except OUTAGE_ERRORS as exc:
            await availability.pause(exc, name)


def main(settings: Settings) -> int:
    check_bind(settings)
    ports.check_free(settings.mcp_host, settings.mcp_port, "harness MCP server")
    dbserver.check_data_dir(settings)  # its run files and keys live there, whichever database it uses
    info = dbserver.resolve(settings)
    database.wait_for_schema(info.executor_dsn, "petal-executor")  # started during an outage: it waits

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(info.executor_dsn, substrate_config(settings, os.environ), supervisor_config(settings), stop,
                    mcp_host=settings.mcp_host, mcp_port=settings.mcp_port, ask_timeout_s=settings.ask_timeout_s,
                    backoff_base_s=settings.backoff_base_s, notify_config=notify_config(settings),
                    project_roots=settings.project_root_paths, journal_hold_bytes=settings.journal_hold_bytes)

    asyncio.run(run())
    log.info("executor_stopped")
    return 0
