"""Routines over HTTP: their definitions (the user's), and their triggers — run now (the user), fire (the
routine's own token), a webhook (Standard Webhooks or GitHub-style HMAC: ingress/webhooks.py). A trigger is only verified and queued here
(routine_queue); the executor makes and starts the run."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb
from starlette.requests import Request
from starlette.responses import Response

from ingress import webhooks
from ingress.auth import BodyTooLarge
from ingress.http import body, ingress_queries, json_depth_exceeds, path_uuid, respond, shared_queries, who
from ingress.models import RoutineIn, RoutinePatch, RunIn
from ingress.problems import Problem
from shared import routines as rules

# next fire times GET /api/routines shows per scheduled routine
NEXT_FIRES = 3
# most runs GET /api/routines/{id}/runs returns
RUNS_LIMIT = 200
# how long a GitHub-style delivery's body is remembered: the same body again within it is a replay (GitHub signs
# no date, so past it a captured delivery would pass again; its own redeliveries go back 3 days)
HOOK_BODY_RETENTION = timedelta(days=30)


def _now() -> datetime:
    return datetime.now(UTC)


def _token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _check(prompt: str | None, cron: str | None, tz: str | None) -> None:
    """Raises Problem(422) naming the wrong field (`field`: prompt, tz or cron), so a form can point at it."""
    checks: list[tuple[str, Callable[[], None]]] = []
    if prompt is not None:
        checks.append(("prompt", lambda: rules.check_template(prompt)))
    if cron is not None and tz is not None:
        checks.append(("tz", lambda: rules.check_schedule("0 0 * * *", tz)))  # the zone alone, first
        checks.append(("cron", lambda: rules.check_schedule(cron, tz)))
    for field, check in checks:
        try:
            check()
        except (rules.TemplateError, rules.ScheduleError) as exc:
            raise Problem(422, str(exc), field=field) from None


def shown(row: dict[str, Any], now: datetime) -> dict[str, Any]:
    out = dict(row)
    out["next_fire_times"] = ([t.isoformat() for t in rules.Schedule(row["cron"], row["tz"]).fire_times(now, NEXT_FIRES)]
                              if row["cron"] and row["enabled"] else [])
    out["hook_url"] = f"/api/hooks/{row['id']}" if row.get("webhook") else None
    out["fire_url"] = f"/api/routines/{row['id']}/fire"
    return out


def new_routine(spec: RoutineIn, created_by: str, now: datetime) -> tuple[dict[str, Any], str, str | None]:
    """The row `insert_routine` writes for `spec`, its fire token and its webhook secret (each shown once: the
    store keeps the token only as its hash). Raises Problem(422) for a bad template, cron expression or zone."""
    schedule, budget = spec.schedule, spec.budget
    _check(spec.prompt, schedule.cron if schedule else None, schedule.tz if schedule else None)
    fire_token = secrets.token_urlsafe(32)
    webhook_secret = webhooks.new_secret() if spec.webhook else None
    return {
        "id": uuid.uuid4(), "name": spec.name, "project_id": spec.project_id, "mode": spec.mode,
        "prompt": spec.prompt, "enabled": spec.enabled, "cron": schedule.cron if schedule else None,
        "tz": schedule.tz if schedule else None, "missed": schedule.missed if schedule else "skip",
        "overlap": schedule.overlap if schedule else "skip", "now": now,
        "next_fire_at": rules.next_fire(schedule.cron, schedule.tz, now) if schedule and spec.enabled else None,
        "webhook_secret": webhook_secret, "fire_token_sha256": _token_hash(fire_token),
        "usd_per_run": budget.usd_per_run if budget else None, "runtime_s": budget.runtime_s if budget else None,
        "usd_per_day": budget.usd_per_day if budget else None,
        "max_workers": budget.max_workers if budget else None, "created_by": created_by,
    }, fire_token, webhook_secret


def shown_once(row: dict[str, Any], now: datetime, fire_token: str, webhook_secret: str | None) -> dict[str, Any]:
    """A created routine as its creator sees it, once: with its fire token and webhook secret."""
    return {**shown(row, now), "fire_token": fire_token, "webhook_secret": webhook_secret,
            "note": "the fire token and the webhook secret are shown only now"}


async def create_routine(request: Request) -> Response:
    spec = await body(request, RoutineIn)
    now = _now()
    params, fire_token, webhook_secret = new_routine(spec, who(request), now)
    if spec.project_id is not None and await shared_queries(request).one(
            "check_project_exists", {"id": spec.project_id}) is None:
        raise Problem(404, f"no project {spec.project_id}")
    row = await ingress_queries(request).one("insert_routine", params)
    assert row is not None
    return respond(shown_once(row, now, fire_token, webhook_secret), 202)


async def list_routines(request: Request) -> Response:
    now = _now()
    rows = await ingress_queries(request).all("list_routines", {"id": None})
    return respond({"routines": [shown(r, now) for r in rows]})


async def patch_routine(request: Request) -> Response:
    routine_id = path_uuid(request, "routine_id")
    patch = await body(request, RoutinePatch)
    _check(patch.prompt, patch.schedule.cron if patch.schedule else None, patch.schedule.tz if patch.schedule else None)
    now = _now()
    async with ingress_queries(request).transaction() as tx:
        old = await tx.one("get_routine_for_edit", {"id": routine_id})
        if old is None:
            raise Problem(404, f"no routine {routine_id}")
        new = {**old, **patch.model_dump(exclude_none=True, exclude={"schedule", "budget", "unschedule"})}
        if patch.schedule is not None:
            new.update(patch.schedule.model_dump())
        if patch.unschedule:
            new.update(cron=None, tz=None)
        if patch.budget is not None:
            new.update(patch.budget.model_dump())
        reschedule = (new["cron"], new["tz"]) != (old["cron"], old["tz"]) or (new["enabled"] and not old["enabled"])
        if not new["enabled"]:
            new["next_fire_at"] = None
        elif reschedule:
            new["next_fire_at"] = rules.next_fire(new["cron"], new["tz"], now)
        # else: the schedule stands, and so does the executors' next instant
        await tx.execute("update_routine", {**new, "id": routine_id, "reschedule": reschedule, "now": now})
        row = await tx.one("list_routines", {"id": routine_id})
    assert row is not None
    return respond(shown(row, now), 200)


async def delete_routine(request: Request) -> Response:
    routine_id = path_uuid(request, "routine_id")
    if await ingress_queries(request).one("delete_routine", {"id": routine_id}) is None:
        raise Problem(404, f"no routine {routine_id}")
    return respond({"id": routine_id, "deleted": True})


async def list_runs(request: Request) -> Response:
    routine_id = path_uuid(request, "routine_id")
    if not await ingress_queries(request).all("list_routines", {"id": routine_id}):
        raise Problem(404, f"no routine {routine_id}")
    runs = await ingress_queries(request).all("list_routine_runs", {"id": routine_id, "limit": RUNS_LIMIT})
    return respond({"runs": runs})


async def _enqueue(request: Request, routine_id: uuid.UUID, trigger: str, event: dict[str, Any],
                   delivery_id: str | None = None, requested_by: str | None = None) -> dict[str, Any] | None:
    return await ingress_queries(request).one("enqueue_routine_trigger", {
        "routine_id": routine_id, "trigger": trigger, "event": Jsonb(event), "delivery_id": delivery_id,
        "requested_by": requested_by})


async def run_now(request: Request) -> Response:
    """Run now, as the signed-in user (disabled or not: the user asked)."""
    routine_id = path_uuid(request, "routine_id")
    spec = await body(request, RunIn, optional=True)
    if await ingress_queries(request).one("get_routine_secret", {"id": routine_id}) is None:
        raise Problem(404, f"no routine {routine_id}")
    return respond(await _enqueue(request, routine_id, "run", spec.event, requested_by=who(request)), 202)


async def _routine_or_401(request: Request, routine_id: uuid.UUID) -> dict[str, Any]:
    row = await ingress_queries(request).one("get_routine_secret", {"id": routine_id})
    if row is None:
        # the same answer as a wrong credential: an id alone tells a caller nothing
        raise Problem(401, "unknown routine or wrong credential")
    return row


async def fire(request: Request) -> Response:
    """The routine's own token (Authorization: Bearer), never the user's: an outside system starts a run."""
    routine_id = path_uuid(request, "routine_id")
    auth = request.headers.get("authorization", "")
    row = await _routine_or_401(request, routine_id)
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    if not given or not hmac.compare_digest(_token_hash(given), bytes(row["fire_token_sha256"] or b"")):
        raise Problem(401, "unknown routine or wrong credential")
    if not row["enabled"]:
        raise Problem(409, f"routine {routine_id} is disabled")
    spec = await body(request, RunIn, optional=True)
    return respond(await _enqueue(request, routine_id, "fire", spec.event, requested_by="fire token"), 202)


async def hook(request: Request) -> Response:
    """A webhook delivery, signed the Standard Webhooks way or GitHub's (ingress/webhooks.py). Refused when its
    id was received before, a Standard one outside its timestamp's tolerance, a GitHub one whose body was accepted
    within HOOK_BODY_RETENTION (a replay under a new X-GitHub-Delivery). The JSON payload is the run's `event`."""
    routine_id = path_uuid(request, "routine_id")
    try:
        raw = await request.body()  # bounded by the guard (HOOK_BODY_BYTES): over it, 413
    except BodyTooLarge:
        raise Problem(413, "body too large") from None
    row = await _routine_or_401(request, routine_id)
    if not row["webhook_secret"]:
        raise Problem(401, "unknown routine or wrong credential (the routine takes no webhook)")
    now = _now()
    try:
        delivery = webhooks.verify(request.headers, raw, row["webhook_secret"], now.timestamp())
    except webhooks.Refused as exc:
        raise Problem(exc.status, exc.detail) from None
    if not row["enabled"]:
        raise Problem(409, f"routine {routine_id} is disabled")
    if json_depth_exceeds(raw):
        raise Problem(400, "malformed JSON: nested too deep")
    try:
        payload = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise Problem(400, f"malformed JSON: {exc}") from None
    event = payload if isinstance(payload, dict) else {"payload": payload}
    kind = request.headers.get("x-github-event")
    if kind and delivery.scheme == "github":
        event = {**event, "_event": kind[:100]}
    async with ingress_queries(request).transaction() as tx:
        # both refusals raise inside the transaction: nothing of a refused delivery stays, its queue row included
        queued = await tx.one("enqueue_routine_trigger", {
            "routine_id": routine_id, "trigger": "webhook", "event": Jsonb(event), "delivery_id": delivery.delivery_id,
            "requested_by": "webhook"})
        if queued is None:
            raise Problem(409, f"delivery {delivery.delivery_id} was already received")
        if delivery.body_sha256 is not None and await tx.one("record_hook_body", {
                "routine_id": routine_id, "body_sha256": delivery.body_sha256, "now": now,
                "since": now - HOOK_BODY_RETENTION}) is None:
            raise Problem(409, f"this body was already accepted within the last {HOOK_BODY_RETENTION.days} days "
                               "(a replay: X-Hub-Signature-256 signs the body only, not X-GitHub-Delivery)")
    return respond(queued, 202)


async def quota(request: Request) -> Response:
    """The account's rate-limit windows (the CLI's rate_limit_event lines): utilisation, reset time, and
    whether unattended runs are waiting for one."""
    return respond({"windows": await ingress_queries(request).all("list_quota_windows")})
