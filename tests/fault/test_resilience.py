"""The resilience suite: the real service pair (real PostgreSQL, real claude CLI on the scripted model)
driven through faults while work is in flight, then checked against the invariants in tests/resilience.py:
every task ends final (none silently stuck), seq is gap-free, every queue row is delivered exactly once,
no question is closed twice, and SSE readers that reconnected hold exactly the journal's events.

Run alone with `bash .ci/run -m resilience`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from executor.asks import TIMED_OUT
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests.harness import cli_pid, config_for, live_in_group, running_executor, running_supervisor, substrate_for
from tests.pg import DB, Cluster, lock_waiter
from tests.resilience import OwnServer, StreamReader, check_invariants, head, settled
from tests.e2e.test_asks import Q1, _round_trip, asking
from tests.fault.test_executor_process import _executor_env
from tests.scenarios import STALL_FOREVER, handoff, one_worker
from tests import tables
from tests.served import free_port, ingress_server
from tests.wait import until

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

pytestmark = [pytest.mark.resilience, pytest.mark.timeout(300)]



async def post_chat(http: httpx.AsyncClient, text: str, thread: str | None = None, timeout: float = 60) -> None:
    """Post like a phone does: retry on errors with the same client_msg_id, so a retry never duplicates."""
    body: dict[str, Any] = {"text": text, "client_msg_id": f"msg-{uuid.uuid4()}"}
    if thread:
        body["thread_id"] = thread

    async def accepted() -> bool:
        try:
            return (await http.post("/api/chat", json=body)).status_code == 202
        except httpx.HTTPError:
            return False

    await until(accepted, f"{text!r} accepted", timeout, every=0.2)


def echoes(admin_dsn: str) -> list[str]:
    return tables.user_messages(admin_dsn)


async def running_turn(admin_dsn: str, timeout: float = 60) -> None:
    await until(lambda: tables.count_running(admin_dsn), "a turn started", timeout, every=0.05)


# how long the database stays down: well inside the pools' 30 s wait for a connection
DOWN_S = 5.0
# what the journal writer's retry path logs: a batch cut off mid-write retried by journal.append, or the
# writer retrying (holding) a batch the database refused
WRITER_RETRIED = ("journal_append_retry", "journal_writer_retry", "journal_holding")
SLOW_TURN = Scenario(rules=[Rule(role="orchestrator", replies=[{"stall": {"seconds": 2, "text": "turn done"}}])])


# ---- PostgreSQL goes away ------------------------------------------------------------------------------

async def test_postgres_down_mid_run_both_services_keep_running_reconnect_and_nothing_is_lost(
    own: tuple[OwnServer, Cluster], odb: DB, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    server = own[0]
    words = 5000
    scenario = Scenario(rules=[
        Rule(role="orchestrator", replies=[{"stall": {"seconds": 2, "text": "turn done"}}]),
        # a worker streaming one line per token while the database goes away under it
        Rule(role="worker", replies=[{"text": " ".join("w" for _ in range(words)), "delay_s": 0.002}]),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(odb, model, tmp_path, substrate_kw={"extra_args": ("--include-partial-messages",)}) \
                as h, ingress_server(odb.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            reader = StreamReader(url, after=0).start()
            for i in range(3):
                await post_chat(http, f"before {i}")
            await running_turn(odb.admin_dsn)
            worker = await h.dispatch("stream a lot")
            await _journaled(odb.admin_dsn, worker, "stream.stream_event")
            # hold the writer's next append mid-transaction, so the outage certainly cuts a write off
            locker = await psycopg.AsyncConnection.connect(odb.admin_dsn)
            await locker.execute("LOCK TABLE journal IN SHARE MODE")  # readers go on; INSERTs wait
            await lock_waiter(odb.admin_dsn, "application_name LIKE 'petal-executor%%'")
            # stopped and started in a thread: this event loop, which runs both services, goes on meanwhile
            await asyncio.to_thread(server.down)
            with contextlib.suppress(psycopg.Error):
                await locker.close()
            during = asyncio.create_task(post_chat(http, "during"))  # the phone retries until accepted
            answered = await _health_during(http, DOWN_S)
            await asyncio.to_thread(server.up)
            await during
            for i in range(3):
                await post_chat(http, f"after {i}")
            await settled(odb.admin_dsn)
            await reader.until(head(odb.admin_dsn))
            await reader.stop()
    logged = capfd.readouterr().out
    assert answered and set(answered) == {200}, "the ingress must keep answering while the database is down"
    # the journal writer met the outage mid-write and retried (the names its retry path logs)
    assert any(name in logged for name in WRITER_RETRIED), logged[-3000:]
    facts = check_invariants(odb.admin_dsn, [reader])
    assert echoes(odb.admin_dsn) == [f"before {i}" for i in range(3)] + ["during"] + [f"after {i}" for i in range(3)]
    assert facts["chat"] == 7
    with psycopg.connect(odb.admin_dsn) as conn:
        deltas = tables.deltas(conn, worker)
        lines = tables.count_events(conn, tables.Like("stream.%"), worker)
        [exited] = tables.payloads(conn, "task.exited", worker)  # one: the worker's exit
        status = tables.status(conn, worker)
    assert status == "success" and deltas == words and lines == exited["lines"]


async def _health_during(http: httpx.AsyncClient, window_s: float) -> list[int]:
    """The ingress's /healthz answers to a phone probing it through a window (the outage's length)."""
    answered: list[int] = []

    async def probe() -> None:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                answered.append((await http.get("/healthz", timeout=1)).status_code)
            await asyncio.sleep(0.2)  # not a wait: the pace of the phone's probes

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(probe(), window_s)
    return answered


async def _journaled(admin_dsn: str, task_id: uuid.UUID, event_type: str, timeout: float = 60) -> None:
    await until(lambda: tables.count_events(admin_dsn, event_type, task_id), f"{event_type} for {task_id}", timeout,
                every=0.05)


async def test_the_listen_connections_terminated_by_the_server_are_replaced_and_nothing_waits(
    odb: DB, tmp_path: Path
) -> None:
    with ScriptedModelServer(SLOW_TURN) as model:
        async with running_executor(odb, model, tmp_path), ingress_server(odb.ingress_dsn) as url, \
                httpx.AsyncClient(base_url=url) as http:
            reader = StreamReader(url, after=0).start()
            await post_chat(http, "one")
            await running_turn(odb.admin_dsn)
            with psycopg.connect(odb.admin_dsn, autocommit=True) as conn:
                killed = conn.execute(
                    "SELECT application_name, pg_terminate_backend(pid), pid FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name LIKE '%%-listen'").fetchall()
            # the polling backstops would deliver everything without LISTEN: prove it came back
            relistening = await _listening_again(odb.admin_dsn, [pid for _, _, pid in killed])
            await post_chat(http, "two")
            await post_chat(http, "three")
            await settled(odb.admin_dsn)
            await reader.until(head(odb.admin_dsn))
            await reader.stop()
    assert sorted(name for name, ok, _ in killed if ok) == ["petal-executor-listen", "petal-ingress-listen"]
    assert relistening == {"petal-executor-listen", "petal-ingress-listen"}
    check_invariants(odb.admin_dsn, [reader])
    assert echoes(odb.admin_dsn) == ["one", "two", "three"]


async def _listening_again(admin_dsn: str, killed: list[int], timeout: float = 30) -> set[str]:
    """The listeners that have a new connection that LISTENed: its last statement is a LISTEN, or the
    probe it only sends after its LISTENs."""
    back: set[str] = set()

    def relistened() -> set[str] | None:
        nonlocal back
        back = tables.listening(admin_dsn, "%-listen", besides=killed)
        return back if len(back) == 2 else None

    return await until(relistened, lambda: f"both listeners listening again; back: {back}", timeout)


# ---- a service goes away ---------------------------------------------------------------------------------

def _spawn(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "petal_dispatch.cli", "executor"], env=env, stdout=out,
                                stderr=subprocess.STDOUT)


async def test_the_executor_killed_mid_turn_and_restarted_loses_no_message(odb: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"stall": {"seconds": 3, "text": "turn done"}}])])
    log = tmp_path / "executor.log"
    with ScriptedModelServer(scenario) as model:
        env = _executor_env(odb, model, tmp_path)
        async with ingress_server(odb.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            reader = StreamReader(url, after=0).start()
            executor = _spawn(env, log)
            try:
                await post_chat(http, "first")
                await running_turn(odb.admin_dsn)
                executor.send_signal(signal.SIGKILL)
                executor.wait(30)
                await post_chat(http, "while it was down")  # queued; nobody consumes it yet
                executor = _spawn(env, log)
                await settled(odb.admin_dsn)
                await reader.until(head(odb.admin_dsn))
            finally:
                executor.send_signal(signal.SIGTERM)
                executor.wait(60)
                await reader.stop()
    check_invariants(odb.admin_dsn, [reader])
    turns = tables.tasks(odb.admin_dsn, "brief", "status", "status_reason", role="orchestrator")
    # the killed turn is visibly crashed and its message runs again (the turns' policy) before the message
    # sent meanwhile, which gets a turn of its own
    assert turns == [("first", "crashed", "executor_restart"), ("first", "success", "completed"),
                     ("while it was down", "success", "completed")], log.read_text()[-3000:]


async def test_a_threads_worker_orphaned_by_an_executor_kill_is_retried_by_the_policy_after_restart(
    odb: DB, tmp_path: Path
) -> None:
    # the first run hangs; the retry finishes
    scenario = one_worker("a long job", {"text": "finished on the retry"}, first_run=[STALL_FOREVER],
                          result=handoff("a long job"))
    log = tmp_path / "executor.log"
    with ScriptedModelServer(scenario) as model:
        env = _executor_env(odb, model, tmp_path)
        async with ingress_server(odb.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            executor = _spawn(env, log)
            try:
                thread = (await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
                await post_chat(http, "run the long job", thread)
                # the first run is in its hanging request (its claude dies with the executor: it must have
                # reached the model first, or the retry would be the run the scenario hangs)
                await until(lambda: tables.count_running(odb.admin_dsn, "worker")
                            and any(r.role == "worker" for r in model.requests),
                            lambda: "the worker's first run at the model\n" + log.read_text()[-3000:], 90)
                executor.send_signal(signal.SIGKILL)
                executor.wait(30)
                executor = _spawn(env, log)
                await settled(odb.admin_dsn, timeout=120)
            finally:
                executor.send_signal(signal.SIGTERM)
                executor.wait(60)
    check_invariants(odb.admin_dsn)
    with psycopg.connect(odb.admin_dsn) as conn:
        workers = tables.tasks(conn, "status", "status_reason", "attempt", role="worker")
        decisions = tables.policy_actions(conn)
        reports = tables.count_tasks(conn, role="orchestrator", brief=tables.Like("[harness] Worker%"))
    assert workers == [("crashed", "executor_restart", 1), ("success", "completed", 2)], log.read_text()[-3000:]
    assert decisions == ["retry_same", "report"] and reports == 1


async def test_the_ingress_restarted_under_50_sse_clients_they_all_resume_with_exactly_the_journal(
    odb: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[Rule(role="*", replies=[{"text": " ".join(f"w{i}" for i in range(300)),
                                                         "delay_s": 0.005}])])
    port = free_port()
    with ScriptedModelServer(scenario) as model:
        async with running_supervisor(odb.executor_dsn, odb.admin_dsn, substrate_for(
                model, tmp_path, extra_args=("--include-partial-messages",)), config_for(tmp_path)) as h:
            async with ingress_server(odb.ingress_dsn, ingress_port=port) as url:
                readers = [StreamReader(url, after=0).start() for _ in range(50)]
                await asyncio.gather(*(r.connected.wait() for r in readers))
                tasks = [await h.dispatch(f"talk {i}") for i in range(2)]
                for t in tasks:  # mid-output
                    await _journaled(odb.admin_dsn, t, "stream.stream_event")
            await asyncio.sleep(0.5)  # the ingress is down while the workers go on writing
            async with ingress_server(odb.ingress_dsn, ingress_port=port):
                for t in tasks:
                    await h.wait_final(t, timeout=120)
                end = head(odb.admin_dsn)
                await asyncio.gather(*(r.until(end) for r in readers))
                for r in readers:
                    await r.stop()
    check_invariants(odb.admin_dsn, readers)
    assert all(r.connects >= 2 for r in readers)


# ---- a worker misbehaves ------------------------------------------------------------------------------

async def test_a_worker_flooding_50000_lines_while_a_client_reads_slowly_loses_no_line(
    odb: DB, tmp_path: Path
) -> None:
    words = 50_000
    scenario = Scenario(rules=[Rule(role="*", replies=[{"text": " ".join("x" for _ in range(words)),
                                                         "delay_s": 1e-9}])])
    with ScriptedModelServer(scenario) as model:
        async with running_supervisor(odb.executor_dsn, odb.admin_dsn, substrate_for(
                model, tmp_path, extra_args=("--include-partial-messages",)), config_for(tmp_path)) as h, \
                ingress_server(odb.ingress_dsn, sse_client_buffer=500) as url:
            slow = StreamReader(url, after=0, slow_s=0.05).start()
            fast = StreamReader(url, after=0).start()
            task_id = await h.dispatch("flood")
            row = await h.wait_final(task_id, timeout=240)
            slow.slow_s = 0.0  # the phone catches up: it resumes from where it was cut off
            end = head(odb.admin_dsn)
            await asyncio.gather(slow.until(end, timeout=180), fast.until(end, timeout=180))
            await slow.stop()
            await fast.stop()
    with psycopg.connect(odb.admin_dsn) as conn:
        deltas = tables.deltas(conn, task_id)
        lines = tables.count_events(conn, tables.Like("stream.%"), task_id, tier="raw")
        [exited] = tables.payloads(conn, "task.exited", task_id)
    assert row["status"] == "success"
    assert deltas == words  # one line per token the model streamed, each exactly once
    assert lines == exited["lines"]  # every stdout line the supervisor counted is in the journal
    check_invariants(odb.admin_dsn, [slow, fast])
    assert slow.connects >= 2  # it fell off the ring and resumed by Last-Event-ID


STAND_IN = r'''#!/usr/bin/env python3
import sys
out = sys.stdout.buffer
out.write(b'{"type":"system","subtype":"init","session_id":"s"}\n')
out.write(b'not json at all\n')
out.write(b'\xff\xfe broken utf-8 \xc3\x28\n')
out.write(b'{"type":"assistant","message":{"content":[{"type":"text","text":"caf\xc3\xa9"}]}}\n')
out.write(b'{"truncated": \n')
out.write(b'{"type":"result","subtype":"success","is_error":false,"result":"done"}\n')
out.flush()
'''


async def test_a_worker_printing_invalid_utf8_and_non_json_is_journaled_line_for_line(
    odb: DB, tmp_path: Path
) -> None:
    # The real CLI never prints these; a stand-in executable plays a worker whose output is damaged.
    stand_in = tmp_path / "damaged-claude"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    with ScriptedModelServer(Scenario()) as model:
        sub = substrate_for(model, tmp_path)
        from dataclasses import replace

        async with running_supervisor(odb.executor_dsn, odb.admin_dsn, replace(sub, claude_bin=str(stand_in)),
                                      config_for(tmp_path)) as h:
            task_id = await h.dispatch("print damaged lines")
            row = await h.wait_final(task_id)
            events = [e for e in await h.events(task_id) if e.event_type.startswith("stream.")]
    assert row["status"] == "success"
    assert len(events) == 6  # six lines printed, six records, in order
    kinds = [e.event_type for e in events]
    assert kinds[0] == "stream.system.init" and kinds[3] == "stream.assistant" and kinds[5] == "stream.result"
    unparsed = [events[i].payload for i in (1, 2, 4)]
    assert all(e.event_type == kinds[1] for e in (events[2], events[4]))
    assert "not json at all" in str(unparsed[0]) and "broken utf-8" in str(unparsed[1])
    assert events[3].payload["message"]["content"][0]["text"] == "café"
    check_invariants(odb.admin_dsn)


# ---- users in a hurry ---------------------------------------------------------------------------------

async def test_twenty_messages_in_one_second_are_each_delivered_once_in_order(odb: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(SLOW_TURN) as model:
        async with running_executor(odb, model, tmp_path), ingress_server(odb.ingress_dsn) as url, \
                httpx.AsyncClient(base_url=url) as http:
            reader = StreamReader(url, after=0).start()
            sent = [f"message {i:02d}" for i in range(20)]
            started = time.monotonic()
            for m in sent:  # in a burst, one after another (their order is the order accepted)
                await post_chat(http, m)
            posting_took = time.monotonic() - started
            await settled(odb.admin_dsn)
            await reader.until(head(odb.admin_dsn))
            await reader.stop()
    check_invariants(odb.admin_dsn, [reader])
    assert echoes(odb.admin_dsn) == sent
    turns = tables.count_tasks(odb.admin_dsn, role="orchestrator")
    assert turns < 20, f"{turns} turns: messages that waited should share a turn"
    assert posting_took < 20  # sanity only: they went in a burst


QUESTION = {"question": "Go ahead?", "header": "Go", "multiSelect": False,
            "options": [{"label": "Yes", "description": ""}, {"label": "No", "description": ""}]}


async def test_an_answer_racing_the_asks_timeout_closes_the_question_exactly_once(odb: DB, tmp_path: Path) -> None:
    timeout_s = 2.0
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[
        {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [QUESTION]}}},
        {"text": "after the question"}])])
    # the far offsets make sure both outcomes happen on a loaded machine; the near ones race for real. The rounds
    # run side by side, each in a thread of its own (a new conversation, so the scripted model asks again).
    offsets = (-1.0, -0.2, -0.05, 0.0, 0.05, 0.2, 1.0)
    with ScriptedModelServer(scenario) as model:
        async with running_executor(odb, model, tmp_path, ask_timeout_s=timeout_s, max_workers=len(offsets)), \
                ingress_server(odb.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:

            async def round_(offset: float) -> tuple[str, int]:
                thread = (await http.post("/api/threads", json={"title": str(offset)})).json()["thread_id"]
                await post_chat(http, f"ask me ({offset})", thread)
                asks = await until(lambda: _pending_asks(http, thread), "the question asked", 60, every=0.02)
                asked_at = time.monotonic()
                await asyncio.sleep(max(0.0, timeout_s + offset - 0.05))  # not a wait: the answer's moment, the race
                r = await http.post(f"/api/asks/{asks[0]['id']}/answer", json={"answers": {"Go ahead?": "Yes"}})
                assert r.status_code in (200, 202), r.text
                assert time.monotonic() - asked_at < 60
                return thread, r.status_code

            rounds = await asyncio.gather(*(round_(offset) for offset in offsets))
            await settled(odb.admin_dsn)
    threads = [thread for thread, _ in rounds]
    outcomes = [code for _, code in rounds]
    check_invariants(odb.admin_dsn)
    with psycopg.connect(odb.admin_dsn) as conn:
        closings = [p.get("question_id") for kind in ("question.answered", "question.cancelled")
                    for p in tables.payloads(conn, kind)]  # the records that closed a question, by its id
        closed = [(status, response, closings.count(str(question))) for thread in threads
                  for question, status, response in tables.rows(conn, "questions", "id", "status", "response",
                                                                source_session_uuid=thread)]
        received = [_ask_tool_result(conn, thread) for thread in threads]
    assert len(closed) == len(offsets) and all(n == 1 for _, _, n in closed)
    assert set(outcomes) == {200, 202}, outcomes  # both sides of the race were exercised
    # what the user was told matches what happened and what Claude got: 200 = their answer won and is the
    # tool result; 202 = the timeout won, the tool result says so, and the thread's question still took the
    # answer, late, for the thread as a message
    for code, (status, response, _), result in zip(outcomes, closed, received, strict=True):
        assert (code, status) in ((200, "answered"), (202, "answered")), (code, status, response)
        if code == 200:
            assert result["answers"] == {"Go ahead?": "Yes"}, result
        else:
            assert result["answers"] == {} and result["response"] == TIMED_OUT, result


async def _pending_asks(http: httpx.AsyncClient, thread: str) -> list[dict[str, Any]]:
    asks: list[dict[str, Any]] = (await http.get("/api/asks", params={
        "status": "pending", "thread_id": thread})).json()["asks"]
    return asks


def _ask_tool_result(conn: psycopg.Connection[Any], thread: str) -> dict[str, Any]:
    """The ask_user_question result the CLI received in a thread's turn, as journaled from its stdout."""
    for payload in tables.payloads(conn, "stream.user", session_id=thread):
        for block in payload["message"]["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                content = block["content"]
                result: dict[str, Any] = json.loads(content if isinstance(content, str) else content[0]["text"])
                return result
    raise AssertionError(f"no tool result in thread {thread}")


# ---- time and signals ------------------------------------------------------------------------------------

async def test_a_task_waiting_on_a_question_longer_than_the_stall_threshold_is_not_stalled(
    db: DB, tmp_path: Path
) -> None:
    stall_s = 1.5
    _, row, events, during = await _round_trip(
        db, tmp_path, asking(Q1), {"answers": {"Which database?": "Postgres"}},
        answer_after_s=stall_s * 3, stall_timeout_s=stall_s)
    at = {e.event_type: i for i, e in reversed(list(enumerate(events)))}  # each type's first index
    asked, answered = events[at["question.asked"]], events[at["question.answered"]]
    assert (answered.created_at - asked.created_at).total_seconds() > stall_s * 2  # silent well past the threshold
    assert during["activity"] == "awaiting_user"
    # the wait on the question is no stall (a CLI slow to start on busy cores may rightly stall before it asks)
    waiting = [e.event_type for e in events[at["question.asked"]:at["question.answered"]]]
    assert "task.stalled" not in waiting and row["status"] == "success", [e.event_type for e in events]


async def test_a_stop_the_cli_does_not_obey_is_followed_by_sigkill_after_the_grace(db: DB, tmp_path: Path) -> None:
    grace_s = 2.0
    with ScriptedModelServer(Scenario.single({"stall": {"seconds": None}})) as model:
        async with running_supervisor(db.executor_dsn, db.admin_dsn, substrate_for(model, tmp_path),
                                      config_for(tmp_path, stop_grace_s=grace_s)) as h:
            task_id = await h.dispatch("wait forever")
            await h.wait_event(task_id, "stream.system.init")
            pid = (await h.task(task_id))["pid"]
            os.kill(cli_pid(pid), signal.SIGSTOP)  # the real CLI, frozen: SIGTERM stays pending, only SIGKILL acts
            await tables.ask_stop(db.ingress_dsn, task_id)
            row = await h.wait_final(task_id, timeout=30)
            events = await h.events(task_id)
    sent = [e for e in events if e.event_type == "task.signal_sent"]
    assert [e.payload["signal"] for e in sent] == ["SIGTERM", "SIGKILL"]
    assert (sent[1].created_at - sent[0].created_at).total_seconds() >= grace_s * 0.95
    assert row["status"] == "cancelled" and row["status_reason"] == "stop_requested"
    assert row["exit_signal"] == signal.SIGKILL
    assert live_in_group(pid) == []


# ---- restarts ----------------------------------------------------------------------------------------------

async def test_queue_rows_a_dead_executor_had_claimed_go_back_to_pending_and_are_applied(
    db: DB, tmp_path: Path
) -> None:
    thread = uuid.uuid4()
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        # what an executor killed between claiming and finishing leaves behind
        tables.insert(conn, "thread_control_queue", thread_id=thread, action="create", args={"title": "left claimed"},
                      status="claimed", claimed_at=tables.NOW)
        tables.insert(conn, "chat_queue", thread_id=thread, text="claimed before the crash", status="claimed",
                      claimed_at=tables.NOW)
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "got it"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h:
            await settled(db.admin_dsn, timeout=90)
            events = await h.events()
    with psycopg.connect(db.admin_dsn) as conn:
        [(control,)] = tables.rows(conn, "thread_control_queue", "status")
        [(chat,)] = tables.rows(conn, "chat_queue", "status")
        queues = (control, chat, *tables.thread(conn, thread, "title"))
    started = [e.payload["reconciled"]["requeued"] for e in events if e.event_type == "executor.started"]
    assert started == [{"chat": 1, "stop": 0, "thread_control": 1}]
    assert queues == ("done", "delivered", "left claimed")
    assert [e.payload["text"] for e in events if e.event_type == "task.user_message"] == ["claimed before the crash"]
