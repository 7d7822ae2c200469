"""ask_user_question end to end: the real CLI calls the harness MCP, the answer comes through the ingress."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from shared.models import Event
from tests import tables
from tests.harness import running_executor
from tests.pg import DB
from tests.served import ingress_server
from tests.wait import until

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

# JSON for the API
Q1: dict[str, Any] = {"question": "Which database?", "header": "DB", "multiSelect": False,
      "options": [{"label": "Postgres", "description": "the journal's home"},
                  {"label": "SQLite", "description": "a file"}]}
Q2: dict[str, Any] = {"question": "Which extras?", "header": "Extras", "multiSelect": True,
      "options": [{"label": "Auth", "description": "a"}, {"label": "Cache", "description": "b"},
                  {"label": "Metrics", "description": "c"}]}


def asking(*questions: dict[str, Any]) -> Scenario:
    return Scenario.single({"tool_use": {"name": "mcp__harness__ask_user_question",
                                         "input": {"questions": list(questions)}}},
                           {"text": "thanks, carrying on"}, role="worker")


async def _pending(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    asks: list[dict[str, Any]] = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
    return asks


async def _pending_ask(http: httpx.AsyncClient, timeout: float = 60) -> dict[str, Any]:
    async def first() -> dict[str, Any] | None:
        asks = await _pending(http)
        return asks[0] if asks else None
    return await until(first, "a pending question", timeout)


def _tool_result(events: list[Event]) -> dict[str, Any]:
    for e in events:
        if e.event_type == "stream.user":
            for block in e.payload["message"]["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    content = block["content"]
                    text = content if isinstance(content, str) else "".join(c.get("text", "") for c in content)
                    return {"is_error": block.get("is_error", False), "text": text}
    raise AssertionError("no tool_result in the stream")


async def _round_trip(db: DB, tmp: Path, scenario: Scenario, answer: Any, *, method: str = "post",
                      ask_timeout_s: float = 60, answer_after_s: float = 0,
                      extra_env: dict[str, str] | None = None, **config_kw: Any
                      ) -> tuple[dict[str, Any], dict[str, Any], list[Event], dict[str, Any]]:
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp, ask_timeout_s=ask_timeout_s, extra_env=extra_env,
                                    **config_kw) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            workdir = tmp / "work"
            task_id = await h.dispatch("ask me", workdir=workdir)
            ask = await _pending_ask(http)
            task_row = await h.wait_task(task_id, lambda r: r["activity"] == "awaiting_user", 30)
            await asyncio.sleep(answer_after_s)  # the user answers this late: the delay is what is tested
            if answer is not None:
                if method == "delete":
                    reply = await http.delete(f"/api/asks/{ask['tool_use_id']}")
                else:
                    reply = await http.post(f"/api/asks/{ask['tool_use_id']}/answer", json=answer)
                assert reply.status_code == 200, reply.text
            row = await h.wait_final(task_id, timeout=ask_timeout_s + 90)
            events = await h.events(task_id)
    return ask, row, events, task_row


async def test_an_answer_posted_to_the_ingress_reaches_claude_as_the_tool_result(db: DB, tmp_path: Path) -> None:
    ask, row, events, during = await _round_trip(
        db, tmp_path, asking(Q1, Q2),
        {"answers": {"Which database?": "Postgres", "Which extras?": ["Auth", {"other": "tracing"}]}})

    assert during["activity"] == "awaiting_user"
    assert ask["tool_use_id"].startswith("toolu_") and ask["questions"][0]["question"] == "Which database?"
    uses = [b for e in events if e.event_type == "stream.assistant" for b in e.payload["message"]["content"]
            if b["type"] == "tool_use"]
    assert uses[0]["id"] == ask["tool_use_id"]  # _meta's toolUseId is the stream's tool_use id
    result = _tool_result(events)
    assert not result["is_error"]
    payload = json.loads(result["text"])
    assert payload["answers"] == {"Which database?": "Postgres", "Which extras?": ["Auth", "tracing"]}
    assert [q["question"] for q in payload["questions"]] == ["Which database?", "Which extras?"]
    assert row["status"] == "success"
    types = [e.event_type for e in events]
    assert types.index("question.asked") < types.index("question.answered") < types.index("task.exited")
    assert "task.stalled" not in types


async def test_a_dismissal_with_a_reply_returns_no_answers_and_the_reply(db: DB, tmp_path: Path) -> None:
    _, row, events, _ = await _round_trip(db, tmp_path, asking(Q1), {"response": "Use whatever the repo uses"})
    payload = json.loads(_tool_result(events)["text"])
    assert payload["answers"] == {} and payload["response"] == "Use whatever the repo uses"
    assert row["status"] == "success"


async def test_a_cancel_returns_no_answers_and_says_the_user_dismissed_it(db: DB, tmp_path: Path) -> None:
    _, row, events, _ = await _round_trip(db, tmp_path, asking(Q1), {}, method="delete")
    payload = json.loads(_tool_result(events)["text"])
    assert payload["answers"] == {} and "cancelled" in payload["response"]
    assert "question.cancelled" in [e.event_type for e in events]


async def test_an_unanswered_question_times_out_and_is_marked_cancelled(db: DB, tmp_path: Path) -> None:
    ask, row, events, _ = await _round_trip(db, tmp_path, asking(Q1), None, ask_timeout_s=3)
    payload = json.loads(_tool_result(events)["text"])
    assert payload == {"questions": [Q1], "answers": {}, "response": "Timed out waiting for user input"}
    status = tables.rows(db.admin_dsn, "questions", "status", id=ask["id"])
    assert status == [("cancelled",)] and row["status"] == "success"


@pytest.mark.parametrize(
    ("questions", "rule"),
    [
        ([], "1-4 questions"),
        ([Q1, {**Q2, "question": "a?"}, {**Q2, "question": "b?"}, {**Q2, "question": "c?"},
          {**Q2, "question": "d?"}], "1-4 questions"),
        ([{**Q1, "options": Q1["options"][:1]}], "2-4 options"),
        ([{**Q1, "options": Q2["options"] + Q1["options"]}], "2-4 options"),
        ([{**Q1, "header": "Much too long header"}], "header is 1-12 characters"),
        ([Q1, Q1], "question texts must be unique"),
        ([{**Q1, "options": [Q1["options"][0], Q1["options"][0]]}], "labels must be unique"),
    ],
    ids=["none", "five", "one-option", "five-options", "long-header", "dup-question", "dup-label"],
)
async def test_a_broken_input_rule_is_a_tool_error_naming_it_and_nothing_is_asked(
    db: DB, tmp_path: Path, questions: list[dict[str, Any]], rule: str
) -> None:
    with ScriptedModelServer(asking(*questions)) as model:
        async with running_executor(db, model, tmp_path) as h:
            task_id = await h.dispatch("ask badly", workdir=tmp_path / "work")
            row = await h.wait_final(task_id)
            events = await h.events(task_id)
    result = _tool_result(events)
    assert result["is_error"] and rule in result["text"]
    with psycopg.connect(db.admin_dsn) as conn:
        assert tables.count(conn, "questions") == 0
    assert row["status"] == "success"


async def test_concurrent_asks_from_different_workers_do_not_cross(db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(asking(Q1)) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            ids = [await h.dispatch(f"ask {i}", workdir=tmp_path / "work") for i in range(3)]
            seen: list[dict[str, Any]] = []

            async def three() -> list[dict[str, Any]] | None:
                seen[:] = await _pending(http)
                return seen if len(seen) == 3 else None
            asks = await until(three, lambda: f"three pending questions (saw {seen})", 60)
            for ask in asks:  # each answer names the task it was asked from
                reply = await http.post(f"/api/asks/{ask['tool_use_id']}/answer",
                                        json={"answers": {"Which database?": {"other": f"for {ask['task_id']}"}}})
                assert reply.status_code == 200
            results = {}
            for task_id in ids:
                await h.wait_final(task_id)
                results[task_id] = json.loads(_tool_result(await h.events(task_id))["text"])
    assert {str(t): r["answers"]["Which database?"] for t, r in results.items()} == {
        str(t): f"for {t}" for t in ids}


async def test_an_answer_after_45_s_still_arrives_with_the_cli_idle_limit_shortened(db: DB, tmp_path: Path) -> None:
    # The CLI aborts a call silent for ~30 s at this setting. Without the per-server timeout (which
    # would also raise that limit) only the tool's progress notifications keep the call alive.
    _, row, events, _ = await _round_trip(
        db, tmp_path, asking(Q1), {"answers": {"Which database?": "SQLite"}}, answer_after_s=45,
        extra_env={"CLAUDE_CODE_MCP_TOOL_IDLE_TIMEOUT": "10000"}, mcp_timeout_ms=None)
    result = _tool_result(events)
    assert not result["is_error"], result
    assert json.loads(result["text"])["answers"] == {"Which database?": "SQLite"}
    assert row["status"] == "success"


async def test_a_restart_cancels_questions_whose_process_died(db: DB, tmp_path: Path) -> None:
    task = tables.insert_task(db.admin_dsn, status="running")
    qid = tables.insert(db.admin_dsn, "questions", tool_use_id="toolu_dead", task_id=task, questions="[]")
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            # running_executor returns once the MCP port listens; the reconcile runs after that
            await h.wait_event(task, "question.cancelled", 30)
            events = await h.events()
            late = await http.post("/api/asks/toolu_dead/answer", json={"response": "too late"})
    status = tables.rows(db.admin_dsn, "questions", "status", id=qid)
    assert status == [("cancelled",)] and late.status_code == 409
    assert any(e.event_type == "question.cancelled" and e.payload["question_id"] == str(qid) for e in events)


async def test_a_question_that_timed_out_in_a_thread_stays_answerable_and_the_late_answer_comes_as_a_message(
    db: DB, tmp_path: Path
) -> None:
    from petal_dispatch.demo.scripted_model import Rule

    scenario = Scenario(rules=[
        Rule(role="orchestrator", match_last="[harness] A late answer", replies=[{"text": "noted, SQLite then"}]),
        Rule(role="orchestrator", replies=[
            {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [Q1]}}},
            {"text": "no answer; carrying on"}]),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, ask_timeout_s=2) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = (await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
            await http.post("/api/chat", json={"text": "set up storage", "thread_id": thread})
            ask = await _pending_ask(http)
            conn = await h._conn()

            async def first_turn() -> dict[str, Any] | None:
                row = await (await conn.execute(
                    "SELECT id, status FROM tasks WHERE session_id = %s ORDER BY created_at LIMIT 1",
                    [thread])).fetchone()
                return {"id": row[0], "status": row[1]} if row and row[1] not in ("pending", "running") else None
            # the tool returned on the timeout and the turn ended
            turn = await until(first_turn, "the thread's first turn to end", 90)
            still = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
            late = await http.post(f"/api/asks/{ask['id']}/answer", json={"answers": {"Which database?": "SQLite"}})
            again = await http.post(f"/api/asks/{ask['id']}/answer", json={"answers": {"Which database?": "Postgres"}})

            async def late_turn() -> list[tuple[Any, ...]] | None:
                rows = await (await conn.execute(
                    "SELECT brief, status FROM tasks WHERE session_id = %s AND brief LIKE '[harness] A late answer%%'",
                    [thread])).fetchall()
                return rows if rows and rows[0][1] not in ("pending", "running") else None
            rows = await until(late_turn, "the turn that carries the late answer to end", 90)
            turn_events = await h.events(turn["id"])
            events = await h.events()
    payload = json.loads(_tool_result(turn_events)["text"])
    assert payload["answers"] == {} and payload["response"] == "Timed out waiting for user input"
    assert "late" in payload["annotation"]
    assert turn["status"] == "success"
    assert [(a["id"], a["late"]) for a in still] == [(ask["id"], True)]  # the card stays, marked late
    assert late.status_code == 202 and late.json()["late"] is True and late.json()["status"] == "answered"
    assert again.status_code == 409  # answered once
    brief, status = rows[0]
    assert "Which database? → SQLite" in brief and status == "success"
    types = [e.event_type for e in events if e.payload.get("question_id") == ask["id"]]
    assert types == ["question.asked", "question.timed_out", "question.answered"]
    answered = next(e.payload for e in events if e.event_type == "question.answered")
    assert answered["late"] is True and answered["answers"] == {"Which database?": "SQLite"}
    delivered = [e.payload["text"] for e in events if e.event_type == "thread.harness_message"]
    assert len(delivered) == 1 and "SQLite" in delivered[0]
