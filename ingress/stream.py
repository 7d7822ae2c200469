"""SSE: one LISTEN connection per ingress process fans the journal out to every client.

Each journal event goes out as `id: <seq>`, `event: <event_type>`, `data: <envelope JSON>`. A client
resumes with Last-Event-ID (or ?after_seq=) and gets exactly what it missed: it registers with the
broadcaster first, then replays seq > its last id from the database, then takes live events, dropping
any it already sent and fetching any gap from the database. Queue, task and question changes are pushed
as id-less `queue`, `task` and `question` events (wake-ups: re-read the REST view). Frames are encoded
once into a shared ring and each client keeps only a cursor: a slow client delays nobody, and one that
falls off the ring's end is closed and resumes by Last-Event-ID. A small batch's `journal` notification
carries its rows (shared/sql/journal.sql): those that follow on from the last seq published go out without
a read; anything else (a large batch, a gap, a resync) is read from the database, in seq order.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool
from pydantic import TypeAdapter
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request

from ingress.asked import Asked
from ingress.problems import Problem
from shared import aio, database, failover, logs
from shared.listener import RESYNC, Notification, Subscription
from shared.models import Event
from shared.query import Queries
from shared.sql import queries as shared_sql

log = logs.get(__name__)

CHANNELS = ["journal", "chat_queue", "stop_queue", "thread_control_queue", "question_asked",
            "question_answered", "task_changed", "task_ended", "task_activity"]
_SIGNALS = {
    "chat_queue": ("queue", "chat"), "stop_queue": ("queue", "stop"),
    "thread_control_queue": ("queue", "thread_control"), "question_asked": ("question", "asked"),
    "question_answered": ("question", "closed"), "task_changed": ("task", "changed"),
    "task_ended": ("task", "changed"),  # a change into a final status (migration 0036)
    "task_activity": ("task", "changed"),  # awaiting_user and back (migration 0035: not an end)
}
PAGE = 500
# and what a page's payloads may come to past its first row (read_journal_page)
PAGE_BYTES = 16 * 1024 * 1024
# the rows a `journal` notification may carry, parsed as a read would give them
_ROWS = TypeAdapter(list[Event])
# Backstop for a notification lost without the listener noticing: look at the head this often.
POLL_S = 2.0
# A replay's page read goes on after its client left (aio.finished) for at most this long: a read held up
# (a lock) then gives its pooled connection back rather than keep it until the hold ends.
DETACHED_READ_S = 5.0
# What the ring's frames may come to besides its newest one: a frame is a journal row as sent, and a spawn's line can
# be 64 MiB (it writes its CLI's stdout), so a count alone would let a few hold gigabytes with no client connected.
# A client whose cursor falls off the end resumes by seq, as it does when the count is passed.
RING_BYTES = 64 * 1024 * 1024
# A send blocked this long (a dead or stalled client) ends that stream.
SEND_TIMEOUT_S = 30.0
# While the database is away, a client whose stream had to end comes back after this long.
RECONNECT_MS = 5_000


@dataclass(frozen=True, slots=True)
class Frame:
    """One SSE event, framed once (by the library) and shared as bytes by every client.

    In the ring, a frame also says where it stands in the journal's order, so that a client can take a
    whole batch without looking at each frame: `after`, the latest seq published before it; `upto`, the
    latest at or with it; `breaks`, how many frames so far did not follow on from the seq before them."""

    seq: int | None
    raw: bytes
    after: int = 0
    upto: int = 0
    breaks: int = 0

    @property
    def follows_on(self) -> bool:
        return self.seq is None or self.seq == self.after + 1


def frame(seq: int | None, event: str, data: str) -> Frame:
    return Frame(seq, ServerSentEvent(data=data, event=event, id=None if seq is None else str(seq)).encode())


def event_frame(e: Event) -> Frame:
    return frame(e.seq, e.event_type, e.model_dump_json())


class Overflow(Exception):
    """The client fell too far behind; it must reconnect and resume by Last-Event-ID."""


class Broadcaster:
    """One shared ring of encoded frames; each client is only a cursor into it. Publishing never waits
    on a client, and a client whose cursor falls off the ring's end is closed (it resumes by seq)."""

    def __init__(self, pool: AsyncConnectionPool, *, buffer: int):
        self.pool = pool
        self.journal = Queries(pool, shared_sql)  # the journal's reads (shared/sql/journal.sql)
        self.frames: deque[Frame] = deque()
        self.buffer = buffer  # frames at most (and RING_BYTES)
        self.bytes = 0
        self.published = 0  # frames ever published; frame n lives at index n - self.first
        self.last_seq = 0
        self.closing = asyncio.Event()
        self._tick: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.clients = 0
        self._upto = 0  # the latest seq published
        self._breaks = 0
        # the last batch joined for a client: every client at the same cursor takes the same bytes
        self._joined: tuple[int, int, bytes] = (-1, 0, b"")
        self.asked = Asked()  # the questions seen asked, for the answer route (ingress/asked.py)

    @property
    def first(self) -> int:
        return self.published - len(self.frames)

    def _publish(self, frames: list[Frame]) -> None:
        if not frames:
            return
        placed = []
        for f in frames:
            after = self._upto
            if f.seq is not None:
                if f.seq != after + 1:
                    self._breaks += 1
                self._upto = max(self._upto, f.seq)
            placed.append(Frame(f.seq, f.raw, after, self._upto, self._breaks))
        self.frames.extend(placed)
        self.bytes += sum(len(f.raw) for f in placed)
        while len(self.frames) > 1 and (len(self.frames) > self.buffer or self.bytes > RING_BYTES):
            self.bytes -= len(self.frames.popleft().raw)
        self.published += len(frames)
        self._wake_clients()

    def _wake_clients(self) -> None:
        tick, self._tick = self._tick, asyncio.get_running_loop().create_future()
        tick.set_result(None)

    def close(self) -> None:
        """Shutting down: every client's stream ends now, even mid-flood (it resumes by seq)."""
        self.closing.set()
        self._wake_clients()

    def subscribe(self) -> Client:
        self.clients += 1
        return Client(self, self.published)

    async def _catch_up(self) -> None:
        while True:
            events, more = await _read_since(self.journal, self.last_seq)
            self._publish([event_frame(e) for e in events])  # encoded once, shared by every client
            if events:
                self.last_seq = events[-1].seq
                self._seen(events)
            if not more:
                return

    def _seen(self, events: list[Event]) -> None:
        """Events sent to clients: the highest seq marked, the questions asked kept, and a failover's gap the
        executor recorded noted."""
        failover.seq_mark(self.pool).saw(events[-1].seq)
        self.asked.saw(events)
        for e in events:
            if e.event_type == failover.SEQS_LOST:
                self._note_loss(e.payload.get("after", 0), e.payload.get("upto", 0), "executor")

    async def _check_head(self) -> None:
        """After a reconnect (a failover's new primary): a head below what clients were sent means seqs were
        lost. Said once; `last_seq` stays, so the numbers the executor gives afterwards reach the clients."""
        head = await self.journal.one("get_journal_head")
        if head is not None and head["last_seq"] < self.last_seq:
            self._note_loss(head["last_seq"], self.last_seq, "ingress")

    def _note_loss(self, after: int, upto: int, by: str) -> None:
        mark = failover.seq_mark(self.pool)
        if any(loss.after <= after and upto <= loss.upto for loss in mark.losses):
            return
        mark.lost(after, upto, by)
        log.error("journal_seqs_lost", service="ingress", head_found=after, upto=upto, lost=upto - after,
                  detected_by=by, note="a failover lost journal seqs the old primary had committed (a standby "
                                       "that lacked them); SSE clients go on from past them")

    def _carried(self, payload: str) -> list[Frame] | None:
        """A `journal` notification: `<last_seq>`, or `<last_seq> <the batch's rows>` (shared/sql/journal.sql).
        The frames of its rows when they follow on from the last seq taken (they go out without a read), []
        when it was taken already, None when the database must be read (rows not carried, an unreadable
        payload, or a gap: a notification lost, which the read fills)."""
        head, _, body = payload.partition(" ")
        if not head.isdigit():
            return None
        last = int(head)
        if last <= self.last_seq:
            return []  # a catch-up read it already (a batch commits whole, so all of it)
        if not body:
            return None
        try:
            events = _ROWS.validate_json(body)
        except ValueError:
            log.warning("journal_note_unreadable", last_seq=last)
            return None
        if not events or events[0].seq != self.last_seq + 1 or events[-1].seq != last:
            return None
        frames = [event_frame(e) for e in events]
        self.last_seq = last
        self._seen(events)
        return frames

    async def _take(self, notes: list[Notification]) -> None:
        """Notifications in their order, as one publish: a backlog (a busy moment) goes out as one batch, one
        wake-up and one write per client, rather than one per notification, so it drains instead of lasting."""
        frames: list[Frame] = []
        try:
            for note in notes:
                carried = None if note is RESYNC or note.channel != "journal" else self._carried(note.payload)
                if carried is not None:
                    frames += carried
                elif note is RESYNC or note.channel == "journal":
                    self._publish(frames)  # what came before it, then the read (which runs to the head)
                    frames = []
                    await self._catch_up()
                elif note.channel in _SIGNALS:
                    name, kind = _SIGNALS[note.channel]
                    frames.append(frame(None, name, json.dumps({"kind": kind, "id": note.payload})))
        finally:
            self._publish(frames)  # taken (last_seq moved past them): out, even if a later read failed

    async def run(self, sub: Subscription) -> None:
        availability = database.availability(self.pool)
        while not self.closing.is_set():  # started during an outage: wait for the head
            try:
                head = await self.journal.one("get_journal_head")
                assert head is not None  # the journal_head row exists from the first migration on
                self.last_seq = self._upto = head["last_seq"]
                break
            except database.OUTAGE_ERRORS as exc:
                await availability.pause(exc, "sse_broadcaster", self.closing)
        while not self.closing.is_set():
            polled = False
            try:
                notes = [await aio.wait_for(sub.get(), POLL_S)]
            except TimeoutError:
                notes, polled = [RESYNC], True
            while not sub.queue.empty():  # everything that arrived meanwhile, in order
                notes.append(sub.queue.get_nowait())
            try:
                if not polled and any(n is RESYNC for n in notes):  # the listener reconnected: perhaps elsewhere
                    await self._check_head()
                await self._take(notes)
            except database.OUTAGE_ERRORS as exc:
                # streams stay open on their heartbeats; the poll catches up once the database is back
                availability.failed(exc, "sse_broadcaster")
            except Exception:  # noqa: BLE001 - the fan-out outlives a failed read; the poll retries
                log.exception("broadcast_failed")


class Client:
    def __init__(self, broadcaster: Broadcaster, cursor: int):
        self.b = broadcaster
        self.cursor = cursor
        self.taken_at = cursor  # where the last batch `next` returned began (in frames ever published)

    def joined(self, batch: list[Frame]) -> bytes:
        """The batch as one write, joined once for every client that takes the same frames."""
        at, n, raw = self.b._joined
        if at != self.taken_at or n != len(batch):
            raw = b"".join([f.raw for f in batch])
            self.b._joined = (self.taken_at, len(batch), raw)
        return raw

    async def next(self, most: int = 256) -> list[Frame] | None:
        """The frames waiting for this client (at least one); None when the server is shutting down.
        Raises Overflow."""
        b = self.b
        while True:
            if b.closing.is_set():
                return None  # shutting down: end the stream now, even mid-flood (the client resumes by seq)
            if self.cursor < b.first:
                raise Overflow()
            if self.cursor < b.published:
                # counted from the ring's newest end, where a client's cursor is: a deque walks from an
                # end, and from the oldest this was a walk over the whole ring per client per wake-up
                behind = b.published - self.cursor
                taken = list(itertools.islice(reversed(b.frames), behind - min(behind, most), behind))
                taken.reverse()
                self.taken_at = self.cursor
                self.cursor += len(taken)
                return taken
            # the one future every waiting client shares (published frames and the close resolve it);
            # shielded, so a client's stream ending cancels its own wait, not everyone's
            await asyncio.shield(b._tick)

    def close(self) -> None:
        self.b.clients -= 1


def _resume_point(request: Request) -> int | None:
    raw = request.headers.get("last-event-id") or request.query_params.get("after_seq")
    if raw is None or raw == "":
        return None
    if not raw.isdigit():
        raise Problem(400, "Last-Event-ID / after_seq must be a non-negative integer (a seq)")
    return int(raw)


async def stream(request: Request) -> EventSourceResponse:
    broadcaster: Broadcaster = request.app.state.broadcaster
    after = _resume_point(request)
    client = broadcaster.subscribe()  # before the replay: nothing committed after this point is missed
    # every seq after this one reaches the client through the ring, from its cursor on
    live_from = broadcaster.last_seq
    if after is None:
        after = live_from  # a fresh client starts live; history is a REST read

    async def frames() -> AsyncIterator[bytes]:
        last = after
        try:
            # only what the ring will not bring: a replay that read on to the head would fetch, per
            # client, what is being appended meanwhile (at a mass reconnect, the same rows hundreds of times)
            if last < live_from:
                async for page in _replay(broadcaster.journal, last, upto=live_from):
                    last = page[-1].seq or last
                    yield b"".join(f.raw for f in page)
            while True:
                batch = await client.next()
                if batch is None:
                    return
                head = batch[0]
                if head.after == last and head.follows_on and batch[-1].breaks == head.breaks:
                    # the usual case: the batch follows on from what this client has, without a gap
                    last = batch[-1].upto
                    yield client.joined(batch)
                    continue
                out: list[bytes] = []
                for f in batch:
                    if f.seq is not None:
                        if f.seq <= last:
                            continue  # already sent by the replay
                        if f.seq > last + 1:  # a gap: fetch it rather than skip it
                            async for page in _replay(broadcaster.journal, last, upto=f.seq - 1):
                                out += [m.raw for m in page]
                                last = page[-1].seq or last
                        last = f.seq
                    out.append(f.raw)
                if out:
                    yield b"".join(out)  # everything pending in one write
        except Overflow:
            log.info("sse_client_overflow", last_seq=last)
        except database.OUTAGE_ERRORS:
            # the replay needs the database: end this stream and say when to come back (Last-Event-ID)
            yield ServerSentEvent(comment="database unavailable; reconnect", retry=RECONNECT_MS).encode()
        finally:
            client.close()

    return EventSourceResponse(frames(), ping=request.app.state.config.sse_heartbeat_s,
                               send_timeout=SEND_TIMEOUT_S, headers={"Cache-Control": "no-store"})


async def _read_since(journal: Queries, after: int) -> tuple[list[Event], bool]:
    """A page of committed events after `after`, in seq order, bounded by count and by size (PAGE_BYTES); whether
    more follow it."""
    rows = await journal.all("read_journal_page", {"after": after, "limit": PAGE, "max_bytes": PAGE_BYTES})
    taken = rows[0]["rows_in_page"] if rows else 0
    return [Event(**row) for row in rows], taken == PAGE or len(rows) < taken


async def _replay(journal: Queries, after: int, upto: int | None = None) -> AsyncIterator[list[Frame]]:
    """Pages of frames for the committed events after `after` (up to `upto`), from the database. A client that
    goes away mid-read does not interrupt the page's query: psycopg would close its pooled connection."""
    while True:
        events, more = await aio.finished(_read_since(journal, after), detached_s=DETACHED_READ_S)
        page = [event_frame(e) for e in events if upto is None or e.seq <= upto]
        if page:
            yield page
            after = page[-1].seq or after
        if not more or len(page) < len(events):
            return


@contextlib.asynccontextmanager
async def running(broadcaster: Broadcaster, sub: Subscription) -> AsyncIterator[None]:
    task = asyncio.create_task(broadcaster.run(sub), name="sse-broadcaster")
    try:
        yield
    finally:
        broadcaster.close()
        await aio.cancel_and_wait(task)
