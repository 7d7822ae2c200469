"""A question waiting for its answer, among others being answered: no news for it is not a reason to
re-read it, and its progress notifications keep coming; a call under another task's question id asks its own."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from executor.asks import CHANNELS, Asks
from executor.journal.writer import JournalWriter
from executor.run.caller import Caller
from executor.sql import queries
from shared.database import Database
from shared.listener import Listener
from shared.query import Queries
from tests import tables
from tests.pg import DB
from tests.wait import until

QUESTIONS = [{"question": "Go on?", "header": "Go", "multiSelect": False,
              "options": [{"label": "Yes", "description": ""}, {"label": "No", "description": ""}]}]


@asynccontextmanager
async def _running(db: DB, channels: list[str], make: Callable[[Any], Queries] = lambda pool: Queries(pool, queries),
                   **kw: Any) -> AsyncIterator[tuple[Asks, Listener]]:
    """The executor's asks over a listener and a journal writer of their own, stopped after."""
    async with Database(db.executor_dsn, name="wait-test", max_size=4) as database:
        listener = database.listener(channels)
        listening = asyncio.create_task(listener.run())
        await asyncio.wait_for(listener.connected.wait(), 30)
        writer = JournalWriter(database.pool)
        await writer.start()
        try:
            yield Asks(make(database.pool), writer, listener, **{"timeout_s": 60, **kw}), listener
        finally:
            await writer.flush_and_stop()
            await listener.stop()
            listening.cancel()


class _Progress:
    """Stands in for the MCP request context: only what a wait uses of it."""

    def __init__(self) -> None:
        self.reports = 0

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        self.reports += 1


async def test_a_waiter_keeps_reporting_progress_while_other_questions_are_answered(db: DB) -> None:
    async with _running(db, ["question_answered"], progress_interval_s=0.3) as (asks, listener):
        ctx = _Progress()
        mine = tables.ask(db.admin_dsn, QUESTIONS, tool_use_id="tool-mine")
        sub = listener.subscribe(["question_answered"])
        waiting = asyncio.create_task(asks.wait(mine, sub, ctx))
        # another question answered every 0.1 s for 1.5 s: never a quiet 0.3 s for this waiter (each write off
        # the event loop: the waiter goes on meanwhile)
        for _ in range(15):
            other = await asyncio.to_thread(tables.ask, db.admin_dsn, QUESTIONS, tool_use_id=f"other-{uuid.uuid4()}")
            await asyncio.to_thread(tables.answer, db.admin_dsn, other, {"Go on?": "No"})
            await asyncio.sleep(0.1)  # not a wait: the pace of the other answers
        assert not waiting.done()
        # answered_by: as the ingress answers (an answer without it is not the user's)
        await asyncio.to_thread(tables.answer, db.admin_dsn, mine, {"Go on?": "Yes"}, answered_by="travis")
        final = await asyncio.wait_for(waiting, 10)
        sub.close()
    assert final.answers == {"Go on?": "Yes"}
    assert ctx.reports >= 3  # about one per 0.3 s of the 1.5 s


class _Counting(Queries):
    """The executor's queries, counting the waiter's reads of the row."""

    reads = 0

    async def one(self, name: str, *args: Any, **kw: Any) -> Any:
        if name == "get_question":
            self.reads += 1
        return await super().one(name, *args, **kw)


async def _answered(db: DB, channels: list[str], answer: str) -> tuple[Any, int]:
    counted: list[_Counting] = []

    def make(pool: Any) -> Queries:
        counted.append(_Counting(pool, queries))
        return counted[0]

    async with _running(db, channels, make) as (asks, listener):
        mine = tables.ask(db.admin_dsn, QUESTIONS, tool_use_id=f"tool-{uuid.uuid4()}")
        sub = listener.subscribe(channels)
        waiting = asyncio.create_task(asks.wait(mine, sub, _Progress()))
        await asyncio.sleep(0.3)  # not a wait for anything: the waiter's first read, before the answer
        # written off the event loop: the waiter hears it meanwhile
        await asyncio.to_thread(tables.answer, db.admin_dsn, mine, {"Go on?": answer}, answered_by="travis")
        final = await asyncio.wait_for(waiting, 10)
        sub.close()
    return final, counted[0].reads


async def test_the_answer_its_notification_carries_returns_without_reading_the_row_back(db: DB) -> None:
    final, reads = await _answered(db, CHANNELS, "Yes")
    assert (final.status, final.answers, final.answered_by, reads) == ("answered", {"Go on?": "Yes"}, "travis", 1)


async def test_an_answer_too_large_to_carry_and_a_listener_of_ids_alone_read_the_row(db: DB) -> None:
    big = "y" * 9000  # past NOTIFY's cap: only the id-only notification goes
    final, reads = await _answered(db, CHANNELS, big)
    assert (final.answers, reads) == ({"Go on?": big}, 2)
    final, reads = await _answered(db, ["question_answered"], "Yes")  # the control: without the carried row
    assert (final.answers, reads) == ({"Go on?": "Yes"}, 2)


async def test_a_call_under_another_tasks_question_id_asks_its_own_question_and_never_joins_that_one(db: DB) -> None:
    # the tool call's id is the caller's word (a process in its sandbox can call the harness itself) and question
    # ids are unique across threads: another task's row under it is never joined, its answers never read
    theirs = tables.ask(db.admin_dsn, QUESTIONS, tool_use_id="toolu_shared",
                        task_id=tables.insert_task(db.admin_dsn, brief="theirs", status="running"))
    mine = tables.insert_task(db.admin_dsn, brief="mine", status="running")
    caller = Caller(task_id=mine, session_id=uuid.uuid4(), thread_id=None, project_id=None, role="worker")
    async with _running(db, CHANNELS) as (asks, _):
        asking = asyncio.create_task(asks.ask(QUESTIONS, tool_use_id="toolu_shared", caller=caller,
                                              progress=_Progress()))
        own = await until(lambda: tables.rows(db.admin_dsn, "questions", "id", "tool_use_id", task_id=mine),
                          "the caller's own question", 20)
        await asyncio.to_thread(tables.answer, db.admin_dsn, own[0][0], {"Go on?": "Yes"}, answered_by="travis")
        final = await asyncio.wait_for(asking, 10)
    assert own[0][0] != theirs and own[0][1].startswith("mcp-")
    assert final.answers == {"Go on?": "Yes"}
    assert tables.row(db.admin_dsn, "questions", theirs, "status", "answers") == ("pending", None)
