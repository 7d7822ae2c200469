"""Threads end to end: turns with --resume, delivery at boundaries, replies in chat, the loop closing."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any, LiteralString

import httpx
import psycopg
import pytest

from executor.settle import threads as executor_threads
from executor.sql import queries as executor_queries
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import journal, threads
from shared.models import Event, NewEvent
from tests import tables
from tests.harness import Harness, running_executor
from tests.pg import DB
from tests.served import ingress_server
from tests.wait import until


async def _harness_queued(conn: psycopg.AsyncConnection[Any]) -> bool:
    return bool(await (await conn.execute("SELECT 1 FROM chat_queue WHERE origin = 'harness'")).fetchall())


async def _none_left(conn: psycopg.AsyncConnection[Any], count: LiteralString) -> bool:
    row = await (await conn.execute(count)).fetchone()
    return row is not None and row[0] == 0


async def _autonomous(http: httpx.AsyncClient, title: str = "auto") -> str:
    """A thread whose dispatches need no approval; its id."""
    made = await http.post("/api/threads", json={"title": title, "mode": "autonomous"})
    assert made.status_code == 202, made.text
    return made.json()["thread_id"]  # type: ignore[no-any-return]  # JSON from the API


async def _argv(h: Harness, task_id: Any) -> list[str]:
    spawned = [e for e in await h.events(task_id) if e.event_type == "task.spawned"]
    return spawned[0].payload["argv"]  # type: ignore[no-any-return]  # a JSON payload


async def test_each_message_is_a_turn_of_one_conversation_resumed_with_its_history(db: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "noted"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            assert (await http.post("/api/chat", json={"text": "first message"})).status_code == 202
            first = (await h.ended_turns(1))[0]
            assert (await http.post("/api/chat", json={"text": "second message"})).status_code == 202
            turns = await h.ended_turns(2)
            argv1, argv2 = await _argv(h, first["id"]), await _argv(h, turns[1]["id"])
            echoes = [e for e in await h.events() if e.event_type == "task.user_message"]
    thread = str(threads.DEFAULT_THREAD_ID)
    assert [t["status"] for t in turns] == ["success", "success"]
    assert argv1[argv1.index("--session-id") + 1] == thread
    assert argv2[argv2.index("--resume") + 1] == thread
    last_request = model.requests[-1].body["messages"]
    texts = json.dumps(last_request)
    assert "first message" in texts and "second message" in texts  # the resumed turn carried its history
    assert [e.payload["text"] for e in echoes] == ["first message", "second message"]


async def test_messages_sent_during_a_turn_wait_visibly_and_go_together_at_the_boundary(db: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"stall": {"seconds": 4, "text": "slowly"}}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            await http.post("/api/chat", json={"text": "A"})
            await until(lambda: _running(http), "a running turn", 30, every=0.05)
            await http.post("/api/chat", json={"text": "B"})
            await http.post("/api/chat", json={"text": "C"})
            pending = [p["text"] for p in (await http.get("/api/queue")).json()["pending"]]
            turns = await h.ended_turns(2)
    assert pending == ["B", "C"]
    assert [t["brief"] for t in turns] == ["A", "B\n\nC"]


async def test_a_chat_message_to_a_thread_blocked_in_an_ask_answers_it_as_a_reply(db: DB, tmp_path: Path) -> None:
    question = {"question": "Which way?", "header": "Way", "multiSelect": False,
                "options": [{"label": "Left", "description": ""}, {"label": "Right", "description": ""}]}
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[
        {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [question]}}},
        {"text": "ok, going that way"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            await http.post("/api/chat", json={"text": "start"})
            await _pending_asks(http)
            await http.post("/api/chat", json={"text": "neither, go straight"})
            turns = await h.ended_turns(1)
            events = await h.events(turns[0]["id"])
            echoes = [e for e in await h.events() if e.event_type == "task.user_message"]
    results = [b for e in events if e.event_type == "stream.user" for b in e.payload["message"]["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result"]
    payload = json.loads(results[0]["content"] if isinstance(results[0]["content"], str)
                         else results[0]["content"][0]["text"])
    assert payload["answers"] == {} and payload["response"] == "neither, go straight"
    assert "chat" in payload["annotation"]
    assert len(turns) == 1 and turns[0]["status"] == "success"
    assert [e.payload["text"] for e in echoes] == ["start", "neither, go straight"]
    assert tables.rows(db.admin_dsn, "chat_queue", "status") == [("delivered",)] * 2


async def test_a_dispatched_workers_handoff_wakes_its_orchestrator_without_user_input(db: DB, tmp_path: Path) -> None:
    handoff = {"goal": "count the files", "current_state": "counted 3 files", "next_step": "none",
               "ruled_out": [], "status": "success", "artifacts": []}
    scenario = Scenario(rules=[
        Rule(role="orchestrator", replies=[
            {"tool_use": {"name": "mcp__harness__dispatch_worker", "input": {"brief": "count the files here"}}},
            {"text": "dispatched; will report back"}]),
        Rule(role="worker", replies=[{"text": "there are 3 files"}]),
        Rule(role="extractor", replies=[{"tool_use": {"name": "StructuredOutput", "input": handoff}},
                                        {"text": "done"}]),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _autonomous(http)
            await http.post("/api/chat", json={"text": "how many files are there?", "thread_id": thread})
            turns = await h.ended_turns(2, timeout=120)
            all_events = await h.events()
    reports = [e for e in all_events if e.event_type == "thread.harness_message"]
    assert len(reports) == 1 and "counted 3 files" in reports[0].payload["text"]
    assert turns[1]["brief"].startswith("[harness] Worker") and "counted 3 files" in turns[1]["brief"]
    assert [e.event_type for e in all_events if e.tier == "derived"] == ["handoff", "policy.decision"]
    assert [e.payload["action"] for e in all_events if e.event_type == "policy.decision"] == ["report"]
    user_messages = [e for e in all_events if e.event_type == "task.user_message"]
    assert [e.payload["text"] for e in user_messages] == ["how many files are there?"]  # no input after the first


def _step(n: str) -> list[Rule]:
    done = {"goal": f"step {n}", "current_state": f"step {n} done", "next_step": "the next step", "ruled_out": [],
            "status": "success", "artifacts": []}
    return [Rule(role="extractor", match=f"do step {n}", replies=[
        {"tool_use": {"name": "StructuredOutput", "input": done}}, {"text": "ok"}])]


async def test_one_message_drives_three_chained_workers_and_a_final_reply_without_more_input(
    db: DB, tmp_path: Path
) -> None:
    def dispatch(n: str) -> dict[str, Any]:
        return {"tool_use": {"name": "mcp__harness__dispatch_worker", "input": {"brief": f"do step {n}"}}}

    scenario = Scenario(rules=[
        # each handoff report names the finished step; the orchestrator answers it with the next dispatch
        Rule(role="orchestrator", match_last="step one done", replies=[dispatch("two")]),
        Rule(role="orchestrator", match_last="step two done", replies=[dispatch("three")]),
        Rule(role="orchestrator", match_last="step three done", replies=[{"text": "All three steps are done."}]),
        Rule(role="orchestrator", replies=[dispatch("one"), {"text": "working on it"}]),
        Rule(role="worker", replies=[{"text": "did my step"}]),
        *_step("one"), *_step("two"), *_step("three"),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _autonomous(http)
            await http.post("/api/chat", json={"text": "do the three steps", "thread_id": thread})
            events: list[Event] = []

            async def replied() -> bool:
                nonlocal events
                events = await h.events()
                return any(e.event_type == "stream.result" and e.payload.get("result") == "All three steps are done."
                           for e in events)

            await until(replied, lambda: f"the final reply; the last events: {[e.event_type for e in events][-20:]}",
                        240, every=0.2)
            turns = await h.ended_turns(4, timeout=60)
            workers = [brief for (brief,) in tables.tasks(db.admin_dsn, "brief", role="worker")]
    handoffs = [e.payload["goal"] for e in events if e.event_type == "handoff"]
    assert workers == ["do step one", "do step two", "do step three"]
    assert handoffs == ["step one", "step two", "step three"]
    assert len(turns) >= 4 and all(t["status"] == "success" for t in turns)
    assert [e.payload["text"] for e in events if e.event_type == "task.user_message"] == ["do the three steps"]


async def _pending_asks(http: httpx.AsyncClient, timeout: float = 60) -> list[dict[str, Any]]:
    async def pending() -> list[dict[str, Any]]:
        asks: list[dict[str, Any]] = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
        return asks

    return await until(pending, "a pending ask", timeout)


async def _running(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    running: list[dict[str, Any]] = (await http.get("/api/tasks", params={"running": "true"})).json()["tasks"]
    return running


async def test_a_workers_handoff_never_answers_the_question_the_thread_is_waiting_on(db: DB, tmp_path: Path) -> None:
    question = {"question": "Which way?", "header": "Way", "multiSelect": False,
                "options": [{"label": "Left", "description": ""}, {"label": "Right", "description": ""}]}
    handoff = {"goal": "count the files", "current_state": "counted 3 files", "next_step": "none",
               "ruled_out": [], "status": "success", "artifacts": []}
    scenario = Scenario(rules=[
        Rule(role="orchestrator", match_last="[harness]", replies=[{"text": "noted the report"}]),
        # dispatch (returns at once in an autonomous thread), then ask while the worker runs
        Rule(role="orchestrator", replies=[
            {"tool_use": {"name": "mcp__harness__dispatch_worker", "input": {"brief": "count the files here"}}},
            {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [question]}}},
            {"text": "going that way"}]),
        Rule(role="worker", replies=[{"text": "there are 3 files"}]),
        Rule(role="extractor", replies=[{"tool_use": {"name": "StructuredOutput", "input": handoff}},
                                        {"text": "done"}]),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _autonomous(http)
            await http.post("/api/chat", json={"text": "start", "thread_id": thread})
            conn = await h._conn()
            asks = await _pending_asks(http)
            # the worker's report is queued for the thread while the question is still open
            await until(lambda: _harness_queued(conn), "the worker's report queued for the thread", 120)
            # several delivery passes (the report wakes the loop at once; it polls every second); a closed question
            # does not reopen, so one look after the window is enough
            await asyncio.sleep(3)  # a window in which the report must not close the question
            pending = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
            assert [a["id"] for a in pending] == [asks[0]["id"]], "the report closed the user's question"
            await http.post("/api/chat", json={"text": "left, please", "thread_id": thread})
            turns = await h.ended_turns(2, timeout=120)
            first = await h.events(turns[0]["id"])
            all_events = await h.events()
            answered = tables.rows(db.admin_dsn, "questions", "response", "answered_via", asked_by="model")
    results = [b for e in first if e.event_type == "stream.user" for b in e.payload["message"]["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result"]
    ask_result = json.loads(results[-1]["content"] if isinstance(results[-1]["content"], str)
                            else results[-1]["content"][0]["text"])
    assert ask_result["response"] == "left, please" and ask_result["answers"] == {}
    assert answered == [("left, please", "chat")]
    assert [e.payload["text"] for e in all_events if e.event_type == "task.user_message"] == ["start", "left, please"]
    reports = [e for e in all_events if e.event_type == "thread.harness_message"]
    assert len(reports) == 1 and reports[0].task_id == turns[1]["id"]  # delivered at the turn boundary
    assert turns[1]["brief"].startswith("[harness] Worker") and "counted 3 files" in turns[1]["brief"]


async def test_a_rename_and_an_archive_are_applied_by_the_executor_and_an_archived_thread_takes_no_message(
    db: DB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no poll to fall back on: the controls' and the messages' own wake-ups must carry them
    monkeypatch.setattr(executor_threads, "POLL_S", 600.0)
    with ScriptedModelServer(Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "hi"}])])) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _autonomous(http, "Plan")
            await http.post("/api/chat", json={"text": "hello", "thread_id": thread})
            await h.ended_turns(1)
            patched = await http.patch(f"/api/threads/{thread}", json={"title": "Renamed", "archived": True})
            conn = await h._conn()
            await until(lambda: _none_left(conn, "SELECT count(*) FROM thread_control_queue WHERE status <> 'done'"),
                        "the thread's controls applied", 30)
            late = await http.post("/api/chat", json={"text": "too late", "thread_id": thread})
            await until(lambda: _none_left(conn, "SELECT count(*) FROM chat_queue WHERE status = 'pending'"),
                        "the late message handled", 30)
            session = tables.thread(db.admin_dsn, thread, "title", "lifecycle")
            refused = tables.rows(db.admin_dsn, "chat_queue", "status", "error", text="too late")
            events = [e for e in await h.events() if e.session_id is not None and str(e.session_id) == thread]
            turns = await h.ended_turns(1)
    assert patched.status_code == 202
    assert session == ("Renamed", "archived")
    changes = [(e.event_type, e.payload) for e in events if e.event_type in ("thread.renamed", "thread.archived")]
    assert [t for t, _ in changes] == ["thread.renamed", "thread.archived"] and changes[0][1]["title"] == "Renamed"
    assert late.status_code == 202 and refused == [("failed", "the thread is archived")]
    assert len(turns) == 1  # no turn for the archived thread


async def test_a_journal_append_naming_the_thread_is_not_blocked_by_a_turn_starting_on_it(db: DB) -> None:
    # A turn's start holds its thread's row and then appends; the journal writer may meanwhile be
    # appending an event that names the thread (holding the journal head while its key is checked).
    # The thread's lock must not block that check, or the two deadlock (1 s lost, one side aborted).
    thread = uuid.uuid4()
    async with await psycopg.AsyncConnection.connect(db.executor_dsn, autocommit=True) as conn:
        await conn.execute(executor_queries["create_thread"],
                           {"id": thread, "title": "t", "mode": "interactive", "project_id": None})
    async with await psycopg.AsyncConnection.connect(db.executor_dsn) as turn, \
            await psycopg.AsyncConnection.connect(db.executor_dsn) as writer:
        async with turn.transaction():
            await turn.execute(executor_queries["lock_thread_for_turn"], {"id": thread})
            async with writer.transaction():  # the writer's batch, while the turn's lock is held
                await asyncio.wait_for(journal.append_on(writer, [NewEvent("thread.created", {}, session_id=thread)]), 5)
            await journal.append_on(turn, [NewEvent("thread.created", {"second": True}, session_id=thread)])
    assert [p for (p,) in tables.records(db.admin_dsn, "payload", session_id=thread)] == [{}, {"second": True}]
