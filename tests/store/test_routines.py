"""Routines against a real PostgreSQL: the API (create, list, edit, triggers verified and queued), and the
executor's routines passes driven by a fake clock — exactly once per instant with two schedulers racing,
the missed-instant and overlap policies, budgets, templates. No CLI: a started run's turn stays pending."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from executor.routines import Routines, RoutinesConfig
from executor.settle import dispatch
from executor.sql import queries as executor_sql
from ingress import webhooks
from petal_dispatch import config, executor_wiring
from shared import journal
from shared.database import Database
from shared.models import NewEvent
from shared.query import Queries
from tests import tables
from tests.pg import DB
from tests.served import ingress_server

pytestmark = pytest.mark.store


@dataclass
class FakeClock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now


def _runs(db: DB, routine_id: str) -> list[dict[str, Any]]:
    return tables.dict_rows(db.admin_dsn, "routine_runs", order=("created_at", "scheduled_at"), routine_id=routine_id)


@pytest.fixture
async def http(db: DB) -> AsyncIterator[httpx.AsyncClient]:
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        yield client


async def _create(http: httpx.AsyncClient, **spec: Any) -> dict[str, Any]:
    made = await http.post("/api/routines", json={"name": "r", "prompt": "check the build", **spec})
    assert made.status_code == 202, made.text
    return made.json()  # type: ignore[no-any-return]  # JSON from the API


def _signed(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


async def _drain(r: Routines) -> None:
    for step in (r.claim_triggers, r.schedule, r.start_runs):
        while await step():
            pass


async def test_create_validates_and_shows_secrets_once_and_triggers_are_verified_before_anything_is_queued(
    db: DB, http: httpx.AsyncClient, pool: AsyncConnectionPool
) -> None:
    for bad, says in (({"schedule": {"cron": "61 * * * *", "tz": "UTC"}}, "invalid cron"),
                      ({"schedule": {"cron": "* * * * *", "tz": "Mars/Base"}}, "unknown time zone"),
                      ({"prompt": "{{ event.title "}, "template error"),
                      ({"project_id": str(uuid.uuid4())}, "no project")):
        refused = await http.post("/api/routines", json={"name": "r", "prompt": "x", **bad})
        assert refused.status_code in (404, 422) and says in refused.text, refused.text
    routine = await _create(http, prompt="Review: {{ event.pull_request.title }}", webhook=True,
                            schedule={"cron": "0 9 * * 1-5", "tz": "Europe/Berlin"})
    rid, secret, token = routine["id"], routine["webhook_secret"], routine["fire_token"]
    assert len(routine["next_fire_times"]) == 3 and routine["mode"] == "autonomous"
    listed = (await http.get("/api/routines")).json()["routines"]
    assert [r["id"] for r in listed] == [rid]
    assert "fire_token" not in listed[0] and "webhook_secret" not in listed[0] and listed[0]["webhook"] is True
    (stored,) = tables.row(db.admin_dsn, "routines", rid, "fire_token_sha256")
    assert bytes(stored) == hashlib.sha256(token.encode()).digest()  # the hash only

    body = json.dumps({"pull_request": {"title": "Fix the parser"}}).encode()
    headers = {"content-type": "application/json", "x-github-delivery": "d-1", "x-github-event": "pull_request"}
    wrong = await http.post(f"/api/hooks/{rid}", content=body, headers={**headers, "x-hub-signature-256":
                                                                          _signed("not the secret", body)})
    assert wrong.status_code == 401
    unsigned = await http.post(f"/api/hooks/{rid}", content=body, headers=headers)
    assert unsigned.status_code == 401
    assert tables.count(db.admin_dsn, "routine_queue") == 0  # nothing queued for either
    good = await http.post(f"/api/hooks/{rid}", content=body,
                           headers={**headers, "x-hub-signature-256": _signed(secret, body)})
    assert good.status_code == 202, good.text
    replay = await http.post(f"/api/hooks/{rid}", content=body,
                             headers={**headers, "x-hub-signature-256": _signed(secret, body)})
    assert replay.status_code == 409 and "already received" in replay.text
    big = b'{"x": "' + b"a" * (1024 * 1024) + b'"}'
    oversize = await http.post(f"/api/hooks/{rid}", content=big,
                               headers={**headers, "x-github-delivery": "d-2", "x-hub-signature-256": _signed(secret, big)})
    assert oversize.status_code == 413

    # the fire token, never anything else: no bearer, a wrong one, and another routine's all look the same
    other = await _create(http, name="other")
    for auth in (None, "Bearer nope", f"Bearer {other['fire_token']}"):
        refused = await http.post(f"/api/routines/{rid}/fire", json={},
                                  headers={"authorization": auth} if auth else {})
        assert refused.status_code == 401, (auth, refused.text)
    fired = await http.post(f"/api/routines/{rid}/fire", json={"event": {"pull_request": {"title": "From CI"}}},
                            headers={"authorization": f"Bearer {token}"})
    assert fired.status_code == 202, fired.text
    ran = await http.post(f"/api/routines/{rid}/run", json={})  # run now, as the user: no event fields
    assert ran.status_code == 202
    queued = tables.dict_rows(db.admin_dsn, "routine_queue", "trigger", "requested_by", "delivery_id",
                              order=("created_at",))
    assert [(q["trigger"], q["delivery_id"]) for q in queued] == [("webhook", "d-1"), ("fire", None), ("run", None)]
    assert queued[2]["requested_by"] == "open"

    clock = FakeClock(datetime.now(UTC))
    routines = Routines(pool, RoutinesConfig(clock=clock))
    await _drain(routines)
    runs = {r["trigger"]: r for r in _runs(db, rid)}
    assert runs["webhook"]["status"] == "running" and runs["webhook"]["prompt"] == "Review: Fix the parser"
    assert runs["webhook"]["event"]["_event"] == "pull_request"
    # the overlap policy (skip, the default): the fire came while the webhook's run was going
    assert runs["fire"]["status"] == "skipped" and "overlap" in runs["fire"]["reason"]
    assert runs["run"]["status"] == "skipped"
    role, brief, status, thread = tables.task(db.admin_dsn, runs["webhook"]["task_id"], "role", "brief", "status",
                                              "session_id")
    assert (role, status, *tables.thread(db.admin_dsn, thread, "mode")) == ("orchestrator", "pending", "autonomous")
    assert brief.startswith("Review: Fix the parser")
    history = (await http.get(f"/api/routines/{rid}/runs")).json()["runs"]
    assert {h["trigger"] for h in history} == {"webhook", "fire", "run"}
    assert [json.loads(h["event_excerpt"]) for h in history if h["trigger"] == "webhook"] == [
        {"pull_request": {"title": "Fix the parser"}, "_event": "pull_request"}]


async def test_a_github_delivery_replayed_under_a_new_delivery_id_starts_nothing_within_the_retention_window(
    db: DB, http: httpx.AsyncClient
) -> None:
    routine = await _create(http, webhook=True)
    rid, secret = routine["id"], routine["webhook_secret"]
    body = json.dumps({"action": "opened", "number": 7}).encode()

    async def deliver(delivery: str, payload: bytes = body) -> httpx.Response:
        return await http.post(f"/api/hooks/{rid}", content=payload, headers={
            "content-type": "application/json", "x-github-delivery": delivery,
            "x-hub-signature-256": _signed(secret, payload)})

    # the audit's replay: once as sent, then the captured delivery again under the same and under new ids
    answers = [await deliver(d) for d in ("d-1", "d-1", "d-2", "d-3")]
    assert [a.status_code for a in answers] == [202, 409, 409, 409]  # before: [202, 409, 202, 202]
    assert "delivery d-1 was already received" in answers[1].text
    assert "this body was already accepted within the last 30 days" in answers[2].text
    other = await deliver("d-4", json.dumps({"action": "closed", "number": 7}).encode())
    assert other.status_code == 202  # another body is another delivery
    queued = tables.rows(db.admin_dsn, "routine_queue", "delivery_id", order=("created_at",), routine_id=rid)
    assert [d for (d,) in queued] == ["d-1", "d-4"]  # a refused delivery left nothing queued
    # past the retention window the body is forgotten (GitHub signs no date: nothing else could tell)
    tables.update_all(db.admin_dsn, "routine_hook_bodies", {}, received_at=tables.moved("received_at", days=-31))
    assert (await deliver("d-5")).status_code == 202
    # and the routine's other expired receipt went as this one was recorded
    kept = tables.rows(db.admin_dsn, "routine_hook_bodies", "body_sha256", "received_at", order=("received_at",))
    a_minute_ago = tables.now(db.admin_dsn) - timedelta(minutes=1)
    assert [(bytes(sha), received > a_minute_ago) for sha, received in kept] == [(hashlib.sha256(body).digest(), True)]


async def test_a_standard_webhooks_delivery_is_accepted_once_within_its_timestamps_tolerance(
    db: DB, http: httpx.AsyncClient
) -> None:
    routine = await _create(http, prompt="{{ event.type }}", webhook=True)
    rid, secret = routine["id"], routine["webhook_secret"]
    assert secret.startswith("whsec_")
    body = json.dumps({"type": "invoice.paid", "data": {"id": 3}}).encode()

    async def deliver(msg_id: str, off_s: int = 0, sign_with: str = secret) -> httpx.Response:
        stamp = int(datetime.now(UTC).timestamp()) + off_s
        return await http.post(f"/api/hooks/{rid}", content=body, headers={
            "content-type": "application/json", "webhook-id": msg_id, "webhook-timestamp": str(stamp),
            "webhook-signature": webhooks.standard_signature(sign_with, msg_id, stamp, body)})

    first = await deliver("msg_1")
    assert first.status_code == 202, first.text
    again = await deliver("msg_1")  # the same id, freshly signed: a retry or a replay, never a second run
    assert again.status_code == 409 and "delivery msg_1 was already received" in again.text
    # the same body under another id is another event (the id is signed: only the sender can make one)
    assert (await deliver("msg_2", off_s=-240)).status_code == 202
    stale, early = await deliver("msg_3", off_s=-360), await deliver("msg_4", off_s=360)
    assert stale.status_code == early.status_code == 401
    assert "behind this server's clock" in stale.json()["detail"] and "ahead of" in early.json()["detail"]
    wrong = await deliver("msg_5", sign_with="whsec_" + "A" * 44)
    assert wrong.status_code == 401 and "webhook-signature" in wrong.json()["detail"]
    queued = tables.dict_rows(db.admin_dsn, "routine_queue", "delivery_id", "event", order=("created_at",),
                              routine_id=rid)
    assert [q["delivery_id"] for q in queued] == ["msg_1", "msg_2"]
    assert queued[0]["event"] == {"type": "invoice.paid", "data": {"id": 3}}
    assert tables.count(db.admin_dsn, "routine_hook_bodies") == 0  # ids, not bodies, here


async def test_a_missing_template_field_fails_the_run_with_a_message_naming_it(
    db: DB, http: httpx.AsyncClient, pool: AsyncConnectionPool
) -> None:
    routine = await _create(http, prompt="Review: {{ event.pull_request.title }}", schedule=None)
    await http.post(f"/api/routines/{routine['id']}/run", json={"event": {"issue": {"title": "x"}}})
    await _drain(Routines(pool, RoutinesConfig(clock=FakeClock(datetime.now(UTC)))))
    (run,) = _runs(db, routine["id"])
    assert run["status"] == "failed" and "pull_request" in run["reason"] and "issue" in run["reason"]
    ended = tables.payloads(db.admin_dsn, "routine.run_ended")
    assert ended[0]["status"] == "failed"


def _minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


async def test_two_schedulers_racing_over_twenty_instants_make_exactly_one_run_each(
    db: DB, http: httpx.AsyncClient, pool: AsyncConnectionPool
) -> None:
    routine = await _create(http, schedule={"cron": "* * * * *", "tz": "Europe/Berlin", "overlap": "parallel"})
    clock = FakeClock(datetime.now(UTC))
    async with Database(db.executor_dsn, name="test-executor-2", max_size=4) as second:
        a, b = Routines(pool, RoutinesConfig(clock=clock)), Routines(second.pool, RoutinesConfig(clock=clock))
        first = _minute(clock.now) + timedelta(minutes=1)
        for i in range(20):
            clock.now = first + timedelta(minutes=i, seconds=1)
            await asyncio.gather(_drain(a), _drain(b), _drain(a), _drain(b))
    runs = _runs(db, routine["id"])
    assert [r["scheduled_at"] for r in runs] == [first + timedelta(minutes=i) for i in range(20)]
    assert {r["status"] for r in runs} == {"running"}
    assert len({r["task_id"] for r in runs}) == 20


async def test_after_three_missed_instants_skip_runs_none_and_run_once_runs_one_then_the_next_runs_on_time(
    db: DB, http: httpx.AsyncClient, pool: AsyncConnectionPool
) -> None:
    skip = await _create(http, name="skip", schedule={"cron": "* * * * *", "tz": "UTC", "missed": "skip",
                                                      "overlap": "parallel"})
    once = await _create(http, name="once", schedule={"cron": "* * * * *", "tz": "UTC", "missed": "run_once",
                                                      "overlap": "parallel"})
    clock = FakeClock(datetime.now(UTC))
    routines = Routines(pool, RoutinesConfig(clock=clock, missed_grace_s=10))
    start = _minute(clock.now)
    clock.now = start + timedelta(minutes=3, seconds=30)  # down across three instants
    await _drain(routines)
    assert _runs(db, skip["id"]) == []
    (caught_up,) = _runs(db, once["id"])
    assert caught_up["scheduled_at"] == start + timedelta(minutes=3) and caught_up["event"]["missed"] == 2
    clock.now = start + timedelta(minutes=4, seconds=2)  # back up: the next instant is on time for both
    await _drain(routines)
    assert [r["scheduled_at"] for r in _runs(db, skip["id"])] == [start + timedelta(minutes=4)]
    assert len(_runs(db, once["id"])) == 2


async def test_overlap_queue_waits_for_the_running_run(
    db: DB, http: httpx.AsyncClient, pool: AsyncConnectionPool
) -> None:
    queued = await _create(http, name="q", schedule={"cron": "* * * * *", "tz": "UTC", "overlap": "queue"})
    clock = FakeClock(datetime.now(UTC))
    routines = Routines(pool, RoutinesConfig(clock=clock))
    start = _minute(clock.now)
    for i in (1, 2):
        clock.now = start + timedelta(minutes=i, seconds=1)
        await _drain(routines)
    assert [r["status"] for r in _runs(db, queued["id"])] == ["running", "queued"]
    # the first run ends: the queued one starts
    tables.update_all(db.admin_dsn, "routine_runs", {"routine_id": queued["id"], "status": "running"},
                      status="succeeded", ended_at=tables.NOW)
    await _drain(routines)
    assert [r["status"] for r in _runs(db, queued["id"])] == ["succeeded", "running"]


# a schedule that never comes due in a test (its overlap policy is what the test wants)
YEARLY = {"cron": "0 0 1 1 *", "tz": "UTC", "overlap": "parallel"}


async def _run_now(http: httpx.AsyncClient, db: DB, routines: Routines, routine_id: str) -> dict[str, Any]:
    """Run now, and the run the executor made of it (started or skipped)."""
    assert (await http.post(f"/api/routines/{routine_id}/run", json={})).status_code == 202
    await _drain(routines)
    return _runs(db, routine_id)[-1]


def _end(db: DB, run: dict[str, Any], cost: float) -> None:
    tables.update(db.admin_dsn, "routine_runs", run["id"], status="succeeded", cost_usd=cost, ended_at=tables.NOW)


async def test_a_day_budget_counts_running_runs_at_their_cap_and_skips_a_run_that_would_pass_it(
    db: DB, http: httpx.AsyncClient, pool: AsyncConnectionPool
) -> None:
    # (binary fractions: the sums below are exact, so the boundary is the rule's, not rounding's)
    routine = await _create(http, budget={"usd_per_day": 1.0, "usd_per_run": 0.375}, schedule=YEARLY)
    routines = Routines(pool, RoutinesConfig(clock=FakeClock(datetime.now(UTC))))
    first, second = [await _run_now(http, db, routines, routine["id"]) for _ in range(2)]
    assert (first["status"], second["status"]) == ("running", "running")
    # two running runs count 0.75 (their cap: what they may still spend) though neither has cost anything yet;
    # 0.75 is under the cap, but 0.75 + 0.375 is over it
    third = await _run_now(http, db, routines, routine["id"])
    assert third["status"] == "skipped" and third["reason"] == "budget: 0.75 of 1.00 USD spent today"
    # an ended run counts what it cost: 0.125 + 0.375 running, and 0.375 more fits
    _end(db, first, 0.125)
    fourth = await _run_now(http, db, routines, routine["id"])
    assert fourth["status"] == "running"
    # spent + usd_per_run exactly the cap (0.125 + 0.125 + 0.375 + 0.375) is within it; one more run is not
    _end(db, second, 0.125)
    fifth = await _run_now(http, db, routines, routine["id"])
    sixth = await _run_now(http, db, routines, routine["id"])
    assert fifth["status"] == "running"
    assert sixth["status"] == "skipped" and sixth["reason"] == "budget: 1.00 of 1.00 USD spent today"


async def test_the_project_day_budget_from_its_setting_caps_all_routines_of_a_project_together(
    db: DB, http: httpx.AsyncClient, pool: AsyncConnectionPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PETAL_ROUTINE_PROJECT_USD_PER_DAY, read as the executor reads it (executor_wiring.routines_config), caps the
    runs of every routine of one project together; a routine of no project, or the setting unset, is not held by it."""
    project = str(tables.insert(db.admin_dsn, "projects", name="budgeted"))
    spec = {"budget": {"usd_per_run": 0.25}, "schedule": YEARLY}
    a = await _create(http, name="a", project_id=project, **spec)
    b = await _create(http, name="b", project_id=project, **spec)
    loose = await _create(http, name="no project", **spec)
    clock = FakeClock(datetime.now(UTC))

    def routines_from_env(value: str | None) -> Routines:
        if value is None:
            monkeypatch.delenv("PETAL_ROUTINE_PROJECT_USD_PER_DAY", raising=False)
        else:
            monkeypatch.setenv("PETAL_ROUTINE_PROJECT_USD_PER_DAY", value)
        return Routines(pool, dataclasses.replace(executor_wiring.routines_config(config.load()), clock=clock))

    capped = routines_from_env("0.5")
    assert capped.config.project_usd_per_day == 0.5
    assert (await _run_now(http, db, capped, a["id"]))["status"] == "running"
    assert (await _run_now(http, db, capped, b["id"]))["status"] == "running"
    # a and b each within their own (no day cap), the project's 0.25 + 0.25 running leaves nothing for a third
    held = await _run_now(http, db, capped, a["id"])
    assert held["status"] == "skipped"
    assert held["reason"] == "budget: the project's routines spent 0.50 of 0.50 USD today"
    assert all([(await _run_now(http, db, capped, loose["id"]))["status"] == "running" for _ in range(3)])
    # negative control: the setting unset, the same run goes
    assert routines_from_env(None).config.project_usd_per_day is None
    assert (await _run_now(http, db, routines_from_env(None), a["id"]))["status"] == "running"


async def test_disabling_stops_the_schedule_and_enabling_again_owes_nothing_for_the_pause(
    db: DB, http: httpx.AsyncClient, pool: AsyncConnectionPool
) -> None:
    every_minute = {"cron": "* * * * *", "tz": "UTC", "missed": "run_once", "overlap": "parallel"}
    routine = await _create(http, schedule=every_minute)
    control = await _create(http, name="control", schedule=every_minute)
    for r in (routine, control):
        off = await http.patch(f"/api/routines/{r['id']}", json={"enabled": False})
        assert off.status_code == 200 and off.json()["next_fire_times"] == []
    clock = FakeClock(datetime.now(UTC) + timedelta(minutes=5))
    await _drain(Routines(pool, RoutinesConfig(clock=clock)))
    assert _runs(db, routine["id"]) == []
    # the pause began five minutes ago, as far as the schedule's cursor knows
    with psycopg.connect(db.admin_dsn) as conn:  # one transaction: one now() for both
        for r in (routine, control):
            tables.update(conn, "routines", r["id"], scheduled_through=tables.from_now(minutes=-5))
    on = await http.patch(f"/api/routines/{routine['id']}", json={"enabled": True})
    assert on.status_code == 200 and len(on.json()["next_fire_times"]) == 3
    # negative control: enabled again without the cursor moved to now (as a bare UPDATE would)
    due = datetime.fromisoformat(on.json()["next_fire_times"][0])
    tables.update(db.admin_dsn, "routines", control["id"], enabled=True, next_fire_at=due)
    clock.now = due + timedelta(seconds=2)
    await _drain(Routines(pool, RoutinesConfig(clock=clock)))
    (resumed,) = _runs(db, routine["id"])
    assert resumed["scheduled_at"] == due and resumed["event"]["missed"] == 0  # nothing owed for the pause
    (owed,) = _runs(db, control["id"])
    assert owed["scheduled_at"] == due and owed["event"]["missed"] >= 4
    bad = await http.patch(f"/api/routines/{routine['id']}", json={"schedule": {"cron": "x", "tz": "UTC"}})
    assert bad.status_code == 422
    assert (await http.delete(f"/api/routines/{routine['id']}")).status_code == 200
    assert [r["id"] for r in (await http.get("/api/routines")).json()["routines"]] == [control["id"]]
    assert (await http.post(f"/api/routines/{routine['id']}/run", json={})).status_code == 404


async def test_a_run_past_its_runtime_is_stopped_and_ends_failed_saying_so(
    db: DB, http: httpx.AsyncClient, pool: AsyncConnectionPool
) -> None:
    routine = await _create(http, budget={"runtime_s": 60})
    await http.post(f"/api/routines/{routine['id']}/run", json={})
    clock = FakeClock(datetime.now(UTC))
    routines = Routines(pool, RoutinesConfig(clock=clock))
    await _drain(routines)
    (run,) = _runs(db, routine["id"])
    tables.update(db.admin_dsn, "tasks", run["task_id"], status="running")
    await routines.finish_runs()  # within its runtime: nothing is stopped
    assert tables.count(db.admin_dsn, "stop_queue") == 0
    clock.now += timedelta(seconds=61)
    await routines.finish_runs()
    await routines.finish_runs()  # asked once, however often the poll comes
    stops = tables.rows(db.admin_dsn, "stop_queue", "task_id", "reason")
    assert stops == [(run["task_id"], "the routine's runtime cap")]
    tables.update(db.admin_dsn, "tasks", run["task_id"], status="cancelled", ended_at=tables.NOW,
                  settled_at=tables.NOW)
    await routines.finish_runs()
    (ended,) = _runs(db, routine["id"])
    assert ended["status"] == "failed" and ended["reason"] == "stopped at the routine's runtime cap (60 s)"


def _cli(db: DB, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_INGRESS_DSN": db.ingress_dsn}
    return subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "routine", *args], env=env,
                          capture_output=True, text=True, timeout=60)


async def test_the_command_line_adds_lists_fires_and_shows_the_history_as_the_api_does(
    db: DB, pool: AsyncConnectionPool
) -> None:
    bad = await asyncio.to_thread(_cli, db, "add", "--name", "n", "--prompt", "p", "--cron", "* * *")
    assert bad.returncode != 0 and "5 fields" in bad.stderr
    added = await asyncio.to_thread(_cli, db, "add", "--name", "nightly", "--prompt", "build {{ event.ref }}",
                                    "--cron", "0 3 * * *", "--tz", "Europe/Berlin", "--usd-per-day", "5")
    assert added.returncode == 0, added.stderr
    made = json.loads(added.stdout)
    assert made["fire_token"] and made["usd_per_day"] == 5.0 and len(made["next_fire_times"]) == 3
    listed = json.loads((await asyncio.to_thread(_cli, db, "list", "--json")).stdout)["routines"]
    assert [r["name"] for r in listed] == ["nightly"] and "fire_token" not in listed[0]
    fired = await asyncio.to_thread(_cli, db, "fire", made["id"], "--event", '{"ref": "main"}')
    assert fired.returncode == 0, fired.stderr
    await _drain(Routines(pool, RoutinesConfig(clock=FakeClock(datetime.now(UTC)))))
    history = json.loads((await asyncio.to_thread(_cli, db, "history", made["id"], "--json")).stdout)["runs"]
    assert [(h["trigger"], h["status"], h["prompt"]) for h in history] == [("run", "running", "build main")]


async def test_an_exhausted_quota_window_holds_unattended_runs_until_its_reset_and_says_until_when(
    db: DB, http: httpx.AsyncClient, pool: AsyncConnectionPool
) -> None:
    routine = await _create(http)
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0))
    resets = clock.now + timedelta(minutes=30)
    # what the CLI writes under a subscription's login (journaled by a run as stream.rate_limit_event)
    await journal.append(pool, [NewEvent("stream.rate_limit_event", {"type": "rate_limit_event", "rate_limit_info": {
        "status": "allowed_warning", "rateLimitType": "seven_day", "utilization": 0.8,
        "resetsAt": int((clock.now + timedelta(days=3)).timestamp())}}), NewEvent("stream.rate_limit_event", {
        "type": "rate_limit_event", "rate_limit_info": {"status": "rejected", "rateLimitType": "five_hour",
                                                        "utilization": 1.0, "resetsAt": int(resets.timestamp())}})])
    routines = Routines(pool, RoutinesConfig(clock=clock))
    await routines.record_quota()
    windows = (await http.get("/api/quota")).json()["windows"]
    assert [(w["kind"], w["status"], w["exhausted"]) for w in windows] == [
        ("five_hour", "rejected", True), ("seven_day", "allowed_warning", False)]
    await http.post(f"/api/routines/{routine['id']}/run", json={})
    await _drain(routines)
    (run,) = _runs(db, routine["id"])
    assert run["status"] == "queued" and run["reason"].startswith(f"waiting for quota until {resets:%H:%M} UTC")
    clock.now = resets - timedelta(seconds=1)
    await _drain(routines)
    assert _runs(db, routine["id"])[0]["status"] == "queued"
    clock.now = resets + timedelta(seconds=1)  # the window has reset: the run goes, on time
    await _drain(routines)
    (run,) = _runs(db, routine["id"])
    assert run["status"] == "running" and run["reason"] is None


async def test_a_forged_quota_line_holds_runs_at_most_a_week_and_a_day_and_never_under_a_made_up_name(
    db: DB, http: httpx.AsyncClient, pool: AsyncConnectionPool
) -> None:
    # a process in a spawn's sandbox can write lines as the CLI's: a window rejected until 2100, and one under a
    # name no real line would ever overwrite
    forged = [NewEvent("stream.rate_limit_event", {"type": "rate_limit_event", "rate_limit_info": {
        "status": "rejected", "rateLimitType": kind, "resetsAt": resets}})
        for kind, resets in (("five_hour", 4102444800), ("zz\nq", 4102444800), ("seven_day", 1e300),
                             ("seven_day_opus", -1e300))]
    # and a utilisation no float holds (json takes a 401-digit integer; a float8 cast fails on it)
    forged.append(NewEvent("stream.rate_limit_event", {"type": "rate_limit_event", "rate_limit_info": {
        "status": "allowed", "rateLimitType": "overage", "utilization": 10 ** 400}}))
    await journal.append(pool, forged)
    routines = Routines(pool, RoutinesConfig(clock=FakeClock(datetime.now(UTC))))
    await routines.record_quota()
    windows = {w["kind"]: w for w in (await http.get("/api/quota")).json()["windows"]}
    assert sorted(windows) == ["five_hour", "overage", "seven_day", "seven_day_opus"]
    written = tables.now(db.admin_dsn)
    for w in windows.values():
        assert w["resets_at"] is None or datetime.fromisoformat(w["resets_at"]) <= written + timedelta(days=8), w


async def test_a_runs_workers_are_capped_at_its_routines_max_workers(
    db: DB, http: httpx.AsyncClient, pool: AsyncConnectionPool
) -> None:
    routine = await _create(http, budget={"max_workers": 2})
    await http.post(f"/api/routines/{routine['id']}/run", json={})
    await _drain(Routines(pool, RoutinesConfig(clock=FakeClock(datetime.now(UTC)))))
    (run,) = _runs(db, routine["id"])
    q = Queries(pool, executor_sql)

    async def full() -> bool:
        return await q.one("check_routine_workers_full", {"thread_id": run["thread_id"]}) is not None

    for i in range(3):
        assert await full() is (i == 2)
        await dispatch.request(pool, dispatch.TaskRequest("worker", f"w{i}", parent_task_id=run["task_id"]))
    tables.update_all(db.admin_dsn, "tasks", {"role": "worker", "brief": "w0"}, status="success")
    assert await full() is True  # two still going
    tables.update_all(db.admin_dsn, "tasks", {"role": "worker", "brief": "w1"}, status="success")
    assert await full() is False
    # a worker's own worker counts as the run's (a worker may dispatch: its own were free of the cap)
    tables.update_all(db.admin_dsn, "tasks", {"role": "worker", "brief": "w2"}, status="success")
    outer = await dispatch.request(pool, dispatch.TaskRequest("worker", "outer", parent_task_id=run["task_id"]))
    assert await full() is False
    await dispatch.request(pool, dispatch.TaskRequest("worker", "inner", parent_task_id=outer))
    assert await full() is True


async def test_a_runs_processes_are_granted_what_is_left_of_its_usd_and_nothing_once_it_is_spent(
    db: DB, http: httpx.AsyncClient, pool: AsyncConnectionPool
) -> None:
    from executor.run.task_store import TaskStore

    routine = await _create(http, budget={"usd_per_run": 0.5})
    await http.post(f"/api/routines/{routine['id']}/run", json={})
    await _drain(Routines(pool, RoutinesConfig(clock=FakeClock(datetime.now(UTC)))))
    (run,) = _runs(db, routine["id"])
    store = TaskStore(pool)

    async def worker(brief: str) -> uuid.UUID:
        return await dispatch.request(pool, dispatch.TaskRequest("worker", brief, parent_task_id=run["task_id"]))

    async def cost(task_id: uuid.UUID, usd: Any) -> None:
        await journal.append(pool, [NewEvent("stream.result", {"type": "result", "total_cost_usd": usd},
                                             task_id=task_id)])

    first = await worker("w1")
    assert await store.grant_budget(first) == {"granted": 0.5, "cap": 0.5, "spent": 0.0}
    await cost(run["task_id"], 0.125)  # the turn's own result, then the first worker's
    await cost(first, 0.25)
    second = await worker("w2")
    assert await store.grant_budget(second) == {"granted": 0.125, "cap": 0.5, "spent": 0.375}
    assert float(tables.task(db.admin_dsn, second, "max_budget_usd")[0]) == 0.125
    await cost(second, 0.25)  # past the cap: the next is granted nothing, and its row keeps a valid cap
    third = await worker("w3")
    assert await store.grant_budget(third) == {"granted": 0.0, "cap": 0.5, "spent": 0.625}
    assert float(tables.task(db.admin_dsn, third, "max_budget_usd")[0]) == 0.5
    # lines a process in a spawn's sandbox can write as the CLI's: a negative cost lifts no cap, a string one is
    # no cost (it failed the sum's cast)
    await cost(third, -100.0)
    await cost(third, "free")
    fourth = await worker("w4")
    assert await store.grant_budget(fourth) == {"granted": 0.0, "cap": 0.5, "spent": 0.625}
    # a task of no routine run is granted nothing by this: it keeps what it was given
    assert await store.grant_budget(await dispatch.request(pool, dispatch.TaskRequest("worker", "x"))) is None
