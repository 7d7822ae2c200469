"""The threads loop's decisions (executor/settle/threads.py) on the fake query layer: a thread control applied,
and what a thread with chat waiting is owed — a failure said where the user sees it, a wait for the boundary, a
reply that answers its question."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, cast

import pytest
from psycopg_pool import AsyncConnectionPool

from executor.journal.writer import JournalWriter
from executor.settle import threads as threads_module
from executor.settle.thread_store import PendingThread, ThreadControl, ThreadStore
from executor.settle.threads import Threads
from shared.listener import Listener
from shared.models import NewEvent
from tests.fake_queries import FakeWork

THREAD = uuid.uuid4()


class _Writer:
    def __init__(self) -> None:
        self.put_events: list[NewEvent] = []

    async def put(self, event: NewEvent) -> None:
        self.put_events.append(event)


def loop(answers: dict[str, Any]) -> tuple[Threads, FakeWork, _Writer]:
    writer = _Writer()
    threads = Threads(AsyncConnectionPool("postgresql://unused", open=False), cast(JournalWriter, writer))
    unit = FakeWork(answers)
    threads.store = ThreadStore(unit)
    return threads, unit, writer


def control(action: str, **args: Any) -> ThreadControl:
    return ThreadControl(id=uuid.uuid4(), thread_id=THREAD, action=action, args=args)


@pytest.mark.parametrize(("action", "args", "changes", "event"), [
    ("rename", {"title": "Plans"}, {"title": "Plans", "mode": None, "archive": False}, "thread.renamed"),
    ("set_mode", {"mode": "autonomous"}, {"title": None, "mode": "autonomous", "archive": False}, "thread.mode_changed"),
    ("archive", {}, {"title": None, "mode": None, "archive": True}, "thread.archived"),
])
async def test_a_control_changes_the_thread_and_journals_what_it_did(
        action: str, args: dict[str, Any], changes: dict[str, Any], event: str) -> None:
    threads, unit, writer = loop({"update_thread": {"id": THREAD}})
    assert await threads._apply(control(action, **args)) == ("done", None)
    assert unit.params("update_thread") == {"id": THREAD, **changes}
    (put,) = writer.put_events
    assert put.event_type == event and put.session_id == THREAD and put.payload == args


async def test_a_control_for_a_thread_that_does_not_exist_fails_with_the_reason() -> None:
    threads, _, writer = loop({"update_thread": None})
    assert await threads._apply(control("rename", title="x")) == ("failed", f"no thread {THREAD}")
    assert writer.put_events == []


async def test_a_thread_is_created_once() -> None:
    threads, unit, writer = loop({"create_thread": {"id": THREAD}})
    assert await threads._apply(control("create", title="New")) == ("done", None)
    assert unit.params("create_thread") == {"id": THREAD, "title": "New", "mode": "interactive", "project_id": None}
    assert [e.event_type for e in writer.put_events] == ["thread.created"]
    again, _, writer = loop({"create_thread": None})
    assert await again._apply(control("create", title="New")) == ("done", None) and writer.put_events == []


async def test_a_retry_names_a_turn() -> None:
    threads, unit, _ = loop({})
    assert await threads._apply(control("retry", task_id="not-an-id")) == ("failed", "no turn 'not-an-id'")
    assert unit.names() == []


def pending(**kw: Any) -> PendingThread:
    base: dict[str, Any] = {"thread_id": THREAD, "found": True, "lifecycle": "idle", "project_id": None,
                            "executor_name": None, "adopted": False, "turn_open": False, "controls_pending": False,
                            "blocked_question": None, "terminal_executor": None}
    return PendingThread(**{**base, **kw})


@pytest.mark.parametrize(("thread", "answers", "failed"), [
    (pending(lifecycle="archived"), {}, "the thread is archived"),
    (pending(found=False), {"check_thread_create_pending": None}, f"no thread {THREAD}"),
])
async def test_chat_no_turn_can_carry_fails_where_the_user_sees_it(
        thread: PendingThread, answers: dict[str, Any], failed: str) -> None:
    threads, unit, _ = loop({**answers, "fail_pending_chat": 1})
    await threads._deliver_thread(thread)
    assert unit.params("fail_pending_chat") == {"thread_id": THREAD, "error": failed}


@pytest.mark.parametrize("thread", [
    pending(found=False),  # its create is still queued
    pending(controls_pending=True),  # a rename or mode change queued before the messages applies first
    pending(turn_open=True),  # delivered at the boundary
])
async def test_chat_waits_while_something_comes_first(thread: PendingThread) -> None:
    threads, unit, writer = loop({"check_thread_create_pending": {"holds": True}})
    await threads._deliver_thread(thread)
    assert set(unit.names()) <= {"check_thread_create_pending"} and writer.put_events == []


async def test_a_message_while_the_turn_waits_on_a_question_answers_it() -> None:
    question = uuid.uuid4()
    threads, unit, _ = loop({})
    answered: list[tuple[uuid.UUID, uuid.UUID]] = []

    async def answer_with_chat(thread_id: uuid.UUID, question_id: uuid.UUID) -> None:
        answered.append((thread_id, question_id))

    threads._answer_with_chat = answer_with_chat  # type: ignore[method-assign]
    await threads._deliver_thread(pending(blocked_question=question))
    assert answered == [(THREAD, question)] and unit.names() == []


async def test_a_settled_turn_end_wakes_the_loop_at_once_and_every_pass_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # a turn's boundary sends no NOTIFY of its own: the settler's wake is what sends the waiting messages
    monkeypatch.setattr(threads_module, "POLL_S", 3600.0)  # no poll within the test: only the wake runs them
    threads, _, _ = loop({})
    runs: list[str] = []
    ran = asyncio.Event()

    def recorded(name: str) -> Any:
        async def run() -> None:
            runs.append(name)
            ran.set()
        return run
    monkeypatch.setattr(threads, "apply_controls", recorded("apply_controls"))
    monkeypatch.setattr(threads, "deliver", recorded("deliver"))

    async def after(count: int) -> list[str]:
        async with asyncio.timeout(5):
            while len(runs) < count:
                ran.clear()
                await ran.wait()
        return list(runs)
    channels = ["chat_queue", "thread_control_queue"]
    running = asyncio.create_task(threads.run(Listener("postgresql://unused", channels).subscribe(channels)))
    try:
        assert await after(2) == ["apply_controls", "deliver"]  # the first round
        threads.wake()
        assert await after(4) == ["apply_controls", "deliver"] * 2
    finally:
        running.cancel()
