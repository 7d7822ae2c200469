"""Notifications only when needed: nothing while a page is in front of the user on any device, finished runs in
one digest, quiet hours (but the cards that hold up work when the user asks for them), muted threads. What is
held back is recorded with why. The notifier runs in-process on a real PostgreSQL, its records journaled as the
services journal them; an ntfy stand-in is the phone."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from executor.notify.notes import Note
from executor.notify.notifier import Notifier, NotifyConfig
from executor.notify.quiet import QuietHours
from shared import journal
from shared.database import Database
from shared.models import NewEvent
from tests import tables
from tests.pg import DB
from tests.push_standin import StandIn
from tests.served import ingress_server

Pass = Callable[[list[NewEvent]], Awaitable[list[Note]]]


@asynccontextmanager
async def notifier(db: DB, tmp_path: Path, ntfy: StandIn, **config: Any) -> AsyncIterator[Pass]:
    """A started notifier posting to the stand-in; the callable journals records and runs one pass."""
    async with Database(db.executor_dsn, name="test-notifier") as database:
        n = Notifier(database.pool, NotifyConfig(data_dir=tmp_path / "var", ntfy_url=f"{ntfy.url}/t", **config))
        await n.start()

        async def one_pass(records: list[NewEvent]) -> list[Note]:
            if records:
                async with database.pool.connection() as conn:
                    await journal.append_on(conn, records)
            return await n.pass_once()
        yield one_pass


def stalled(task: uuid.UUID) -> NewEvent:
    return NewEvent("task.stalled", {"silent_s": 200, "threshold_s": 180}, task_id=task)


def asked(task: uuid.UUID, tool_use_id: str) -> NewEvent:
    return NewEvent("question.asked", {"questions": [{"question": f"{tool_use_id}?"}], "tool_use_id": tool_use_id,
                                       "question_id": str(uuid.uuid4())}, task_id=task)


def outcomes(db: DB, task: uuid.UUID) -> list[str]:
    return [o for (o,) in tables.rows(db.admin_dsn, "notifications", "outcome", order=("created_at",), task_id=task)]


def titles(ntfy: StandIn) -> list[str]:
    return [r.headers["title"] for r in ntfy.received]


async def test_nothing_is_pushed_while_a_page_is_in_front_of_the_user_on_any_device(db: DB, tmp_path: Path) -> None:
    first, second, third = (tables.insert_task(db.admin_dsn, brief="a job", status="running") for _ in range(3))
    tables.add(db.admin_dsn, "client_presence", client_id="laptop-on-desk", visible=True, thread_id=None)
    tables.add(db.admin_dsn, "client_presence", client_id="phone-in-pocket", visible=False)
    with StandIn() as ntfy:
        async with notifier(db, tmp_path, ntfy) as one_pass:
            while_seen = await one_pass([stalled(first)])
            tables.update_all(db.admin_dsn, "client_presence", {"client_id": "laptop-on-desk"}, visible=False)
            after = await one_pass([stalled(second)])  # the page hidden: pushed
            # a page that said it was visible, but long ago (closed without a word), holds nothing back
            tables.update_all(db.admin_dsn, "client_presence", {"client_id": "laptop-on-desk"}, visible=True,
                              seen_at=tables.from_now(seconds=-600))
            stale = await one_pass([stalled(third)])
    assert while_seen == [] and outcomes(db, first) == ["page_visible"]
    assert [n.task_id for n in after] == [second] and outcomes(db, second) == ["sent"]
    assert [n.task_id for n in stale] == [third]
    assert titles(ntfy) == ["A worker stalled", "A worker stalled"]


async def test_finished_runs_wait_for_one_digest_that_waits_for_the_page_to_close(db: DB, tmp_path: Path) -> None:
    threads = [tables.insert_thread(db.admin_dsn) for _ in range(2)]
    turns = [tables.insert_task(db.admin_dsn, role="orchestrator", brief="hi", status="success", session_id=t)
             for t in threads]
    with StandIn() as ntfy:
        async with notifier(db, tmp_path, ntfy, digest_s=3600) as one_pass:
            await one_pass([NewEvent("task.exited", {"status": "success"}, task_id=turn, session_id=thread)
                            for turn, thread in zip(turns, threads, strict=True)])
            waiting = titles(ntfy)
            # the oldest has waited its digest_s: one digest, but not while a page is in front of the user
            tables.update_all(db.admin_dsn, "notifications", {"outcome": "deferred"},
                              created_at=tables.from_now(seconds=-3601))
            tables.add(db.admin_dsn, "client_presence", client_id="laptop-on-desk", visible=True)
            await one_pass([])
            while_seen = titles(ntfy)
            tables.update_all(db.admin_dsn, "client_presence", {"client_id": "laptop-on-desk"}, visible=False)
            await one_pass([])
            await one_pass([])  # and only once
    assert waiting == [] and while_seen == []
    assert titles(ntfy) == ["2 runs finished"]
    assert ntfy.received[0].body.decode() == "2 finished turns"
    assert [outcomes(db, turn) for turn in turns] == [["digested"], ["digested"]]


async def test_quiet_hours_hold_everything_but_the_cards_that_hold_up_work_when_asked(db: DB, tmp_path: Path) -> None:
    now = datetime.now(UTC)
    window = f"{now - timedelta(hours=1):%H:%M}-{now + timedelta(hours=1):%H:%M} UTC"
    task = tables.insert_task(db.admin_dsn, brief="a job", status="running")
    held: dict[bool, list[str]] = {}
    for allow_gates in (False, True):
        with StandIn() as ntfy:
            quiet = QuietHours.parse(window, allow_gates=allow_gates)
            async with notifier(db, tmp_path, ntfy, quiet=quiet, rate_limit_s=0) as one_pass:
                await one_pass([stalled(task), asked(task, "toolu_plain"), asked(task, "gate-toolu_rm")])
            held[allow_gates] = titles(ntfy)
    assert held == {False: [], True: ["Approve a tool call?"]}
    assert sorted(outcomes(db, task)) == ["quiet"] * 5 + ["sent"]


async def test_a_muted_thread_and_its_workers_are_not_pushed_until_unmuted(db: DB, tmp_path: Path) -> None:
    muted, other = tables.insert_thread(db.admin_dsn), tables.insert_thread(db.admin_dsn)
    turns = {t: tables.insert_task(db.admin_dsn, role="orchestrator", brief="hi", status="success", session_id=t)
             for t in (muted, other)}
    workers = {t: tables.insert_task(db.admin_dsn, brief="a job", status="running", parent_task_id=turns[t])
               for t in (muted, other)}
    with StandIn() as ntfy:
        async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http, \
                notifier(db, tmp_path, ntfy, rate_limit_s=0) as one_pass:
            put = await http.put(f"/api/threads/{muted}/mute", json={})
            unknown = await http.put(f"/api/threads/{uuid.uuid4()}/mute", json={})
            info = (await http.get("/api/push")).json()
            while_muted = await one_pass([stalled(workers[muted]), stalled(workers[other])])
            assert (await http.delete(f"/api/threads/{muted}/mute")).status_code == 200
            unmuted = await one_pass([stalled(workers[muted])])
    assert put.status_code == 200 and unknown.status_code == 404, (put.text, unknown.text)
    assert info["muted"] == [str(muted)] and info["policy"] == {"digest_s": 120.0, "presence_s": 60.0, "quiet": None}
    assert [n.task_id for n in while_muted] == [workers[other]]
    assert outcomes(db, workers[muted]) == ["muted", "sent"] and [n.task_id for n in unmuted] == [workers[muted]]
    assert titles(ntfy) == ["A worker stalled", "A worker stalled"]
