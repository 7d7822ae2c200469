"""The `petal-dispatch` command: its arguments, and which command runs (`petal_dispatch/commands/`).

The settings are read here, once, and passed to the command.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import psycopg

from petal_dispatch import __version__, config
from petal_dispatch.commands import Command, Handler, routine_args, terminal
from shared import errors, lifeline, logs

# Commands that write the data directory (the database, run files, keys, worktrees): what they create is
# this user's alone (directories 0700, files 0600), whatever umask they were started with.
PRIVATE_COMMANDS = frozenset({"up", "executor", "ingress", "migrate"})


def _data_dir_option(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`--data-dir`, as `up` takes it: the same directory finds the server `up --data-dir` started."""
    p.add_argument("--data-dir", type=Path,
                   help="data directory (default: PETAL_DATA_DIR, else ./var); the one given to `up --data-dir`")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="petal-dispatch", description="Drive Claude Code from a phone or browser.")
    parser.add_argument("--version", action="version", version=f"petal-dispatch {__version__}")
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
    p.set_defaults(handler=Command("services", "up"))

    p = sub.add_parser("journal", help="the journal as readable lines")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    p.add_argument("--task", help="only this task's events")
    p.add_argument("--thread", help="only this thread's events (its turns and the workers they dispatched)")
    _data_dir_option(p)
    p.set_defaults(handler=Command("views", "journal"))

    p = sub.add_parser("status", help="open tasks (running / awaiting user / stalled), queued messages, pending asks")
    p.add_argument("--json", action="store_true")
    _data_dir_option(p)
    p.set_defaults(handler=Command("views", "status"))

    p = sub.add_parser("migrate", help="apply pending database migrations")
    _data_dir_option(p)
    p.set_defaults(handler=Command("db", "migrate"))

    p = sub.add_parser("executor", help="run the executor: supervisor, journal writer, harness MCP")
    p.add_argument("--name", help="this executor's name in the fleet (default: PETAL_EXECUTOR_NAME, else host name)")
    p.set_defaults(handler=Command("services", "executor"))

    p = sub.add_parser("ingress", help="run the ingress: REST actions, reads, SSE, the web client")
    p.set_defaults(handler=Command("services", "ingress"))

    p = sub.add_parser("doctor", help="check the set-up: one line per check with ✓/✗ and the fix (exit 1 on any ✗)")
    p.add_argument("--port", type=int, help="the ingress port `up` will be given (default PETAL_INGRESS_PORT, else 8000)")
    p.add_argument("--mcp-port", type=int, help="the harness MCP port (default PETAL_MCP_PORT, else 8002)")
    _data_dir_option(p)
    p.set_defaults(handler=Command("services", "doctor_command"))

    p = sub.add_parser("install-claude", help="install the pinned Claude Code CLI into a local cache (needs npm)")
    p.add_argument("--version", help="another version or npm tag (default: PETAL_CLAUDE_VERSION, else the pinned)")
    p.set_defaults(handler=Command("claude", "install"))

    p = sub.add_parser("import-transcript", help="journal a recorded stream-json file as one finished task")
    p.add_argument("file", type=Path)
    p.add_argument("--project", help="project id to file it under")
    p.add_argument("--role", default="worker", help="the role to record (default: worker)")
    _data_dir_option(p)
    p.set_defaults(handler=Command("transcript", "import_transcript"))

    contract_cmd = sub.add_parser("contract", help="the handoff contract").add_subparsers(dest="contract_command",
                                                                                         required=True)
    p = contract_cmd.add_parser("list", help="the active contract fields and the schema they make")
    p.add_argument("--json", action="store_true")
    _data_dir_option(p)
    p.set_defaults(handler=Command("handoffs", "contract_list"))
    p = contract_cmd.add_parser("add", help="add a field (an INSERT; rows are never edited)")
    p.add_argument("field")
    p.add_argument("--required", action="store_true")
    p.add_argument("--shape", required=True, help='a JSON Schema for the value, e.g. \'{"type": "string"}\'')
    p.add_argument("--semantics", required=True, help="what the field means")
    p.add_argument("--read-by", default="harness,human", help="who reads it (comma-separated)")
    p.add_argument("--supersede", action="store_true", help="replace the active row of an existing field")
    _data_dir_option(p)
    p.set_defaults(handler=Command("handoffs", "contract_add"))

    project_cmd = sub.add_parser("project", help="projects").add_subparsers(dest="project_command", required=True)
    p = project_cmd.add_parser("create", help="load a project (its plan: markdown with `- [ ] T-001 title` lines)")
    p.add_argument("--slug", required=True)
    p.add_argument("--plan", type=Path, help="the plan file (stored with its path: relative to --workdir when in it)")
    p.add_argument("--workdir", type=Path,
                   help="the project's directory: under PETAL_PROJECT_ROOTS (default: your home), as the API checks")
    _data_dir_option(p)
    p.set_defaults(handler=Command("project", "create"))

    p = sub.add_parser("reextract", help="run extraction again for a task (a new handoff; the old one stays)")
    p.add_argument("task_id")
    _data_dir_option(p)
    p.set_defaults(handler=Command("handoffs", "reextract"))

    attachments_cmd = sub.add_parser("attachments", help="files sent with chat messages").add_subparsers(
        dest="attachments_command", required=True)
    p = attachments_cmd.add_parser("purge", help="delete the files of archived threads (and uploads never sent) "
                                                 "older than --older-than; the journal keeps names and hashes")
    p.add_argument("--older-than", default="30d", help="an age: 30d, 12h, 45m (default 30d)")
    _data_dir_option(p)
    p.set_defaults(handler=Command("retention", "purge"))

    routine_args.add_parser(sub, _data_dir_option)
    terminal.add_parsers(sub, _data_dir_option)

    db_cmd = sub.add_parser("db", help="database commands").add_subparsers(dest="db_command", required=True)
    p = db_cmd.add_parser("status", help="where the server is, each role's DSN, whether migrations are current")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _data_dir_option(p)
    p.set_defaults(handler=Command("db", "status"))
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
        settings = config.absolute(settings.model_copy(update={"data_dir": args.data_dir}))
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
