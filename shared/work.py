"""A unit of work: named queries in one transaction, and the journal records they give rise to.

    async with work(q) as w:
        await w.execute("…", {...})
        w.emit(NewEvent("…", {...}))

What is emitted is appended to the journal inside the same transaction when the block ends, so the rows
and their records commit together or not at all. The append comes last on purpose: it holds the journal
head's lock until the commit, so the transaction holds it as briefly as it can.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg

from shared import journal
from shared.models import NewEvent
from shared.query import Queries, Registry, Transaction


class Work(Transaction):
    """A transaction that also collects the records to journal with it (`emit`)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], registry: Registry):
        super().__init__(conn, registry)
        self.events: list[NewEvent] = []

    def emit(self, *events: NewEvent) -> None:
        """Journal these records with this transaction, after those emitted before them."""
        self.events.extend(events)

    def take(self) -> list[NewEvent]:
        """The records emitted so far, for a caller that journals them itself among its own (a transaction
        opened before it was a `Work`); they are not appended again."""
        taken, self.events = self.events, []
        return taken

    async def append(self) -> None:
        """Append what was emitted, inside this transaction (the end of `work` does it)."""
        if self.events:
            await journal.append_on(self.conn, self.take())


@asynccontextmanager
async def work(q: Queries, *, pipelined: bool = False) -> AsyncIterator[Work]:
    """One unit of work over `q`'s pool and registry: committed with its records when the block ends,
    rolled back (records and all) when it raises (`pipelined`: Queries.transaction's)."""
    async with q.transaction(pipelined=pipelined) as tx:
        unit = Work(tx.conn, q.registry)
        yield unit
        await unit.append()
