"""The notifications a change sends wake only the loops that have work for it (migrations 0035, 0036): a task's
activity is not an end, nor is its claim, and a question whose asking tool waits for it is nothing for the
settler."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from executor.notify import notifier
from executor.sql import queries as executor_queries
from shared import journal
from shared.listener import RESYNC, Listener, Notification
from shared.models import NewEvent
from tests import tables
from tests.pg import DB

QUESTIONS = [{"question": "Go on?", "header": "Go", "multiSelect": False,
              "options": [{"label": "Yes", "description": ""}, {"label": "No", "description": ""}]}]
CHANNELS = ("task_changed", "task_ended", "task_activity", "question_answered", "question_settle")


def _heard(conn: psycopg.Connection, admin: psycopg.Connection, change: Callable[[], object]) -> list[str]:
    """The channels (of CHANNELS) one committed change (on `admin`) notified, in order: up to a marker notified
    after its commit (notifications arrive in commit order), so nothing late is missed and no wait is timed."""
    change()
    admin.execute("NOTIFY wake_probe")
    heard: list[str] = []
    for note in conn.notifies(timeout=30):
        if note.channel == "wake_probe":
            return heard
        heard.append(note.channel)
    raise AssertionError(f"the marker never came (heard {heard})")


@contextlib.contextmanager
def _listening(db: DB) -> Iterator[tuple[psycopg.Connection[Any], psycopg.Connection[Any]]]:
    """A connection listening on CHANNELS (and the marker), and one to change the store with."""
    with psycopg.connect(db.admin_dsn, autocommit=True) as listen, \
            psycopg.connect(db.admin_dsn, autocommit=True) as admin:
        for channel in (*CHANNELS, "wake_probe"):
            listen.execute(f"LISTEN {channel}")
        yield listen, admin


def test_an_activity_change_is_not_a_task_change_a_claim_is_not_an_end_and_an_end_is(db: DB) -> None:
    with _listening(db) as (listen, admin):
        session = tables.insert_thread(admin, role="worker", lifecycle="running")
        task = tables.insert_task(admin, session_id=session)
        # the claim: the page hears it, the loops that wait for ends do not
        def change(task_id: uuid.UUID, **values: object) -> Callable[[], None]:
            return lambda: tables.update(admin, "tasks", task_id, **values)

        assert _heard(listen, admin, change(task, status="running", started_at=tables.NOW)) == ["task_changed"]
        assert _heard(listen, admin, change(task, activity="awaiting_user")) == ["task_activity"]
        assert _heard(listen, admin, change(task, activity="running")) == ["task_activity"]
        assert _heard(listen, admin, change(task, activity="running")) == []
        assert _heard(listen, admin, change(task, status="success", activity=None, ended_at=tables.NOW)) \
            == ["task_ended"]
        # an end straight from pending (cancelled before any claim) is one too
        unclaimed = tables.insert_task(admin, session_id=session)
        assert _heard(listen, admin, change(unclaimed, status="cancelled", ended_at=tables.NOW)) == ["task_ended"]


def test_only_the_answers_the_settler_acts_on_wake_it(db: DB) -> None:
    with _listening(db) as (listen, admin):
        session = tables.insert_thread(admin, lifecycle="running")

        def question(kind: str) -> uuid.UUID:
            task = tables.insert_task(admin, session_id=session, status="pending")
            qid = tables.insert(admin, "questions", tool_use_id=f"{kind}-{task}", questions=Jsonb(QUESTIONS),
                                task_id=task)
            if kind in ("approvals", "escalations"):
                tables.insert(admin, kind, task_id=task, thread_id=session, question_id=qid)
            if kind == "late":
                tables.update(admin, "questions", qid, timed_out_at=tables.NOW)
            _heard(listen, admin, lambda: None)  # the asking's own notifications
            return qid

        def answer(qid: uuid.UUID) -> Callable[[], None]:
            return lambda: tables.answer(admin, qid, {"Go on?": "Yes"}, answered_by="user", answered_at=tables.NOW)

        # the negative control: a question its asking tool waits for wakes its waiter and the page, not the settler
        assert _heard(listen, admin, answer(question("model"))) == ["question_answered"]
        for kind in ("approvals", "escalations", "late"):
            assert _heard(listen, admin, answer(question(kind))) == ["question_answered", "question_settle"], kind
        asked = question("approvals")
        def cancel() -> None:
            tables.update(admin, "questions", asked, status="cancelled", response="dismissed")

        assert _heard(listen, admin, cancel) == ["question_answered", "question_settle"]


def _journal_notes(db: DB, batches: list[list[NewEvent]]) -> list[Notification]:
    """The `journal` notifications the journal's own append sends for each batch, as the executor receives them
    (from the journal writer's autocommit pool)."""
    async def append() -> None:
        async with AsyncConnectionPool(db.executor_dsn, min_size=1, max_size=1, open=False,
                                       kwargs={"autocommit": True}) as pool:
            for batch in batches:
                await journal.append(pool, batch)

    with psycopg.connect(db.admin_dsn, autocommit=True) as listen:
        listen.execute("LISTEN journal")
        asyncio.run(append())
        notes = [Notification(n.channel, n.payload) for n in listen.notifies(timeout=5, stop_after=len(batches))]
    assert len(notes) == len(batches)
    return notes


def test_the_notifier_is_woken_by_the_journal_only_for_a_record_it_may_notify_of(db: DB) -> None:
    with psycopg.connect(db.admin_dsn, autocommit=True) as admin:
        task = tables.insert_task(admin)
    def lines() -> list[NewEvent]:  # a record's own payload naming a notable type is not one
        return [NewEvent("stream.assistant", {"type": "assistant", "event_type": "task.exited"}, task_id=task)
                for _ in range(3)]
    big = [NewEvent("task.stderr", {"line": "x" * 3000}, task_id=task) for _ in range(4)]  # too big to carry
    notes = _journal_notes(db, [lines(), [*lines(), NewEvent("task.exited", {"status": "success"}, task_id=task)],
                                [NewEvent("question.asked", {"question_id": str(uuid.uuid4())})], big])
    assert [notifier.wants(n) for n in notes] == [False, True, True, True]
    assert " " not in notes[3].payload  # the head only: the notifier reads the rows itself
    # and the subscription queues only what it keeps (any other channel, and a resync, always)
    listener = Listener(db.executor_dsn, ["journal", "notify_queue"])
    sub = listener.subscribe(["journal", "notify_queue"], keep=notifier.wants)
    for note in [*notes, Notification("notify_queue", "1"), RESYNC]:
        listener._publish(note)
    queued = [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]
    assert queued == [*notes[1:], Notification("notify_queue", "1"), RESYNC]


def test_the_notable_records_are_those_the_notifier_reads() -> None:
    listed = re.search(r"event_type IN \(([^)]*)\)", executor_queries["list_notify_candidates"])
    assert listed is not None
    assert frozenset(re.findall(r"'([^']+)'", listed.group(1))) == notifier.NOTABLE
