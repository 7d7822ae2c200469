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
import json
import os
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool

from shared import database, errors, journal, logs
from shared.journal import Appended
from shared.models import NewEvent

log = logs.get(__name__)

# Memory the writer may hold (an estimate from the events' JSON sizes) before producers wait or, while the
# database is away, before what they put goes to the spill file.
HOLD_BYTES = 32 * 1024 * 1024
MAX_BATCH = 5_000
# How long a stop during an outage waits for the database before leaving the rest in the spill file.
STOP_FLUSH_TIMEOUT_S = 10.0
# An append that has not come back after this long means the database is away (an append normally takes
# milliseconds; waiting out the pool's own timeouts first would block the workers' pipes meanwhile).
STUCK_AFTER_S = 2.0
# How often a producer waiting for room looks again whether the database went away meanwhile.
ROOM_RECHECK_S = 0.5
SPILL_NAME = "journal-spill.jsonl"
# The size counted for an event without ready JSON text (the supervisor's own small records).
_SMALL_EVENT_BYTES = 256

_Item = tuple[Sequence[NewEvent], "asyncio.Future[Appended] | None"]


def _size(events: Sequence[NewEvent]) -> int:
    return sum(len(e.payload_json) if e.payload_json is not None else _SMALL_EVENT_BYTES for e in events) + 1


def _opt_uuid(value: str | None) -> uuid.UUID | None:
    return uuid.UUID(value) if value else None


def _encode(events: Sequence[NewEvent], stamp: datetime) -> str:
    return json.dumps([{
        "event_id": str(e.event_id), "event_type": e.event_type, "tier": e.tier,
        "project_id": str(e.project_id) if e.project_id else None,
        "session_id": str(e.session_id) if e.session_id else None,
        "task_id": str(e.task_id) if e.task_id else None,
        "parent_id": str(e.parent_id) if e.parent_id else None,
        "message_id": str(e.message_id) if e.message_id else None,
        # the time it was put, not the time the database came back
        "created_at": (e.created_at or stamp).isoformat(),
        "payload_json": e.payload_json if e.payload_json is not None else journal.encode_payload(e.payload),
    } for e in events], ensure_ascii=False)


def _decode(line: str) -> list[NewEvent]:
    return [NewEvent(
        d["event_type"], json.loads(d["payload_json"]), tier=d["tier"], project_id=_opt_uuid(d["project_id"]),
        session_id=_opt_uuid(d["session_id"]), task_id=_opt_uuid(d["task_id"]), parent_id=_opt_uuid(d["parent_id"]),
        message_id=_opt_uuid(d["message_id"]), created_at=datetime.fromisoformat(d["created_at"]),
        event_id=uuid.UUID(d["event_id"]), payload_json=d["payload_json"],
    ) for d in json.loads(line)]


class Spill:
    """A file-backed FIFO of put items: appended at the end, read from a cursor, removed once drained.

    Each line is one item's events; its future (if any) stays in memory, keyed by the line's number.
    """

    def __init__(self, path: Path):
        self.path = path
        self.written = 0  # lines appended (including any found at start)
        self.read = 0  # lines taken by the writer
        self.events = 0  # events appended over the writer's life (the negative control of the tests)
        self._offset = 0
        self.size = 0  # bytes in the file
        self._futures: dict[int, asyncio.Future[Appended]] = {}
        self._out: Any = None

    @property
    def active(self) -> bool:
        return self.read < self.written

    @property
    def backlog_bytes(self) -> int:
        return self.size - self._offset

    def recover(self) -> int:
        """Adopt a spill left by an earlier executor; returns its number of items."""
        if not self.path.exists():
            return 0
        with self.path.open("rb") as f:
            self.written = sum(1 for line in f if line.strip())
        self.size = self.path.stat().st_size
        if not self.written:
            self.path.unlink()
        return self.written

    def append(self, events: Sequence[NewEvent], fut: asyncio.Future[Appended] | None) -> None:
        if self._out is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._out = self.path.open("ab")
        data = (_encode(events, datetime.now(UTC)) + "\n").encode()
        self._out.write(data)
        self._out.flush()  # in the OS's hands: a crash of this process loses none of it
        self.size += len(data)
        if fut is not None:
            self._futures[self.written] = fut
        self.written += 1
        self.events += len(events)

    def take(self, max_events: int) -> tuple[list[_Item], int]:
        """The next items in order (at least one), with the file offset after them."""
        items: list[_Item] = []
        n = 0
        offset = self._offset
        with self.path.open("rb") as f:
            f.seek(offset)
            index = self.read
            while index < self.written and (not items or n < max_events):
                line = f.readline()
                offset = f.tell()
                if not line.strip():
                    continue
                events = _decode(line.decode("utf-8"))
                items.append((events, self._futures.pop(index, None)))
                n += len(events)
                index += 1
        return items, offset

    def consumed(self, items: int, offset: int) -> None:
        self.read += items
        self._offset = offset
        if not self.active:
            # drained: start afresh, so the file never grows past one outage's worth
            if self._out is not None:
                self._out.close()
                self._out = None
            self.path.unlink(missing_ok=True)
            self.read = self.written = self._offset = self.size = 0

    def keep_first(self, items: list[_Item]) -> None:
        """Put `items` (older than anything spilled) before the unread rest of the file, for the next start."""
        self.close()
        rest = b""
        if self.active:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                rest = f.read()
        tmp = self.path.with_suffix(".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC)
        with tmp.open("wb") as out:
            for events, _ in items:
                out.write((_encode(events, stamp) + "\n").encode())
            out.write(rest)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(self.path)
        self.size = self.path.stat().st_size
        self.written = len(items) + rest.count(b"\n")
        self.read = self._offset = 0

    def abandon_futures(self) -> list[_Item]:
        found: list[_Item] = [((), fut) for fut in self._futures.values()]
        self._futures.clear()
        return found

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


@dataclass
class HoldStats:
    """What the writer holds now and has held (for the log and the tests)."""

    holding: bool
    held_events: int
    held_bytes: int
    spilled_events: int
    spill_path: str | None


class JournalWriter:
    def __init__(self, pool: AsyncConnectionPool, *, spill_dir: Path | None = None, hold_bytes: int = HOLD_BYTES,
                 max_batch: int = MAX_BATCH):
        self._pool = pool
        self._availability = database.availability(pool)
        self._mem: deque[_Item] = deque()
        self._mem_bytes = 0
        self._mem_events = 0
        self._hold_bytes = hold_bytes
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
        return self._mem_bytes < self._hold_bytes or (spill is not None and self._away())

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
                cur = await conn.execute(journal.queries["event_types"])
                return {(name, tier) for name, tier in await cur.fetchall()}

        self._known_types = await self._availability.retry(load, "journal_writer")
        if self._spill is not None and self._spill.active:
            self._work.set()
            self._idle.clear()
        self._task = asyncio.create_task(self._run(), name="journal-writer")

    async def flush_and_stop(self, timeout_s: float = STOP_FLUSH_TIMEOUT_S) -> None:
        """Write what is held, then stop. If the database stays away, what is left goes to the spill file
        (journaled at the next start) rather than being lost."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
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
                self._room.set()

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
                await self._register_new_types(batch)
                # after a failed attempt the batch may have committed unseen: append recognises it
                appended = await journal.append(self._pool, batch, retried=retried)
            except errors.JournalRefused:
                self._append_started = None
                raise
            except (errors.JournalWriteError, *database.OUTAGE_ERRORS) as exc:
                retried = True
                cause = exc.__cause__ if isinstance(exc, errors.JournalWriteError) and exc.__cause__ else exc
                self._hold(cause)
                await self._availability.pause(cause, "journal_writer")
                continue
            self._append_started = None
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

