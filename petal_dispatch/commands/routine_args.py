"""The `routine` command group's arguments; the commands are petal_dispatch/commands/routines.py, imported when
one runs (they import the ingress's routines)."""

from __future__ import annotations

from typing import Any

from petal_dispatch.commands import Command


def add_parser(sub: Any, data_dir_option: Any) -> None:
    """The `routine` command group, on the CLI's subparsers."""
    group = sub.add_parser("routine", help="routines: work that starts on a schedule, a webhook or a call").add_subparsers(
        dest="routine_command", required=True)
    p = group.add_parser("list", help="routines with their next fire times and last run")
    p.add_argument("--json", action="store_true", help="machine-readable output (as GET /api/routines)")
    data_dir_option(p)
    p.set_defaults(handler=Command("routines", "routine_list"))
    p = group.add_parser("add", help="create a routine (prints its fire token and webhook secret, once)")
    p.add_argument("--name", required=True)
    p.add_argument("--prompt", required=True, help="a template: {{ event.<field> }} from the trigger's payload")
    p.add_argument("--project", help="the project's id")
    p.add_argument("--mode", choices=["autonomous", "interactive"], default="autonomous")
    p.add_argument("--cron", help="a schedule: five cron fields, read in --tz")
    p.add_argument("--tz", default="UTC", help="an IANA time zone (default UTC)")
    p.add_argument("--missed", choices=["skip", "run_once"], default="skip")
    p.add_argument("--overlap", choices=["skip", "queue", "parallel"], default="skip")
    p.add_argument("--webhook", action="store_true", help="issue a webhook secret (POST /api/hooks/<id>)")
    p.add_argument("--usd-per-run", type=float)
    p.add_argument("--runtime-s", type=int)
    p.add_argument("--usd-per-day", type=float)
    p.add_argument("--max-workers", type=int)
    data_dir_option(p)
    p.set_defaults(handler=Command("routines", "routine_add"))
    p = group.add_parser("fire", help="run a routine now")
    p.add_argument("routine_id", help="its id, or a unique prefix as `routine list` prints it")
    p.add_argument("--event", help="a JSON object the template sees as `event`")
    data_dir_option(p)
    p.set_defaults(handler=Command("routines", "routine_fire"))
    p = group.add_parser("history", help="a routine's runs, newest first")
    p.add_argument("routine_id", help="its id, or a unique prefix as `routine list` prints it")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true", help="machine-readable output (as GET /api/routines/{id}/runs)")
    data_dir_option(p)
    p.set_defaults(handler=Command("routines", "routine_history"))
    for name, what in (("enable", "enable a routine (scheduled again from now)"),
                       ("disable", "disable a routine (no schedule, no webhook fires; run now still works)"),
                       ("delete", "delete a routine (its runs and their threads stay)")):
        p = group.add_parser(name, help=what)
        p.add_argument("routine_id", help="its id, or a unique prefix as `routine list` prints it")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        data_dir_option(p)
        p.set_defaults(handler=Command("routines", f"routine_{name}"))
