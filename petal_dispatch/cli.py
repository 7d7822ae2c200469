"""The `petal-dispatch` command. Settings are read here, once, and passed down."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from petal_dispatch import config, dbserver
from petal_dispatch.commands import services
from petal_dispatch.config import Settings
from shared import errors, lifeline, logs, migrate

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

Handler = Callable[[argparse.Namespace, Settings], int]
T = TypeVar("T")
# Commands that write the data directory (the database, run files, keys, worktrees): what they create is
# this user's alone (directories 0700, files 0600), whatever umask they were started with.
PRIVATE_COMMANDS = frozenset({"up", "executor", "ingress", "migrate"})


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
    info = dbserver.resolve(settings, auto_migrate=False, start=False)  # read-only: never starts a server
    state = migrate.status(info.admin_dsn or info.executor_dsn)
    # shown, never their passwords (a terminal's scrollback and a pasted bug report are not secret)
    dsns = {role: dbserver.redacted(dsn) if dsn else dsn for role, dsn in
            (("admin", info.admin_dsn), ("executor", info.executor_dsn), ("ingress", info.ingress_dsn))}
    report = {
        "server": info.location,
        "embedded": info.embedded,
        "dsn": dsns,
        "migrations": {"current": state.current, "applied": state.applied, "pending": state.pending},
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"server:       {report['server']}")
        for role, dsn in dsns.items():
            print(f"{role + ' dsn:':<14}{dsn}")
        pending = ", ".join(f"{v:04d}" for v in state.pending)
        print(f"migrations:   {'current' if state.current else 'pending ' + pending} ({len(state.applied)} applied)")
    return 0


def _cmd_install_claude(args: argparse.Namespace, settings: Settings) -> int:
    from petal_dispatch import cli_install

    # PETAL_CLAUDE_VERSION (an exact version or a tag such as "latest") runs the suite against another CLI
    version = cli_install.resolve(args.version or os.environ.get("PETAL_CLAUDE_VERSION")
                                  or cli_install.CLAUDE_CODE_VERSION)
    print(cli_install.install(version=version))
    return 0


def _cmd_import_transcript(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio
    import uuid

    from executor.run import transcript
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


def _with_pool(settings: Settings, work: Callable[[AsyncConnectionPool], Awaitable[T]]) -> T:
    import asyncio

    from shared.database import Database

    info = dbserver.resolve(settings)

    async def run() -> T:
        async with Database(info.executor_dsn, name="petal-cli", max_size=2) as db:
            return await work(db.pool)

    return asyncio.run(run())


def _cmd_contract_list(args: argparse.Namespace, settings: Settings) -> int:
    from shared import contract

    version, fields = _with_pool(settings, contract.active)
    if args.json:
        print(json.dumps({"version": version, "fields": [f.model_dump(mode="json") for f in fields],
                          "schema": contract.schema_for(fields)}, indent=2))
        return 0
    print(f"contract version {version}")
    for f in fields:
        print(f"  {f.field_key:<16} {'required' if f.required else 'optional':<9} {json.dumps(f.shape)}")
        print(f"  {'':<16} {f.semantics}  (read by {', '.join(f.read_by)})")
    return 0


def _cmd_contract_add(args: argparse.Namespace, settings: Settings) -> int:
    from shared import contract

    try:
        shape = json.loads(args.shape)
    except ValueError as exc:
        raise contract.ContractError(f"--shape is not JSON: {exc}") from None
    if not isinstance(shape, dict):
        raise contract.ContractError("--shape must be a JSON object (a JSON Schema)")
    read_by = [r.strip() for r in args.read_by.split(",") if r.strip()]

    async def add(pool: AsyncConnectionPool) -> int:
        return await contract.add_field(pool, args.field, shape=shape, semantics=args.semantics,
                                        required=args.required, read_by=read_by, supersede=args.supersede)

    print(f"added contract row {_with_pool(settings, add)} for {args.field}")
    return 0


def _cmd_project_create(args: argparse.Namespace, settings: Settings) -> int:
    from executor.projects import service as projects

    workdir: Path | None = None
    if args.workdir is not None:
        # the API's check and message (executor/projects/service.py): under PETAL_PROJECT_ROOTS once `..` and
        # symlinks are resolved, and a directory; a relative path is taken from here, as a shell would
        given = args.workdir if args.workdir.is_absolute() else Path.cwd() / args.workdir
        roots = projects.ProjectsConfig(settings.project_root_paths).resolved_roots()
        try:
            workdir = projects.check_workdir(str(given), roots)
        except projects.Refused as exc:
            raise errors.ConfigError(str(exc)) from None
    plan = plan_path = None
    if args.plan is not None:
        if not args.plan.is_file():
            raise errors.ConfigError(f"--plan {args.plan} is not a file")
        plan = args.plan.read_text(encoding="utf-8")
        where = args.plan.resolve()
        # as the API stores it: relative to the workdir when the plan is in it, else where it was read from
        plan_path = str(where.relative_to(workdir)) if workdir and workdir in where.parents else str(where)

    async def create(pool: AsyncConnectionPool) -> dict[str, object]:
        from shared.read_surface import plan_tasks

        project_id = await projects.insert_project(
            pool, args.slug, workdir=str(workdir) if workdir else None, plan=plan, plan_path=plan_path)
        if project_id is None:
            raise errors.ConfigError(f"a project {args.slug!r} exists already")
        return {"project_id": str(project_id), "slug": args.slug, "workdir": str(workdir) if workdir else None,
                "plan_path": plan_path, "plan_tasks": len(plan_tasks(plan))}

    print(json.dumps(_with_pool(settings, create)))
    return 0


def _cmd_reextract(args: argparse.Namespace, settings: Settings) -> int:
    import uuid

    from executor.settle import extraction

    try:
        task_id = uuid.UUID(args.task_id)
    except ValueError:
        raise errors.ConfigError(f"{args.task_id!r} is not a task id") from None

    async def again(pool: AsyncConnectionPool) -> uuid.UUID:
        return await extraction.request(pool, task_id, requested_by="reextract")

    print(json.dumps({"extractor_task_id": str(_with_pool(settings, again)),
                      "note": "the executor runs it; a new handoff record follows, the old one stays"}))
    return 0


def _cmd_journal(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio
    import uuid

    from shared import journal
    from shared.database import Database
    from petal_dispatch.journal_view import line

    def as_uuid(value: str | None, name: str) -> uuid.UUID | None:
        try:
            return uuid.UUID(value) if value else None
        except ValueError:
            raise errors.ConfigError(f"--{name} takes an id (a UUID)") from None

    task_id, thread_id = as_uuid(args.task, "task"), as_uuid(args.thread, "thread")
    limit = 500
    info = dbserver.resolve(settings, start=False)  # read-only: never starts a server

    async def run() -> None:
        async with Database(info.ingress_dsn, name="petal-journal", max_size=2) as db:
            listener = db.listener(["journal"]) if args.follow else None
            sub = listener.subscribe() if listener else None
            listening = asyncio.create_task(listener.run()) if listener else None
            after = 0
            try:
                while True:
                    events = await journal.read_lines(db.pool, after=after, task_id=task_id, thread_id=thread_id,
                                                      limit=limit)
                    for e in events:
                        print(line(e), flush=True)
                        after = e.seq
                    if len(events) == limit:
                        continue
                    if sub is None:
                        return
                    await sub.get()
            finally:
                if listening:
                    listening.cancel()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


def _cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from ingress import reads
    from shared.database import Database
    from petal_dispatch.journal_view import inert

    info = dbserver.resolve(settings, start=False)  # read-only: never starts a server

    async def gather() -> dict[str, list[dict[str, Any]]]:
        async with Database(info.ingress_dsn, name="petal-status", max_size=1) as db:
            return await reads.status(db.pool)

    state = asyncio.run(gather())
    if args.json:
        print(json.dumps(state, default=str, indent=2))
        return 0
    print(f"tasks ({len(state['tasks'])} open)")
    for t in state["tasks"]:
        activity = (t["activity"] or t["status"]).upper() if t["activity"] in ("stalled", "awaiting_user") else (
            t["activity"] or t["status"])
        last = t["last_output_at"].strftime("%H:%M:%S") if t["last_output_at"] else "-"
        brief = " ".join(str(t["brief"]).split())[:70]
        print(inert(f"  {str(t['id'])[:8]} {t['role']:<12} {activity:<14} last output {last}  {brief}"))
    print(f"queued messages ({len(state['queue'])})")
    for q in state["queue"]:
        print(inert(f"  {str(q['id'])[:8]} thread {str(q['thread_id'])[:8]} {q['origin']:<8} {q['text']}"))
    print(f"pending asks ({len(state['asks'])})")
    for a in state["asks"]:
        questions = " / ".join(str(x.get("question", "")) for x in a["questions"])
        print(inert(f"  {a['tool_use_id']} task {str(a['task_id'])[:8]}  {questions}"))
    print(f"executors ({len(state['executors'])})")
    for x in state["executors"]:
        labels = ",".join(x["labels"]) or "-"
        print(inert(f"  {x['name']:<20} {x['state']:<8} load {x['load']}/{x['capacity']}  lease age "
                    f"{x['lease_age_s']}s  labels {labels}  version {x['version']}"))
    print("last events")
    for e in state["last_events"]:
        print(f"  {e['seq']:>7} {e['created_at']:%H:%M:%S} {e['event_type']}")
    return 0


def _data_dir_option(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`--data-dir`, as `up` takes it: the same directory finds the server `up --data-dir` started."""
    p.add_argument("--data-dir", type=Path,
                   help="data directory (default: PETAL_DATA_DIR, else ./var); the one given to `up --data-dir`")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="petal-dispatch", description="Drive Claude Code from a phone or browser.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("up", help="start everything: database, migrations, executor, ingress")
    p.add_argument("--host", help="ingress bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="ingress port (default 8000)")
    p.add_argument("--mcp-port", type=int, help="harness MCP port (default 8002)")
    p.add_argument("--data-dir", type=Path, help="data directory (default ./var)")
    p.add_argument("--demo", action="store_true",
                   help="run the real CLI against a scripted model: see the whole loop with no Anthropic account")
    p.add_argument("--scenario", type=Path,
                   help="with --demo: a scenario JSON file for the scripted model instead of the built-in demo "
                        "(no first message is sent; you write it)")
    p.set_defaults(handler=services.up)

    p = sub.add_parser("journal", help="the journal as readable lines")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    p.add_argument("--task", help="only this task's events")
    p.add_argument("--thread", help="only this thread's events (its turns and the workers they dispatched)")
    _data_dir_option(p)
    p.set_defaults(handler=_cmd_journal)

    p = sub.add_parser("status", help="open tasks (running / awaiting user / stalled), queued messages, pending asks")
    p.add_argument("--json", action="store_true")
    _data_dir_option(p)
    p.set_defaults(handler=_cmd_status)

    p = sub.add_parser("migrate", help="apply pending database migrations")
    _data_dir_option(p)
    p.set_defaults(handler=_cmd_migrate)

    p = sub.add_parser("executor", help="run the executor: supervisor, journal writer, harness MCP")
    p.add_argument("--name", help="this executor's name in the fleet (default: PETAL_EXECUTOR_NAME, else host name)")
    p.set_defaults(handler=services.executor)

    p = sub.add_parser("ingress", help="run the ingress: REST actions, reads, SSE, the web client")
    p.set_defaults(handler=services.ingress)

    p = sub.add_parser("install-claude", help="install the pinned Claude Code CLI into a local cache (needs npm)")
    p.add_argument("--version", help="another version or npm tag (default: PETAL_CLAUDE_VERSION, else the pinned)")
    p.set_defaults(handler=_cmd_install_claude)

    p = sub.add_parser("import-transcript", help="journal a recorded stream-json file as one finished task")
    p.add_argument("file", type=Path)
    p.add_argument("--project", help="project id to file it under")
    p.add_argument("--role", default="worker", help="the role to record (default: worker)")
    _data_dir_option(p)
    p.set_defaults(handler=_cmd_import_transcript)

    contract_cmd = sub.add_parser("contract", help="the handoff contract").add_subparsers(dest="contract_command",
                                                                                         required=True)
    p = contract_cmd.add_parser("list", help="the active contract fields and the schema they make")
    p.add_argument("--json", action="store_true")
    _data_dir_option(p)
    p.set_defaults(handler=_cmd_contract_list)
    p = contract_cmd.add_parser("add", help="add a field (an INSERT; rows are never edited)")
    p.add_argument("field")
    p.add_argument("--required", action="store_true")
    p.add_argument("--shape", required=True, help='a JSON Schema for the value, e.g. \'{"type": "string"}\'')
    p.add_argument("--semantics", required=True, help="what the field means")
    p.add_argument("--read-by", default="harness,human", help="who reads it (comma-separated)")
    p.add_argument("--supersede", action="store_true", help="replace the active row of an existing field")
    _data_dir_option(p)
    p.set_defaults(handler=_cmd_contract_add)

    project_cmd = sub.add_parser("project", help="projects").add_subparsers(dest="project_command", required=True)
    p = project_cmd.add_parser("create", help="load a project (its plan: markdown with `- [ ] T-001 title` lines)")
    p.add_argument("--slug", required=True)
    p.add_argument("--plan", type=Path, help="the plan file (stored with its path: relative to --workdir when in it)")
    p.add_argument("--workdir", type=Path,
                   help="the project's directory: under PETAL_PROJECT_ROOTS (default: your home), as the API checks")
    _data_dir_option(p)
    p.set_defaults(handler=_cmd_project_create)

    p = sub.add_parser("reextract", help="run extraction again for a task (a new handoff; the old one stays)")
    p.add_argument("task_id")
    _data_dir_option(p)
    p.set_defaults(handler=_cmd_reextract)

    db = sub.add_parser("db", help="database commands").add_subparsers(dest="db_command", required=True)
    p = db.add_parser("status", help="where the server is, each role's DSN, whether migrations are current")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _data_dir_option(p)
    p.set_defaults(handler=_cmd_db_status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    lifeline.keep_private()  # before the settings (secrets among them) are read into memory
    if args.command in PRIVATE_COMMANDS:
        os.umask(0o077)
    try:
        settings = config.load()
    except errors.ConfigError as exc:
        print(f"petal-dispatch: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "data_dir", None) is not None:  # `--data-dir` wins over PETAL_DATA_DIR, as for `up`
        settings = settings.model_copy(update={"data_dir": args.data_dir})
    logs.configure(settings.log_level, settings.log_format)
    handler: Handler = args.handler
    try:
        return handler(args, settings)
    except (errors.DatabaseUnavailable, psycopg.OperationalError) as exc:  # a named query's, or a raw connection's
        print(f"petal-dispatch: cannot reach the database: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except errors.PetalError as exc:
        print(f"petal-dispatch: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before a command set up its own stop: stopping is what was asked
        return 130


if __name__ == "__main__":
    sys.exit(main())
