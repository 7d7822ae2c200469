"""`petal-dispatch routine list|add|fire|history`: routines from the command line, written as the API writes
them (the ingress's queries and checks, on the ingress role): `add` prints the fire token and webhook secret
once, `fire` queues a run now (the executor starts it), `history` lists a routine's runs."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb
from pydantic import ValidationError

from ingress import routines as api
from ingress.http import dumps
from ingress.models import RoutineIn
from ingress.problems import Problem
from ingress.sql import queries as ingress_sql
from petal_dispatch import dbserver
from petal_dispatch.config import Settings
from shared import errors
from shared.database import Database
from shared.query import Queries
from shared.sql import queries as shared_sql


def _run(settings: Settings, work: Any) -> Any:
    info = dbserver.resolve(settings)

    async def go() -> Any:
        async with Database(info.ingress_dsn, name="petal-cli", max_size=2) as db:
            return await work(Queries(db.pool, ingress_sql), Queries(db.pool, shared_sql))

    return asyncio.run(go())


def _print(value: Any) -> None:
    print(json.dumps(json.loads(dumps(value)), indent=2))


def _routine_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise errors.ConfigError(f"{text!r} is not a routine id") from None


def routine_list(args: argparse.Namespace, settings: Settings) -> int:
    async def work(q: Queries, shared: Queries) -> list[dict[str, Any]]:
        now = datetime.now(UTC)
        return [api.shown(r, now) for r in await q.all("list_routines", {"id": None})]

    _print({"routines": _run(settings, work)})
    return 0


def routine_add(args: argparse.Namespace, settings: Settings) -> int:
    spec: dict[str, Any] = {"name": args.name, "prompt": args.prompt, "mode": args.mode, "webhook": args.webhook}
    if args.project:
        spec["project_id"] = args.project
    if args.cron:
        spec["schedule"] = {"cron": args.cron, "tz": args.tz, "missed": args.missed, "overlap": args.overlap}
    budget = {k: v for k, v in (("usd_per_run", args.usd_per_run), ("runtime_s", args.runtime_s),
                                ("usd_per_day", args.usd_per_day), ("max_workers", args.max_workers))
              if v is not None}
    if budget:
        spec["budget"] = budget
    try:
        model = RoutineIn.model_validate(spec)
    except ValidationError as exc:
        raise errors.ConfigError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                                 ) from None

    async def work(q: Queries, shared: Queries) -> dict[str, Any]:
        now = datetime.now(UTC)
        try:
            params, token, secret = api.new_routine(model, f"cli:{getpass.getuser()}", now)
        except Problem as exc:
            raise errors.ConfigError(exc.detail) from None
        if model.project_id is not None and await shared.one("check_project_exists", {"id": model.project_id}) is None:
            raise errors.ConfigError(f"no project {model.project_id}")
        row = await q.one("insert_routine", params)
        assert row is not None
        return api.shown_once(row, now, token, secret)

    _print(_run(settings, work))
    return 0


def routine_fire(args: argparse.Namespace, settings: Settings) -> int:
    routine_id = _routine_id(args.routine_id)
    event = json.loads(args.event) if args.event else {}
    if not isinstance(event, dict):
        raise errors.ConfigError("--event must be a JSON object")

    async def work(q: Queries, shared: Queries) -> dict[str, Any] | None:
        if await q.one("get_routine_secret", {"id": routine_id}) is None:
            raise errors.ConfigError(f"no routine {routine_id}")
        return await q.one("enqueue_routine_trigger", {
            "routine_id": routine_id, "trigger": "run", "event": Jsonb(event), "delivery_id": None,
            "requested_by": f"cli:{getpass.getuser()}"})

    _print(_run(settings, work))
    return 0


def routine_history(args: argparse.Namespace, settings: Settings) -> int:
    routine_id = _routine_id(args.routine_id)

    async def work(q: Queries, shared: Queries) -> list[dict[str, Any]]:
        if not await q.all("list_routines", {"id": routine_id}):
            raise errors.ConfigError(f"no routine {routine_id}")
        return await q.all("list_routine_runs", {"id": routine_id, "limit": args.limit})

    _print({"runs": _run(settings, work)})
    return 0


def add_parser(sub: Any, data_dir_option: Any) -> None:
    """The `routine` command group, on the CLI's subparsers."""
    group = sub.add_parser("routine", help="routines: work that starts on a schedule, a webhook or a call").add_subparsers(
        dest="routine_command", required=True)
    p = group.add_parser("list", help="routines with their next fire times and last run")
    data_dir_option(p)
    p.set_defaults(handler=routine_list)
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
    p.set_defaults(handler=routine_add)
    p = group.add_parser("fire", help="run a routine now")
    p.add_argument("routine_id")
    p.add_argument("--event", help="a JSON object the template sees as `event`")
    data_dir_option(p)
    p.set_defaults(handler=routine_fire)
    p = group.add_parser("history", help="a routine's runs, newest first")
    p.add_argument("routine_id")
    p.add_argument("--limit", type=int, default=20)
    data_dir_option(p)
    p.set_defaults(handler=routine_history)
