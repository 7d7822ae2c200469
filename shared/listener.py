"""A dedicated autocommit LISTEN connection that reconnects and says when to catch up.

Rules it follows (see the pitfalls of NOTIFY): LISTEN first, then tell subscribers to catch up by
query; never open a transaction on this connection; never leave a notifies() generator suspended;
probe the connection with a NOTIFY to itself so a dead or half-open connection is noticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from shared import aio, logs

if TYPE_CHECKING:
    from shared.availability import Availability
    from shared.failover import SeqMark

log = logs.get(__name__)

# How long the listener waits for traffic before it probes its own connection.
PROBE_INTERVAL_S = 10.0
# How long a probe (a NOTIFY to itself) may take to come back before the connection is presumed dead.
PROBE_TIMEOUT_S = 5.0
# Reconnect backoff, doubling from the first to the last value.
RECONNECT_DELAYS_S = (0.1, 0.5, 1.0, 2.0, 5.0)
SUBSCRIBER_QUEUE_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class Notification:
    channel: str
    payload: str


# Delivered after every (re)connect and after a subscriber's queue overflowed: what was sent while
# nobody listened is gone, so the subscriber must catch up by query.
RESYNC = Notification("", "resync")


class Subscription:
    def __init__(self, listener: Listener, channels: frozenset[str] | None,
                 keep: Callable[[Notification], bool] | None = None):
        self._listener = listener
        self.channels = channels
        # which of its channels' notifications can give the subscriber work (the rest are not queued; a RESYNC is)
        self.keep = keep
        self.queue: asyncio.Queue[Notification] = asyncio.Queue(SUBSCRIBER_QUEUE_SIZE)

    def _offer(self, note: Notification) -> None:
        if note is not RESYNC and ((self.channels is not None and note.channel not in self.channels)
                                   or (self.keep is not None and not self.keep(note))):
            return
        try:
            self.queue.put_nowait(note)
        except asyncio.QueueFull:
            # A slow consumer never slows the fan-out: it loses the backlog and is told to resync.
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(RESYNC)

    async def get(self) -> Notification:
        return await self.queue.get()

    def close(self) -> None:
        self._listener._subscribers.discard(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Listener:
    def __init__(
        self,
        dsn: str,
        channels: list[str],
        *,
        application_name: str = "petal-listen",
        connect_kwargs: Mapping[str, Any] | None = None,
        probe_interval_s: float = PROBE_INTERVAL_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        availability: Availability | None = None,
        seq_mark: SeqMark | None = None,
    ):
        self.dsn = dsn
        self.channels = list(channels)
        self.application_name = application_name
        self.connect_kwargs = dict(connect_kwargs or {})
        self.probe_interval_s = probe_interval_s
        self.probe_timeout_s = probe_timeout_s
        self.availability = availability
        # the journal's NOTIFY carries the last seq of each committed batch: the highest seen is kept there
        self.seq_mark = seq_mark
        self._probe_channel = f"petal_probe_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self._subscribers: set[Subscription] = set()
        self._stopping = asyncio.Event()
        self.connected = asyncio.Event()
        self.connects = 0
        self.backend_pid: int | None = None

    def subscribe(self, channels: list[str] | None = None,
                  keep: Callable[[Notification], bool] | None = None) -> Subscription:
        sub = Subscription(self, frozenset(channels) if channels is not None else None, keep)
        self._subscribers.add(sub)
        return sub

    def _publish(self, note: Notification) -> None:
        for sub in list(self._subscribers):
            sub._offer(note)

    async def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Listen until stop(); reconnect forever on any connection failure."""
        failures = 0
        while not self._stopping.is_set():
            try:
                await self._session()
                failures = 0
            except (psycopg.Error, OSError, TimeoutError) as exc:
                self.connected.clear()
                delay = RECONNECT_DELAYS_S[min(failures, len(RECONNECT_DELAYS_S) - 1)]
                if failures == 0:  # once per loss: an outage's every attempt would flood the log
                    log.warning("listener_reconnect", error=str(exc).strip(), delay_s=delay)
                if self.availability is not None and not isinstance(exc, TimeoutError):
                    self.availability.failed(exc, "listener")
                failures += 1
                with contextlib.suppress(TimeoutError):
                    await aio.wait_for(self._stopping.wait(), delay)
        self.connected.clear()

    async def _session(self) -> None:
        conn = await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, application_name=self.application_name, **self.connect_kwargs
        )
        async with conn:
            for channel in [*self.channels, self._probe_channel]:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            self.backend_pid = conn.info.backend_pid
            self.connects += 1
            self.connected.set()
            if self.availability is not None:
                self.availability.succeeded()
            # LISTEN is in place before anyone catches up, so nothing falls between the two.
            self._publish(RESYNC)
            probe_token: str | None = None
            while not self._stopping.is_set():
                wait_s = self.probe_timeout_s if probe_token else self.probe_interval_s
                got_probe = False
                traffic = False
                # aclosing: a suspended notifies() generator would keep holding the connection's lock
                async with contextlib.aclosing(conn.notifies(timeout=wait_s)) as notes:
                    async for note in notes:
                        traffic = True
                        if self.availability is not None and self.availability.down:
                            # the server speaks: back. The connect's own word is not taken within an outage's
                            # settling second (Availability.succeeded), and after a quick failover nothing else
                            # a process that only listens does would say it again
                            self.availability.succeeded()
                        if note.channel == self._probe_channel:
                            got_probe = got_probe or note.payload == probe_token
                            continue
                        if note.channel == "journal" and self.seq_mark is not None:
                            # `<last_seq>`, or `<last_seq> <the batch's rows>` (shared/sql/journal.sql)
                            head = note.payload.partition(" ")[0]
                            if head.isdigit():
                                self.seq_mark.saw(int(head))
                        self._publish(Notification(note.channel, note.payload))
                        if self._stopping.is_set():
                            break
                if probe_token is not None:
                    if not got_probe:
                        raise TimeoutError("listener probe did not come back")
                    probe_token = None
                elif not traffic:
                    probe_token = uuid.uuid4().hex
                    await asyncio.wait_for(
                        conn.execute("SELECT pg_notify(%s, %s)", [self._probe_channel, probe_token]),
                        self.probe_timeout_s,
                    )
