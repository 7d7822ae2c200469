"""`petal-dispatch routine list|add|fire|history|enable|disable|delete`: routines from the command line, written
as the API writes them (the ingress's queries and checks, on the ingress role): `add` prints the fire token and
webhook secret once, `fire` queues a run now (the executor starts it), `history` lists a routine's runs. A routine
is named by its id or a unique prefix of it; `list` and `history` print tables (`--json`: as the API answers)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import uuid
from datetime import UTC, datetime
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo

from psycopg.types.json import Jsonb
from pydantic import ValidationError

from ingress import routines as api
from ingress.http import dumps
from ingress.models import RoutineIn
from ingress.problems import Problem
from ingress.sql import queries as ingress_sql
from petal_dispatch import dbserver
from petal_dispatch.commands import ids
from petal_dispatch.config import Settings
from petal_dispatch.journal_view import inert
from shared import errors
from shared import routines as rules
from shared.database import Database
from shared.query import Queries
from shared.sql import queries as shared_sql


Handler = Callable[[argparse.Namespace, Settings], int]


def _run(settings: Settings, work: Any) -> Any:
    info = dbserver.resolve(settings)

    async def go() -> Any:
        async with Database(info.ingress_dsn, name="petal-cli", max_size=2) as db:
            return await work(Queries(db.pool, ingress_sql), Queries(db.pool, shared_sql))

    return asyncio.run(go())


def _print(value: Any) -> None:
    print(json.dumps(json.loads(dumps(value)), indent=2))


async def _routine(shared: Queries, text: str) -> uuid.UUID:
    """The routine a whole id or a unique prefix (as `routine list` prints it) names."""
    return await ids.resolve(shared, "routine", text)


def _when(value: Any, tz: str | None = None) -> str:
    """A time as the tables print it: in the routine's own zone when it has one (its schedule is read there)."""
    if not value:
        return "-"
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if tz:
        with contextlib.suppress(ValueError, KeyError):
            value = value.astimezone(ZoneInfo(tz))
    return f"{value:%Y-%m-%d %H:%M %Z}".strip()


def routine_list(args: argparse.Namespace, settings: Settings) -> int:
    async def work(q: Queries, shared: Queries) -> list[dict[str, Any]]:
        now = datetime.now(UTC)
        return [api.shown(r, now) for r in await q.all("list_routines", {"id": None})]

    routines = _run(settings, work)
    if args.json:
        _print({"routines": routines})
        return 0
    print(f"routines ({len(routines)})")
    for r in routines:
        state = "enabled" if r["enabled"] else "disabled"
        schedule = f"{r['cron']} {r['tz']}" if r["cron"] else ("webhook" if r["webhook"] else "on demand")
        last = r["last_run"] or {}
        last_run = f"{last.get('status', '-')} {_when(last.get('created_at'), r['tz'])}" if last else "never run"
        print(inert(f"  {str(r['id'])[:8]} {r['name'][:24]:<24} {r['mode']:<11} {state:<8} {schedule[:28]:<28} "
                    f"next {_when(r['next_fire_at'], r['tz'])}  last {last_run}"))
    return 0


def routine_add(args: argparse.Namespace, settings: Settings) -> int:
    spec: dict[str, Any] = {"name": args.name, "prompt": args.prompt, "mode": args.mode, "webhook": args.webhook}
    if args.project:  # a whole id or a unique prefix
        spec["project_id"] = str(_run(settings, lambda q, shared: ids.resolve(shared, "project", args.project)))
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
    event = json.loads(args.event) if args.event else {}
    if not isinstance(event, dict):
        raise errors.ConfigError("--event must be a JSON object")

    async def work(q: Queries, shared: Queries) -> dict[str, Any] | None:
        routine_id = await _routine(shared, args.routine_id)
        if await q.one("get_routine_secret", {"id": routine_id}) is None:
            raise errors.ConfigError(f"no routine {args.routine_id}")
        return await q.one("enqueue_routine_trigger", {
            "routine_id": routine_id, "trigger": "run", "event": Jsonb(event), "delivery_id": None,
            "requested_by": f"cli:{getpass.getuser()}"})

    _print(_run(settings, work))
    return 0


def routine_history(args: argparse.Namespace, settings: Settings) -> int:
    async def work(q: Queries, shared: Queries) -> list[dict[str, Any]]:
        routine_id = await _routine(shared, args.routine_id)
        if not await q.all("list_routines", {"id": routine_id}):
            raise errors.ConfigError(f"no routine {args.routine_id}")
        return await q.all("list_routine_runs", {"id": routine_id, "limit": args.limit})

    runs = _run(settings, work)
    if args.json:
        _print({"runs": runs})
        return 0
    print(f"runs ({len(runs)}, newest first)")
    for r in runs:
        took = f"{r['duration_s']:.0f} s" if r["duration_s"] is not None else "-"
        cost = f"${r['cost_usd']:.4f}" if r["cost_usd"] is not None else "-"
        thread = str(r["thread_id"])[:8] if r["thread_id"] else "-"
        reason = f"  {' '.join(str(r['reason']).split())[:60]}" if r["reason"] else ""
        print(inert(f"  {str(r['id'])[:8]} {r['trigger']:<8} {r['status']:<10} {_when(r['created_at'])}  "
                    f"took {took:<6} cost {cost:<9} thread {thread}{reason}"))
    return 0


def _set_enabled(enabled: bool) -> Handler:
    """`routine enable|disable`: what PATCH /api/routines/{id} does with `enabled` (ingress/routines.py): a
    disabled routine has no next fire; one enabled again is scheduled from now (instants before are not owed)."""
    def handler(args: argparse.Namespace, settings: Settings) -> int:
        async def work(q: Queries, shared: Queries) -> dict[str, Any]:
            now = datetime.now(UTC)
            routine_id = await _routine(shared, args.routine_id)
            async with q.transaction() as tx:
                old = await tx.one("get_routine_for_edit", {"id": routine_id})
                if old is None:
                    raise errors.ConfigError(f"no routine {args.routine_id}")
                reschedule = enabled and not old["enabled"]
                next_fire = old["next_fire_at"] if enabled else None
                if reschedule:
                    next_fire = rules.next_fire(old["cron"], old["tz"], now)
                await tx.execute("update_routine", {**old, "enabled": enabled, "next_fire_at": next_fire,
                                                    "id": routine_id, "reschedule": reschedule, "now": now})
                row = await tx.one("list_routines", {"id": routine_id})
            assert row is not None
            return api.shown(row, now)

        row = _run(settings, work)
        if args.json:
            _print(row)
        else:
            print(inert(f"routine {str(row['id'])[:8]} {row['name']} {'enabled' if enabled else 'disabled'}"
                        + (f", next fire {_when(row['next_fire_at'], row['tz'])}" if enabled and row["next_fire_at"] else "")))
        return 0
    return handler


def routine_delete(args: argparse.Namespace, settings: Settings) -> int:
    """What DELETE /api/routines/{id} does: the routine is marked deleted (its runs and their threads stay)."""
    async def work(q: Queries, shared: Queries) -> uuid.UUID:
        routine_id = await _routine(shared, args.routine_id)
        if await q.one("delete_routine", {"id": routine_id}) is None:
            raise errors.ConfigError(f"no routine {args.routine_id}")
        return routine_id

    routine_id = _run(settings, work)
    if args.json:
        _print({"id": routine_id, "deleted": True})
    else:
        print(f"routine {routine_id} deleted (its runs and their threads stay)")
    return 0


def routine_enable(args: argparse.Namespace, settings: Settings) -> int:
    return _set_enabled(True)(args, settings)


def routine_disable(args: argparse.Namespace, settings: Settings) -> int:
    return _set_enabled(False)(args, settings)
