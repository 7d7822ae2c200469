"""The executor's single ordered journal writer.

Every producer (stream readers, the supervisor, the watchdog) puts events on one queue; one task
drains whatever is waiting into a batch and appends it. One writer means the journal's order is the
order events were put, and batching keeps the per-line cost low under a flood. The queue is bounded:
when the database is slow, producers wait, and that back-pressure reaches the processes' pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Protocol

from psycopg_pool import AsyncConnectionPool

from shared import errors, journal, logs
from shared.journal import Appended
from shared.models import NewEvent

log = logs.get(__name__)

# Bounded in puts: a reader puts one read's lines at a time.
QUEUE_SIZE = 2_000
MAX_BATCH = 5_000
# While the database is away the writer keeps the batch and tries again: the journal loses nothing.
RETRY_DELAY_S = 1.0

_Item = tuple[Sequence[NewEvent], "asyncio.Future[Appended] | None"]


class Fence(Protocol):
    """The executor's lease (executor/fleet.py): False once another executor took this run over."""

    async def confirm(self) -> bool: ...


class Fenced(errors.PetalError):
    """This executor's run was taken over: its journal lines are dropped, never appended."""


class JournalWriter:
    def __init__(self, pool: AsyncConnectionPool, *, queue_size: int = QUEUE_SIZE, max_batch: int = MAX_BATCH):
        self._pool = pool
        self._queue: asyncio.Queue[_Item] = asyncio.Queue(queue_size)
        self._max_batch = max_batch
        self._known_types: set[tuple[str, str]] = set()
        self._task: asyncio.Task[None] | None = None
        self.appended = 0
        self.dropped = 0
        # checked before each batch: a fenced run's lines never follow the end a survivor wrote for it
        self.fence: Fence | None = None

    async def put(self, event: NewEvent) -> None:
        await self._queue.put(((event,), None))

    async def put_many(self, events: Sequence[NewEvent]) -> None:
        """Queue events in order (one queue slot for all of them)."""
        await self._queue.put((events, None))

    async def write(self, events: Sequence[NewEvent]) -> Appended:
        """Queue events and wait until they are durable."""
        fut: asyncio.Future[Appended] = asyncio.get_running_loop().create_future()
        await self._queue.put((events, fut))
        return await fut

    async def start(self) -> None:
        # Known types up front, so the first lines of a run don't each wait on a registration.
        async with self._pool.connection() as conn:
            cur = await conn.execute(journal.queries["event_types"])
            self._known_types = {(name, tier) for name, tier in await cur.fetchall()}
        self._task = asyncio.create_task(self._run(), name="journal-writer")

    async def drain(self) -> None:
        """Wait until everything queued so far is written (or dropped)."""
        if self._task is not None:
            await self._queue.join()

    async def flush_and_stop(self) -> None:
        """Write what is queued, then stop."""
        if self._task is None:
            return
        await self._queue.join()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _register_new_types(self, batch: list[NewEvent]) -> None:
        # Stream line types are an open set: a type the CLI starts printing is registered, not dropped.
        for pair in {(e.event_type, e.tier) for e in batch} - self._known_types:
            if pair[0].startswith("stream."):
                await journal.register_event_type(self._pool, pair[0], pair[1],
                                                  "stream-json line type seen first at run time")
            self._known_types.add(pair)

    async def _append(self, batch: list[NewEvent]) -> Appended:
        while True:
            try:
                if self.fence is not None and not await self.fence.confirm():
                    raise Fenced("this executor was taken over: its run's journal lines are dropped")
                await self._register_new_types(batch)
                return await journal.append(self._pool, batch)
            except (errors.JournalRefused, Fenced):
                raise
            except Exception as exc:  # noqa: BLE001 - the writer must outlive any database trouble
                log.warning("journal_writer_retry", error=str(exc), batch=len(batch))
                await asyncio.sleep(RETRY_DELAY_S)

    async def _run(self) -> None:
        while True:
            items = [await self._queue.get()]
            size = len(items[0][0])
            while size < self._max_batch and not self._queue.empty():
                item = self._queue.get_nowait()
                items.append(item)
                size += len(item[0])
            try:
                await self._write_items(items)
            finally:
                for _ in items:
                    self._queue.task_done()

    async def _write_items(self, items: list[_Item]) -> None:
        batch = [ev for events, _ in items for ev in events]
        if not batch:
            self._settle(items, None)
            return
        try:
            appended = await self._append(batch)
        except Fenced as exc:
            self.dropped += len(batch)
            log.warning("journal_writer_fenced", dropped=len(batch))
            self._settle(items, exc)
            return
        except errors.JournalRefused as exc:
            # One bad event (a programming error) must not cost the others their place: split until
            # the refused events are alone, write the rest in order, and fail only the refused ones.
            if len(batch) == 1:
                log.error("journal_writer_refused", error=str(exc), event_type=batch[0].event_type)
                self._settle(items, exc)
                return
            if len(items) == 1:
                events, fut = items[0]
                half = len(events) // 2
                items = [(events[:half], None), (events[half:], fut)]
            half = len(items) // 2
            await self._write_items(items[:half])
            await self._write_items(items[half:])
            return
        self.appended += len(batch)
        self._settle(items, appended)

    @staticmethod
    def _settle(items: list[_Item], outcome: Appended | BaseException | None) -> None:
        for _, fut in items:
            if fut is None or fut.done():
                continue
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome or Appended(0, 0))
