"""A question waiting for its answer, among others being answered: no news for it is not a reason to
re-read it, and its progress notifications keep coming."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from executor.asks import CHANNELS, Asks
from executor.journal.writer import JournalWriter
from executor.sql import queries
from shared.database import Database
from shared.query import Queries
from tests import tables
from tests.pg import DB

QUESTIONS = [{"question": "Go on?", "header": "Go", "multiSelect": False,
              "options": [{"label": "Yes", "description": ""}, {"label": "No", "description": ""}]}]


class _Progress:
    """Stands in for the MCP request context: only what a wait uses of it."""

    def __init__(self) -> None:
        self.reports = 0

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        self.reports += 1


async def test_a_waiter_keeps_reporting_progress_while_other_questions_are_answered(db: DB) -> None:
    async with Database(db.executor_dsn, name="wait-test", max_size=4) as database:
        listener = database.listener(["question_answered"])
        listening = asyncio.create_task(listener.run())
        await asyncio.wait_for(listener.connected.wait(), 30)
        writer = JournalWriter(database.pool)
        await writer.start()
        asks = Asks(Queries(database.pool, queries), writer, listener, timeout_s=60, progress_interval_s=0.3)
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
        await writer.flush_and_stop()
        await listener.stop()
        listening.cancel()
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
    async with Database(db.executor_dsn, name="wait-test", max_size=4) as database:
        listener = database.listener(channels)
        listening = asyncio.create_task(listener.run())
        await asyncio.wait_for(listener.connected.wait(), 30)
        writer = JournalWriter(database.pool)
        await writer.start()
        q = _Counting(database.pool, queries)
        asks = Asks(q, writer, listener, timeout_s=60)
        mine = tables.ask(db.admin_dsn, QUESTIONS, tool_use_id=f"tool-{uuid.uuid4()}")
        sub = listener.subscribe(channels)
        waiting = asyncio.create_task(asks.wait(mine, sub, _Progress()))
        await asyncio.sleep(0.3)  # not a wait for anything: the waiter's first read, before the answer
        # written off the event loop: the waiter hears it meanwhile
        await asyncio.to_thread(tables.answer, db.admin_dsn, mine, {"Go on?": answer}, answered_by="travis")
        final = await asyncio.wait_for(waiting, 10)
        sub.close()
        await writer.flush_and_stop()
        await listener.stop()
        listening.cancel()
    return final, q.reads


async def test_the_answer_its_notification_carries_returns_without_reading_the_row_back(db: DB) -> None:
    final, reads = await _answered(db, CHANNELS, "Yes")
    assert (final.status, final.answers, final.answered_by, reads) == ("answered", {"Go on?": "Yes"}, "travis", 1)


async def test_an_answer_too_large_to_carry_and_a_listener_of_ids_alone_read_the_row(db: DB) -> None:
    big = "y" * 9000  # past NOTIFY's cap: only the id-only notification goes
    final, reads = await _answered(db, CHANNELS, big)
    assert (final.answers, reads) == ({"Go on?": big}, 2)
    final, reads = await _answered(db, ["question_answered"], "Yes")  # the control: without the carried row
    assert (final.answers, reads) == ({"Go on?": "Yes"}, 2)
