"""The `petal-dispatch` command. Settings are read here, once, and passed down."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from collections.abc import Callable, Sequence

import psycopg

from shared import dbserver, errors, logs, migrate, settings as settings_mod
from shared.settings import Settings

Handler = Callable[[argparse.Namespace, Settings], int]


def _cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    info = dbserver.resolve(settings, auto_migrate=False)
    applied = migrate.migrate(dbserver.admin(info))
    if applied:
        for mig in applied:
            print(f"applied {mig.path.name}")
    else:
        print("migrations current: nothing to apply")
    return 0


def _cmd_db_status(args: argparse.Namespace, settings: Settings) -> int:
    info = dbserver.resolve(settings, auto_migrate=False)
    state = migrate.status(info.admin_dsn or info.executor_dsn)
    report = {
        "server": info.location,
        "embedded": info.embedded,
        "dsn": {"admin": info.admin_dsn, "executor": info.executor_dsn, "ingress": info.ingress_dsn},
        "migrations": {"current": state.current, "applied": state.applied, "pending": state.pending},
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"server:       {report['server']}")
        for role, dsn in report["dsn"].items():
            print(f"{role + ' dsn:':<14}{dsn}")
        pending = ", ".join(f"{v:04d}" for v in state.pending)
        print(f"migrations:   {'current' if state.current else 'pending ' + pending} ({len(state.applied)} applied)")
    return 0


def _cmd_executor(args: argparse.Namespace, settings: Settings) -> int:
    from executor import main as executor_main

    return executor_main.main(settings)


def _cmd_install_claude(args: argparse.Namespace, settings: Settings) -> int:
    from executor import cli_install

    print(cli_install.install())
    return 0


def _cmd_import_transcript(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio
    import uuid

    from executor import transcript
    from shared.database import Database

    if not args.file.is_file():
        raise errors.ConfigError(f"no such file: {args.file}")
    project = uuid.UUID(args.project) if args.project else None
    info = dbserver.resolve(settings)

    async def run() -> dict[str, object]:
        async with Database(info.executor_dsn, name="petal-import", max_size=2) as db:
            return await transcript.import_transcript(db.pool, args.file, project_id=project, role=args.role)

    print(json.dumps(asyncio.run(run())))
    return 0


def _cmd_ingress(args: argparse.Namespace, settings: Settings) -> int:
    from ingress import main as ingress_main

    return ingress_main.main(settings)


def _cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    import os

    from shared import up

    overrides = {k: v for k, v in {"ingress_host": args.host, "ingress_port": args.port, "mcp_port": args.mcp_port,
                                   "data_dir": args.data_dir}.items() if v is not None}
    return up.run(settings.model_copy(update=overrides), os.environ)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="petal-dispatch", description="Drive Claude Code from a phone or browser.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("up", help="start everything: database, migrations, executor, ingress")
    p.add_argument("--host", help="ingress bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="ingress port (default 8000)")
    p.add_argument("--mcp-port", type=int, help="harness MCP port (default 8002)")
    p.add_argument("--data-dir", type=Path, help="data directory (default ./var)")
    p.set_defaults(handler=_cmd_up)

    p = sub.add_parser("migrate", help="apply pending database migrations")
    p.set_defaults(handler=_cmd_migrate)

    p = sub.add_parser("executor", help="run the executor: supervisor, journal writer, harness MCP")
    p.set_defaults(handler=_cmd_executor)

    p = sub.add_parser("ingress", help="run the ingress: REST actions, reads, SSE, the web client")
    p.set_defaults(handler=_cmd_ingress)

    p = sub.add_parser("install-claude", help="install the pinned Claude Code CLI into a local cache (needs npm)")
    p.set_defaults(handler=_cmd_install_claude)

    p = sub.add_parser("import-transcript", help="journal a recorded stream-json file as one finished task")
    p.add_argument("file", type=Path)
    p.add_argument("--project", help="project id to file it under")
    p.add_argument("--role", default="worker", help="the role to record (default: worker)")
    p.set_defaults(handler=_cmd_import_transcript)

    db = sub.add_parser("db", help="database commands").add_subparsers(dest="db_command", required=True)
    p = db.add_parser("status", help="where the server is, each role's DSN, whether migrations are current")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_cmd_db_status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = settings_mod.load()
    logs.configure(settings.log_level, settings.log_format)
    handler: Handler = args.handler
    try:
        return handler(args, settings)
    except errors.PetalError as exc:
        print(f"petal-dispatch: {exc}", file=sys.stderr)
        return 2
    except psycopg.OperationalError as exc:
        print(f"petal-dispatch: cannot reach the database: {str(exc).strip()}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
