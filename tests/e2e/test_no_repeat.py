"""Never the same question twice (executor/asks/__init__.py `_once_per_thread`, the demo's scenario): the same questions
pending in a thread are joined, the thread's last answered question asked again is answered with its answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from petal_dispatch.demo.launch import DEMO_SCENARIO
from shared.models import Event
from tests import tables
from tests.harness import Harness, running_executor
from tests.pg import DB
from tests.scenarios import dispatch
from tests.served import ingress_server
from tests.wait import until

DEMO_QUESTION = "The worker found the project has no tests. What should happen next?"


def _question(*labels: str) -> dict[str, Any]:
    return {"question": "Which way?", "header": "Way", "multiSelect": False,
            "options": [{"label": label, "description": ""} for label in labels]}


async def _rows(h: Harness, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return await (await (await h._conn()).execute(sql, list(params))).fetchall()


async def _thread(http: httpx.AsyncClient, mode: str) -> str:
    made = await http.post("/api/threads", json={"title": "no repeats", "mode": mode})
    assert made.status_code == 202, made.text
    thread: str = made.json()["thread_id"]
    return thread


async def _pending(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    asks: list[dict[str, Any]] = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
    return asks


async def _answer(http: httpx.AsyncClient, ask: dict[str, Any], label: str) -> None:
    answered = await http.post(f"/api/asks/{ask['id']}/answer",
                               json={"answers": {ask["questions"][0]["question"]: label}})
    assert answered.status_code in (200, 202), answered.text


def _tool_results(events: list[Event]) -> list[str]:
    texts = []
    for e in events:
        if e.event_type == "stream.user":
            for block in e.payload["message"]["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    content = block["content"]
                    texts.append(content if isinstance(content, str) else "".join(c.get("text", "") for c in content))
    return texts


# ---- the join ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("same", [True, False], ids=["same-questions-joined", "control-other-options"])
async def test_two_identical_asks_in_a_thread_share_one_pending_row_and_both_get_its_answer(
        db: DB, tmp_path: Path, same: bool) -> None:
    second = _question("Left", "Right") if same else _question("Left", "Right", "Straight")
    scenario = Scenario(rules=[
        Rule(role="orchestrator", match_last="[harness]", replies=[{"text": "noted"}]),
        Rule(role="orchestrator", replies=[dispatch("ask one"), dispatch("ask two"), {"text": "both asked"}]),
        Rule(role="worker", match="ask one", replies=[
            {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [_question("Left",
                                                                                                  "Right")]}}},
            {"text": "done"}]),
        Rule(role="worker", match="ask two", replies=[
            {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [second]}}},
            {"text": "done"}]),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, ask_timeout_s=120) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _thread(http, "autonomous")
            assert (await http.post("/api/chat", json={"text": "ask twice", "thread_id": thread})).status_code == 202

            async def both_waiting() -> list[tuple[Any, ...]] | None:
                rows = await _rows(h, "SELECT id FROM tasks WHERE role = 'worker' AND status = 'running' "
                                      "AND activity = 'awaiting_user'")
                return rows if len(rows) == 2 else None
            workers = [r[0] for r in await until(both_waiting, "both workers waiting on the user", 120)]
            rows = tables.rows(db.admin_dsn, "questions", "id", "status", asked_by="model")
            pending = await _pending(http)
            for ask in pending:
                await _answer(http, ask, "Left")
            ended = [await h.wait_final(w, timeout=60) for w in workers]
            results = [_tool_results(await h.events(w)) for w in workers]
    assert len(rows) == (1 if same else 2), rows
    assert len(pending) == len(rows)
    assert [r["status"] for r in ended] == ["success", "success"]
    for texts in results:
        assert len(texts) == 1 and json.loads(texts[0])["answers"] == {"Which way?": "Left"}, texts


# ---- a demo session of 20 exchanges ----------------------------------------------------------------------------

async def test_a_demo_session_of_twenty_exchanges_never_asks_the_same_question_twice(db: DB, tmp_path: Path) -> None:
    scenario = Scenario.from_data(json.loads(DEMO_SCENARIO.read_text()))
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, ask_timeout_s=4, extract=True) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _thread(http, "interactive")
            exchanges = 0
            turns = 0

            async def turns_ended(n: int) -> bool:
                rows = await _rows(h, "SELECT count(*) FILTER (WHERE status NOT IN ('pending', 'running')), "
                                      "count(*) FROM tasks WHERE session_id = %s AND role = 'orchestrator'",
                                   thread)
                queued = await _rows(h, "SELECT count(*) FROM chat_queue WHERE thread_id = %s "
                                        "AND status IN ('pending', 'claimed')", thread)
                return bool(rows[0][0] == rows[0][1] == n and queued[0][0] == 0)

            async def exchange(what: str, text: str | None = None, *, new_turns: int = 1) -> None:
                nonlocal exchanges, turns
                if what == "chat":
                    sent = await http.post("/api/chat", json={"text": text, "thread_id": thread})
                    assert sent.status_code == 202, sent.text
                elif what == "harness":  # what the settler sends: a handoff, an approval, a late answer
                    tables.insert(db.admin_dsn, "chat_queue", thread_id=thread, text=text, origin="harness")
                exchanges += 1
                turns += new_turns
                await until(lambda: turns_ended(turns), f"exchange {exchanges} ({what}) to settle", 120)

            # 1: the user's message dispatches a worker, which waits for approval (an interactive thread)
            await exchange("chat", "survey the project")
            approval = await until(lambda: _first(http), "the approval", 30)
            # 2-3: approved: the approval's message, then the worker's handoff, whose turn asks what next; the
            # question times out (ask_timeout_s) and stays answerable
            await _answer(http, approval, "Approve")
            exchanges += 1
            turns += 2
            await until(lambda: turns_ended(turns), "the approval and the handoff to be told", 180)
            exchanges += 1
            late = await until(lambda: _first(http), "the demo's question, late", 30)
            assert late["questions"][0]["question"] == DEMO_QUESTION and late["late"] is True
            # 4: the late answer comes back as a harness message
            await _answer(http, late, "Add tests")
            exchanges += 1
            turns += 1
            await until(lambda: turns_ended(turns), "the late answer to be told", 120)
            worker = tables.tasks(db.admin_dsn, "id", role="worker")[0][0]
            handoff = f"[harness] Worker {worker} finished. Its handoff:\ngoal: survey\nstate: no tests"
            repeats = [
                ("harness", handoff),
                ("chat", "what now?"),
                ("harness", f"[harness] The user approved worker {worker}; it is starting now."),
                ("harness", "[harness] A late answer: the user answered your question after ask_user_question "
                            "had stopped waiting.\n- " + DEMO_QUESTION + " → Add tests"),
                ("chat", "thanks"),
                ("harness", handoff),
            ]
            while exchanges < 20:
                what, text = repeats[exchanges % len(repeats)]
                await exchange(what, text)
            counts = await _rows(h, """
                WITH RECURSIVE tree(id) AS (
                    SELECT id FROM tasks WHERE session_id = %s
                    UNION SELECT c.id FROM tree JOIN tasks c ON c.parent_task_id = tree.id)
                SELECT q.questions::text, count(*) FROM questions q WHERE q.task_id IN (SELECT id FROM tree)
                GROUP BY 1""", thread)
            events = await h.events()
            still = await _pending(http)
    assert exchanges == 20
    assert counts and all(n == 1 for _, n in counts), counts
    assert any(DEMO_QUESTION in text for text, _ in counts)
    assert not still
    # the repeated handoffs asked again and were answered from the thread's answer, nothing put up
    again = [e for e in events if e.event_type == "question.answered" and e.payload.get("already_answered")]
    assert again and all(e.payload["answers"] == {DEMO_QUESTION: "Add tests"} for e in again)


async def _first(http: httpx.AsyncClient) -> dict[str, Any] | None:
    pending = await _pending(http)
    return pending[0] if pending else None
