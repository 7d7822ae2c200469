"""SSE: one LISTEN connection per ingress process fans the journal out to every client.

Each journal event goes out as `id: <seq>`, `event: <event_type>`, `data: <envelope JSON>`. A client
resumes with Last-Event-ID (or ?after_seq=) and gets exactly what it missed: it registers with the
broadcaster first, then replays seq > its last id from the database, then takes live events, dropping
any it already sent and fetching any gap from the database. Queue, task and question changes are pushed
as id-less `queue`, `task` and `question` events (wake-ups: re-read the REST view). A slow client has
a bounded buffer; when it overflows the client is closed and resumes by Last-Event-ID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request

from ingress.problems import Problem
from shared import journal, logs
from shared.listener import RESYNC, Subscription
from shared.models import Event

log = logs.get(__name__)

CHANNELS = ["journal", "chat_queue", "stop_queue", "thread_control_queue", "question_asked",
            "question_answered", "task_changed"]
_SIGNALS = {
    "chat_queue": ("queue", "chat"), "stop_queue": ("queue", "stop"),
    "thread_control_queue": ("queue", "thread_control"), "question_asked": ("question", "asked"),
    "question_answered": ("question", "closed"), "task_changed": ("task", "changed"),
}
PAGE = 500
# Backstop for a notification lost without the listener noticing: look at the head this often.
POLL_S = 2.0
# A send blocked this long (a dead or stalled client) ends that stream.
SEND_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Frame:
    seq: int | None
    event: str
    data: str

    def sse(self) -> ServerSentEvent:
        return ServerSentEvent(data=self.data, event=self.event, id=None if self.seq is None else str(self.seq))


def event_frame(e: Event) -> Frame:
    return Frame(e.seq, e.event_type, e.model_dump_json())


class Overflow(Exception):
    """The client fell too far behind; it must reconnect and resume by Last-Event-ID."""


class Client:
    def __init__(self, buffer: int, closing: asyncio.Event):
        self.queue: asyncio.Queue[Frame] = asyncio.Queue(buffer)
        self.overflowed = asyncio.Event()
        self._closing = closing

    def offer(self, frame: Frame) -> None:
        if self.overflowed.is_set():
            return
        try:
            self.queue.put_nowait(frame)
        except asyncio.QueueFull:
            self.overflowed.set()

    async def next(self) -> Frame | None:
        """The next frame; None when the server is shutting down. Raises Overflow."""
        if not self.queue.empty():
            return self.queue.get_nowait()
        if self.overflowed.is_set():
            raise Overflow()
        getter = asyncio.ensure_future(self.queue.get())
        stops = [asyncio.ensure_future(self.overflowed.wait()), asyncio.ensure_future(self._closing.wait())]
        try:
            await asyncio.wait([getter, *stops], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in stops:
                t.cancel()
        if getter.done():
            return getter.result()
        getter.cancel()
        if self.overflowed.is_set():
            raise Overflow()
        return None


class Broadcaster:
    def __init__(self, pool: AsyncConnectionPool, *, buffer: int):
        self.pool = pool
        self.buffer = buffer
        self.clients: set[Client] = set()
        self.last_seq = 0
        self.closing = asyncio.Event()

    def subscribe(self) -> Client:
        client = Client(self.buffer, self.closing)
        self.clients.add(client)
        return client

    def unsubscribe(self, client: Client) -> None:
        self.clients.discard(client)

    def _publish(self, frame: Frame) -> None:
        for client in list(self.clients):
            client.offer(frame)

    async def _catch_up(self) -> None:
        while True:
            async with self.pool.connection() as conn:
                events = await journal.read_since(conn, self.last_seq, limit=PAGE)
            for e in events:
                self._publish(event_frame(e))  # encoded once, shared by every client
            if events:
                self.last_seq = events[-1].seq
            if len(events) < PAGE:
                return

    async def run(self, sub: Subscription) -> None:
        async with self.pool.connection() as conn:
            self.last_seq = await journal.head(conn)
        while True:
            try:
                note = await asyncio.wait_for(sub.get(), POLL_S)
            except TimeoutError:
                note = RESYNC
            try:
                if note is RESYNC or note.channel == "journal":
                    if note is RESYNC or not note.payload.isdigit() or int(note.payload) > self.last_seq:
                        await self._catch_up()
                elif note.channel in _SIGNALS:
                    name, kind = _SIGNALS[note.channel]
                    self._publish(Frame(None, name, json.dumps({"kind": kind, "id": note.payload})))
            except Exception:  # noqa: BLE001 - the fan-out outlives a failed read; the poll retries
                log.exception("broadcast_failed")


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
    if after is None:
        after = broadcaster.last_seq  # a fresh client starts live; history is a REST read

    async def frames() -> AsyncIterator[ServerSentEvent]:
        last = after
        try:
            async for frame in _replay(broadcaster.pool, last):
                last = frame.seq or last
                yield frame.sse()
            while True:
                frame = await client.next()
                if frame is None:
                    return
                if frame.seq is not None:
                    if frame.seq <= last:
                        continue
                    if frame.seq > last + 1:
                        async for missed in _replay(broadcaster.pool, last, upto=frame.seq - 1):
                            last = missed.seq or last
                            yield missed.sse()
                    last = frame.seq
                yield frame.sse()
        except Overflow:
            log.info("sse_client_overflow", last_seq=last)
        finally:
            broadcaster.unsubscribe(client)

    return EventSourceResponse(frames(), ping=request.app.state.settings.sse_heartbeat_s,
                               send_timeout=SEND_TIMEOUT_S, headers={"Cache-Control": "no-store"})


async def _replay(pool: AsyncConnectionPool, after: int, upto: int | None = None) -> AsyncIterator[Frame]:
    while True:
        async with pool.connection() as conn:
            events = await journal.read_since(conn, after, limit=PAGE)
        for e in events:
            if upto is not None and e.seq > upto:
                return
            after = e.seq
            yield event_frame(e)
        if len(events) < PAGE:
            return


@contextlib.asynccontextmanager
async def running(broadcaster: Broadcaster, sub: Subscription) -> AsyncIterator[None]:
    task = asyncio.create_task(broadcaster.run(sub), name="sse-broadcaster")
    try:
        yield
    finally:
        broadcaster.closing.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
