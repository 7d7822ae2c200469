"""Slots (executor/run/supervisor.py): a process parked on the user holds no work slot, a chat turn that waits for
one says so, and a parked process past PETAL_MAX_PARKED is ended with its question left answerable."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests import tables
from tests.harness import Harness, running_executor
from tests.pg import DB
from tests.served import ingress_server
from tests.wait import until

QUESTION: dict[str, Any] = {"question": "Which way?", "header": "Way", "multiSelect": False,
                            "options": [{"label": "Left", "description": ""}, {"label": "Right", "description": ""}]}

SCENARIO = [
    # the turn an answer to an ended parked process's question starts
    Rule(role="orchestrator", match_last="[harness] A late answer", replies=[{"text": "resumed with the answer"}]),
    # a thread told to "park" asks and nobody answers
    Rule(role="orchestrator", match="park", replies=[
        {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [QUESTION]}}},
        {"text": "thanks"}]),
]


async def _threads(http: httpx.AsyncClient, n: int) -> list[str]:
    made = [await http.post("/api/threads", json={"title": f"parked {i}", "mode": "autonomous"}) for i in range(n)]
    assert all(m.status_code == 202 for m in made), [m.text for m in made]
    return [m.json()["thread_id"] for m in made]


async def _park(h: Harness, http: httpx.AsyncClient, threads: list[str]) -> None:
    """Each thread's turn asks, and its process waits on the answer."""
    for i, thread in enumerate(threads):
        assert (await http.post("/api/chat", json={"text": f"park {i}", "thread_id": thread})).status_code == 202
    conn = await h._conn()

    async def parked() -> bool:
        row = await (await conn.execute(
            "SELECT count(*) FROM questions q JOIN tasks t ON t.id = q.task_id "
            "WHERE q.status = 'pending' AND t.status = 'running' AND t.session_id = ANY(%s::uuid[])",
            [threads])).fetchone()
        return row is not None and row[0] == len(threads)
    await until(parked, f"{len(threads)} turns parked on their questions", 120)


async def _turn_of(h: Harness, thread: str) -> dict[str, Any] | None:
    conn = await h._conn()
    cur = await conn.execute(
        "SELECT t.id, t.status, t.activity, t.chat, t.started_at, c.created_at AS sent_at "
        "FROM tasks t JOIN chat_queue c ON c.thread_id = t.session_id "
        "WHERE t.session_id = %s ORDER BY t.created_at LIMIT 1", [thread])
    row = await cur.fetchone()
    return dict(zip(("id", "status", "activity", "chat", "started_at", "sent_at"), row)) if row else None


@pytest.mark.parametrize("parked_hold_slots", [False, True], ids=["parked-hold-no-slot", "control-parked-counted"])
async def test_four_parked_questions_leave_the_slots_to_a_chat_message(
        db: DB, tmp_path: Path, parked_hold_slots: bool) -> None:
    with ScriptedModelServer(Scenario(rules=list(SCENARIO))) as model:
        async with running_executor(db, model, tmp_path, max_workers=4, ask_timeout_s=120,
                                    parked_hold_slots=parked_hold_slots) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            parked, (chat_thread,) = await _threads(http, 4), await _threads(http, 1)
            await _park(h, http, parked)
            assert (await http.post("/api/chat", json={"text": "hello", "thread_id": chat_thread})).status_code == 202
            if not parked_hold_slots:
                turn = await until(lambda: _started(h, chat_thread), "the chat's turn to start", 30)
                assert turn["chat"] is True
                # the database's own clock on both sides: the message's arrival and its turn's claim
                assert (turn["started_at"] - turn["sent_at"]).total_seconds() < 2, turn
                return
            # the control: parked processes counted as running, the message waits, and says so in the store
            waiting = await until(lambda: _waiting(h, chat_thread), "the chat's turn to wait for a slot", 10)
            listed = (await http.get("/api/tasks", params={"thread_id": chat_thread})).json()["tasks"]
            executors = (await http.get("/api/executors")).json()["executors"]
    assert waiting["status"] == "pending" and waiting["started_at"] is None
    assert [(t["id"], t["status"], t["activity"]) for t in listed] == [(str(waiting["id"]), "pending",
                                                                        "waiting_for_slot")]
    assert [(e["load"], e["capacity"]) for e in executors] == [(4, 4)]  # what the page says: 4 of 4 busy


async def _started(h: Harness, thread: str) -> dict[str, Any] | None:
    turn = await _turn_of(h, thread)
    return turn if turn and turn["started_at"] is not None else None


async def _waiting(h: Harness, thread: str) -> dict[str, Any] | None:
    turn = await _turn_of(h, thread)
    return turn if turn and turn["activity"] == "waiting_for_slot" else None


async def test_a_parked_process_past_the_bound_is_ended_and_its_answer_resumes_the_thread_in_a_new_turn(
        db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(Scenario(rules=list(SCENARIO))) as model:
        async with running_executor(db, model, tmp_path, max_workers=4, max_parked=2, ask_timeout_s=120) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            threads = await _threads(http, 3)
            conn = await h._conn()
            # one after another: the first asked is the oldest parked
            for thread in threads[:2]:
                await _park(h, http, [thread])
            await http.post("/api/chat", json={"text": "park 2", "thread_id": threads[2]})

            async def ended() -> dict[str, Any] | None:
                turn = await _turn_of(h, threads[0])
                return turn if turn and turn["status"] not in ("pending", "running") else None
            first = await until(ended, "the oldest parked process to be ended", 120)
            reason = (await (await conn.execute("SELECT status_reason FROM tasks WHERE id = %s",
                                                [first["id"]])).fetchone() or [None])[0]
            pending = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
            ask = next(a for a in pending if a["task_id"] == str(first["id"]))
            others = [await _turn_of(h, t) for t in threads[1:]]
            answered = await http.post(f"/api/asks/{ask['id']}/answer", json={"answers": {"Which way?": "Left"}})

            async def resumed() -> tuple[Any, ...] | None:
                row = await (await conn.execute(
                    "SELECT id, brief, status FROM tasks WHERE session_id = %s AND brief LIKE '[harness] A late%%'",
                    [threads[0]])).fetchone()
                return row if row and row[2] not in ("pending", "running") else None
            late_turn = await until(resumed, "the turn that carries the answer to end", 120)
            events = await h.events()
    assert (first["status"], reason) == ("cancelled", "parked_limit")
    assert ask["late"] is True  # the card stays, answerable
    assert [t["status"] for t in others if t] == ["running", "running"]  # the younger ones still wait
    assert answered.status_code == 202 and answered.json()["status"] == "answered"
    assert "Which way? → Left" in late_turn[1] and late_turn[2] == "success"
    # an end past the bound is a boundary, not a failed turn: nothing offers a Retry of it
    assert not [e for e in events if e.event_type == "turn.failed" and e.task_id == first["id"]]
    question = [e.event_type for e in events if e.payload.get("question_id") == ask["id"]]
    assert question == ["question.asked", "question.answered"]
    reply = [e for e in events if e.event_type == "stream.assistant" and e.task_id == late_turn[0]]
    assert "resumed with the answer" in json.dumps([e.payload for e in reply])


def test_the_default_parked_bound_is_a_quarter_of_available_memory_at_200_mib_each() -> None:
    from executor.run.supervisor import default_max_parked

    mib = 1024 * 1024
    assert default_max_parked(8 * 1024 * mib) == 10  # 8 GiB free: 2 GiB / 200 MiB
    assert default_max_parked(1024 * mib) == 4  # the floor
    assert default_max_parked(64 * 1024 * mib) == 32  # the cap
    assert isinstance(default_max_parked(), int)



@pytest.mark.parametrize("park_after_s", [1.0, None], ids=["parked-past-the-grace", "control-no-grace"])
async def test_a_process_parked_past_the_grace_is_ended_its_question_answerable_and_no_process_held(
        db: DB, tmp_path: Path, park_after_s: float | None) -> None:
    with ScriptedModelServer(Scenario(rules=list(SCENARIO))) as model:
        async with running_executor(db, model, tmp_path, park_after_s=park_after_s, ask_timeout_s=120) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            (thread,) = await _threads(http, 1)
            await _park(h, http, [thread])
            turn = await _turn_of(h, thread)
            assert turn is not None
            if park_after_s is None:
                # the control: without the grace, nothing ends it (must not happen within 3 s: 3 × the grace)
                await asyncio.sleep(3)
                assert (await _turn_of(h, thread) or {}).get("status") == "running"
                assert tables.count_running(db.admin_dsn) == 1
                return

            async def ended() -> dict[str, Any] | None:
                found = await _turn_of(h, thread)
                return found if found and found["status"] not in ("pending", "running") else None
            await until(ended, "the parked process to be ended past its grace", 30)
            held = tables.count_running(db.admin_dsn)
            pending = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
            [ask] = [a for a in pending if a["task_id"] == str(turn["id"])]
            answered = await http.post(f"/api/asks/{ask['id']}/answer", json={"answers": {"Which way?": "Right"}})
            conn = await h._conn()

            async def resumed() -> bool:
                row = await (await conn.execute(
                    "SELECT count(*) FROM tasks WHERE session_id = %s AND brief LIKE '[harness] A late%%' "
                    "AND status = 'success'", [thread])).fetchone()
                return bool(row and row[0])
            await until(resumed, "the answer to resume the thread in a new turn", 120)
    assert held == 0  # the question waits with no process
    assert ask["late"] is True and answered.status_code == 202
    late = [r for r in model.requests if any("Which way? → Right" in str(b.get("text", "")) for b in r.user_blocks)]
    assert late, "the answer reached the model as the next message"
