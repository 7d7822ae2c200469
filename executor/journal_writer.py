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

from psycopg_pool import AsyncConnectionPool

from shared import errors, journal, logs
from shared.journal import Appended
from shared.models import NewEvent

log = logs.get(__name__)

QUEUE_SIZE = 20_000
MAX_BATCH = 2_000
# While the database is away the writer keeps the batch and tries again: the journal loses nothing.
RETRY_DELAY_S = 1.0


class JournalWriter:
    def __init__(self, pool: AsyncConnectionPool, *, queue_size: int = QUEUE_SIZE, max_batch: int = MAX_BATCH):
        self._pool = pool
        self._queue: asyncio.Queue[tuple[NewEvent, asyncio.Future[Appended] | None]] = asyncio.Queue(queue_size)
        self._max_batch = max_batch
        self._known_types: set[tuple[str, str]] = set()
        self._task: asyncio.Task[None] | None = None
        self.appended = 0

    async def put(self, event: NewEvent) -> None:
        await self._queue.put((event, None))

    async def write(self, events: Sequence[NewEvent]) -> Appended:
        """Put events and wait until they are durable; returns the last one's seqs."""
        loop = asyncio.get_running_loop()
        futures = []
        for ev in events:
            fut: asyncio.Future[Appended] = loop.create_future()
            futures.append(fut)
            await self._queue.put((ev, fut))
        results = await asyncio.gather(*futures)
        return Appended(first_seq=results[0].first_seq, last_seq=results[-1].last_seq)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="journal-writer")

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
                await journal.register_event_type(self._pool, pair[0], pair[1], "stream-json line type seen first at run time")
            self._known_types.add(pair)

    async def _append(self, batch: list[NewEvent]) -> Appended:
        while True:
            try:
                await self._register_new_types(batch)
                return await journal.append(self._pool, batch)
            except errors.UnknownEventType:
                raise
            except Exception as exc:  # noqa: BLE001 - the writer must outlive any database trouble
                log.warning("journal_writer_retry", error=str(exc), batch=len(batch))
                await asyncio.sleep(RETRY_DELAY_S)

    async def _run(self) -> None:
        while True:
            first = await self._queue.get()
            items = [first]
            while len(items) < self._max_batch and not self._queue.empty():
                items.append(self._queue.get_nowait())
            try:
                await self._write_items(items)
            finally:
                for _ in items:
                    self._queue.task_done()

    async def _write_items(self, items: list[tuple[NewEvent, asyncio.Future[Appended] | None]]) -> None:
        try:
            appended = await self._append([ev for ev, _ in items])
        except errors.UnknownEventType as exc:
            # A programming error in one event must not cost the others their place in the journal.
            log.error("journal_writer_refused", error=str(exc))
            bad = set(exc.pairs)
            for ev, fut in items:
                if (ev.event_type, ev.tier) in bad and fut is not None and not fut.done():
                    fut.set_exception(exc)
            rest = [(ev, fut) for ev, fut in items if (ev.event_type, ev.tier) not in bad]
            if rest:
                await self._write_items(rest)
            return
        self.appended += len(items)
        for i, (_, fut) in enumerate(items):
            if fut is not None and not fut.done():
                seq = appended.first_seq + i
                fut.set_result(Appended(seq, seq))
