"""The executor's single ordered journal writer.

Every producer (stream readers, the supervisor, the watchdog) puts events to one writer; one task drains
whatever is waiting into a batch and appends it. One writer means the journal's order is the order events
were put, and batching keeps the per-line cost low under a flood.

While the database answers, the writer's memory is bounded and a producer that finds it full waits: that
back-pressure reaches the processes' pipes. While the database is away, producers never wait (a worker's
pipe must keep being read, or the worker blocks mid-run): what they put is held in memory up to the same
bound, then spilled to a file in the data directory, and journaled in the order it was put once the
database returns. A spill left by an executor that stopped during an outage is journaled at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from psycopg_pool import AsyncConnectionPool

from executor.journal import spill as journal_spill
from executor.journal.spill import SPILL_NAME, Spill
from shared import aio, database, errors, failover, journal, logs
from shared.journal import Appended
from shared.models import NewEvent
from shared.sql import queries as shared_queries

log = logs.get(__name__)

# Memory the writer may hold (an estimate from the events' JSON sizes) before producers wait or, while the
# database is away, before what they put goes to the spill file.
HOLD_BYTES = 32 * 1024 * 1024
MAX_BATCH = 5_000
# While the database answers, producers also wait once this many events are held: the batch being appended
# and a full next one. Reading further ahead buys nothing under a flood (the database is the bottleneck) and
# costs the appends their pace: readers parsing ahead keep the event loop busy between an append's round
# trips, and the database idles meanwhile. Waiting leaves the lines in the processes' pipes instead.
HOLD_BATCHES = 2
# How long a stop during an outage waits for the database before leaving the rest in the spill file.
STOP_FLUSH_TIMEOUT_S = 10.0
# An append that has not come back after this long means the database is away (an append normally takes
# milliseconds; waiting out the pool's own timeouts first would block the workers' pipes meanwhile).
STUCK_AFTER_S = 2.0
# How often a producer waiting for room looks again whether the database went away meanwhile.
ROOM_RECHECK_S = 0.5
# The size counted for an event without ready JSON text (the supervisor's own small records).
_SMALL_EVENT_BYTES = 256
# an append failing with these is held and retried (a refused batch is not)
_RETRYABLE: tuple[type[Exception], ...] = (errors.JournalWriteError, *database.OUTAGE_ERRORS)

_Item = journal_spill.Item


def _said_if_failed(task: asyncio.Task[None]) -> None:
    """The writer task ended with an error (nothing else watches it: its producers wait, the stop reads it)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("journal_writer_failed", exc_info=exc)


def _size(events: Sequence[NewEvent]) -> int:
    return sum(_event_size(e) for e in events) + 1


def _event_size(e: NewEvent) -> int:
    """What an event weighs in the hold: its text as printed; a stderr or unparsed stdout line (the spawn's, kept
    as `{"line": …}`, up to 64 MiB) its line's length; the executor's own records, small."""
    if e.payload_json is not None:
        return len(e.payload_json)
    line = e.payload.get("line") if isinstance(e.payload, dict) else None
    return _SMALL_EVENT_BYTES + (len(line) if isinstance(line, str) else 0)


@dataclass
class HoldStats:
    """What the writer holds now and has held (for the log and the tests)."""

    holding: bool
    held_events: int
    held_bytes: int
    spilled_events: int
    spill_path: str | None


class Fence(Protocol):
    """The executor's lease (executor/run/fleet.py): False once another executor took this run over."""

    async def confirm(self) -> bool: ...


class Fenced(errors.PetalError):
    """This executor's run was taken over: its journal lines are dropped, never appended."""


class JournalWriter:
    def __init__(self, pool: AsyncConnectionPool, *, spill_dir: Path | None = None, hold_bytes: int = HOLD_BYTES,
                 max_batch: int = MAX_BATCH):
        self._pool = pool
        self._availability = database.availability(pool)
        # what this process saw committed: a server found without it after a failover is caught (failover.py)
        self._seq_mark = failover.seq_mark(pool)
        self._mem: deque[_Item] = deque()
        self._mem_bytes = 0
        self._mem_events = 0
        self._hold_bytes = hold_bytes
        self._hold_events = HOLD_BATCHES * max_batch
        self._max_batch = max_batch
        self._spill = Spill(spill_dir / SPILL_NAME) if spill_dir is not None else None
        self._work = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._known_types: set[tuple[str, str]] = set()
        self._task: asyncio.Task[None] | None = None
        self._in_flight: list[_Item] = []
        self._in_flight_from_mem = False
        self._append_started: float | None = None
        # True while the database is away: producers never wait then
        self.holding = False
        self.appended = 0
        self.dropped = 0
        # checked before each batch: a fenced run's lines never follow the end a survivor wrote for it
        self.fence: Fence | None = None

    # ---- producers -------------------------------------------------------------------------------

    async def put(self, event: NewEvent) -> None:
        await self._put((event,), None)

    async def put_many(self, events: Sequence[NewEvent]) -> None:
        """Queue events in order (one item for all of them)."""
        await self._put(events, None)

    async def write(self, events: Sequence[NewEvent]) -> Appended:
        """Queue events and wait until they are durable (during an outage: until the database returns)."""
        fut: asyncio.Future[Appended] = asyncio.get_running_loop().create_future()
        await self._put(events, fut)
        return await fut

    async def _put(self, events: Sequence[NewEvent], fut: asyncio.Future[Appended] | None) -> None:
        # Waiting for room is back-pressure, for a database that is there but slower than the producers;
        # while it is away, or once anything was spilled (order), the item goes to the spill instead.
        # A spill still draining after an outage is bounded the same way while the database is there.
        while not self._has_room():
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), ROOM_RECHECK_S)
        if self._spill is not None and (self._spill.active or self._mem_bytes >= self._hold_bytes):
            self._spill.append(events, fut)
        else:
            if self._away():
                # stamped now: a line read during an outage keeps the time it was printed
                now = datetime.now(UTC)
                events = [e if e.created_at is not None else replace(e, created_at=now) for e in events]
            self._mem.append((events, fut))
            self._mem_bytes += _size(events)
            self._mem_events += len(events)
        self._idle.clear()
        self._work.set()

    def _has_room(self) -> bool:
        spill = self._spill
        if spill is not None and spill.active:
            return self._away() or spill.backlog_bytes < self._hold_bytes
        return (self._mem_bytes < self._hold_bytes and self._mem_events < self._hold_events) or (
            spill is not None and self._away())

    def _away(self) -> bool:
        """Whether the database is away: an append failed, or is taking far longer than an append takes.
        (Until the next append succeeds: the writer's own evidence, not another loop's passing error.)"""
        if not self.holding and self._append_started is not None and (
                time.monotonic() - self._append_started > STUCK_AFTER_S):
            self._hold(self._availability.cause or "an append is taking too long")
        return self.holding

    def stats(self) -> HoldStats:
        spill = self._spill
        return HoldStats(self.holding, self._mem_events, self._mem_bytes, spill.events if spill else 0,
                         str(spill.path) if spill else None)

    # ---- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._spill is not None and (left := self._spill.recover()):
            log.warning("journal_spill_recovered", path=str(self._spill.path), items=left,
                        note="an earlier executor stopped during an outage; journaling what it held")
        # Known types up front, so the first lines of a run don't each wait on a registration.
        async def load() -> set[tuple[str, str]]:
            async with self._pool.connection() as conn:
                cur = await conn.execute(shared_queries["list_event_types"])
                return {(name, tier) for name, tier in await cur.fetchall()}

        self._known_types = await self._availability.retry(load, "journal_writer")
        if self._spill is not None and self._spill.active:
            self._work.set()
            self._idle.clear()
        self._task = asyncio.create_task(self._run(), name="journal-writer")
        self._task.add_done_callback(_said_if_failed)

    async def drain(self) -> None:
        """Wait until everything queued so far is written (or dropped)."""
        if self._task is not None:
            await self._idle.wait()

    async def flush_and_stop(self, timeout_s: float = STOP_FLUSH_TIMEOUT_S) -> None:
        """Write what is held, then stop. If the database stays away, what is left goes to the spill file
        (journaled at the next start) rather than being lost."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        await aio.cancel_and_wait(self._task)
        self._task = None
        # what the writer was retrying when stopped (unless it came from the spill, which still has it)
        left = (self._in_flight if self._in_flight_from_mem else []) + list(self._mem)
        self._mem.clear()
        if self._spill is not None:
            failed = [*left, *self._spill.abandon_futures()]
            if left:
                self._spill.keep_first(left)
            if self._spill.active:
                log.warning("journal_left_in_spill", path=str(self._spill.path), items=self._spill.written,
                            note="the database did not return in time; the next start journals these first")
            self._spill.close()
        else:
            failed = left
            if left:
                log.error("journal_unwritten", events=sum(len(e) for e, _ in left))
        for _, fut in failed:
            if fut is not None and not fut.done():
                fut.set_exception(errors.JournalWriteError("the executor stopped before the database returned"))

    # ---- the writer task -----------------------------------------------------------------------------

    def _take(self) -> tuple[list[_Item], int | None]:
        """The next batch in put order: memory first (it is older than anything spilled), then the spill."""
        if self._mem:
            items = [self._mem.popleft()]
            size = len(items[0][0])
            while size < self._max_batch and self._mem:
                item = self._mem.popleft()
                items.append(item)
                size += len(item[0])
            return items, None
        if self._spill is not None and self._spill.active:
            return self._spill.take(self._max_batch)
        return [], None

    async def _run(self) -> None:
        while True:
            items, spill_offset = self._take()
            if not items:
                self._idle.set()
                self._work.clear()
                await self._work.wait()
                continue
            self._in_flight, self._in_flight_from_mem = items, spill_offset is None
            await self._write_items(items)
            self._in_flight = []
            if spill_offset is not None:
                assert self._spill is not None
                self._spill.consumed(len(items), spill_offset)
                self._room.set()
            else:
                for events, _ in items:
                    self._mem_bytes -= _size(events)
                    self._mem_events -= len(events)
                if not self._mem:
                    self._room.set()
                # else the next batch wakes the producers once it is on its way (its append's on_sent, or
                # its end): woken now, they would crowd the event loop through its first round trips

    async def _register_new_types(self, batch: list[NewEvent]) -> None:
        # Stream line types are an open set: a type the CLI starts printing is registered, not dropped.
        for pair in {(e.event_type, e.tier) for e in batch} - self._known_types:
            if pair[0].startswith("stream."):
                await journal.register_event_type(self._pool, pair[0], pair[1],
                                                  "stream-json line type seen first at run time")
            self._known_types.add(pair)

    async def _append(self, batch: list[NewEvent]) -> Appended:
        retried = False
        self._append_started = time.monotonic()
        while True:
            try:
                if self.fence is not None and not await self.fence.confirm():
                    raise Fenced("this executor was taken over: its run's journal lines are dropped")
                await self._register_new_types(batch)
                # after a failed attempt the batch may have committed unseen: append recognises it
                appended = await journal.append(self._pool, batch, retried=retried, on_sent=self._room.set)
            except (errors.JournalRefused, Fenced):
                self._append_started = None
                self._room.set()
                raise
            except _RETRYABLE as exc:
                retried = True
                cause = exc.__cause__ if isinstance(exc, errors.JournalWriteError) and exc.__cause__ else exc
                self._hold(cause)
                await self._availability.pause(cause, "journal_writer")
                continue
            self._append_started = None
            self._seq_mark.saw(appended.last_seq)
            if self.holding:
                self._release()
            self._availability.succeeded()
            return appended

    def _hold(self, cause: BaseException | str) -> None:
        if self.holding:
            return
        self.holding = True
        self._room.set()  # producers waiting for room go to the spill now
        log.warning("journal_holding", error=str(cause).strip()[:200],
                    note="the database is away: lines are held in memory, then spilled, and journaled in order "
                         "when it returns")

    def _release(self) -> None:
        self.holding = False
        stats = self.stats()
        log.warning("journal_released", held_events=stats.held_events, spilled_events=stats.spilled_events)

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

