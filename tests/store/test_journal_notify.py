"""A batch large enough to go by COPY announces itself once, with its last seq, and only if it commits."""

from __future__ import annotations

import asyncio

import pytest
from psycopg_pool import AsyncConnectionPool

from shared import errors, journal
from shared.database import Database
from shared.models import NewEvent


async def test_a_copied_batch_notifies_once_with_its_last_seq_and_a_refused_one_not_at_all(
    executor_db: Database, pool: AsyncConnectionPool
) -> None:
    big = journal.SMALL_BATCH + 36
    listener = executor_db.listener(["journal"])
    sub = listener.subscribe(["journal"])
    runner = asyncio.create_task(listener.run())
    try:
        assert (await asyncio.wait_for(sub.get(), 10)).payload == "resync"
        await journal.append(pool, [NewEvent("task.stderr", {"i": i}) for i in range(big)])
        with pytest.raises(errors.UnknownEventType):
            await journal.append(pool, [NewEvent("no.such_type", {"i": i}) for i in range(big)])
        await journal.append(pool, [NewEvent("task.stderr", {"i": i}) for i in range(big)])
        notes = [await asyncio.wait_for(sub.get(), 10) for _ in range(2)]
        await asyncio.sleep(0.2)  # a window in which no third notification may arrive (the refused batch's)
    finally:
        runner.cancel()
    assert [n.payload for n in notes] == [str(big), str(2 * big)]
    assert sub.queue.empty()
