"""Input never breaks a thread: refused at the door when it cannot work, and a failed turn heals."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import threads
from tests.harness import Harness, running_executor
from tests.pg import DB
from tests.served import ingress_server

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

QUEUES = ("chat_queue", "thread_control_queue", "stop_queue")


def _queued(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in QUEUES}  # type: ignore[index]


async def _turns(h: Harness, n: int, timeout: float = 90) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        conn = await h._conn()
        cur = await conn.execute("SELECT id, brief, status, status_reason FROM tasks WHERE role = 'orchestrator' "
                                 "ORDER BY created_at")
        rows = [dict(zip(("id", "brief", "status", "reason"), r)) for r in await cur.fetchall()]
        if len(rows) >= n and all(r["status"] not in ("pending", "running") for r in rows[:n]):
            return rows
        assert time.monotonic() < deadline, rows
        await asyncio.sleep(0.1)


async def _argv(h: Harness, task_id: Any) -> list[str]:
    return next(e.payload["argv"] for e in await h.events(task_id) if e.event_type == "task.spawned")


async def test_whitespace_only_text_is_422_and_the_thread_still_answers_the_next_message(db: DB,
                                                                                       tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "noted"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            blank = [await http.post("/api/chat", json={"text": t}) for t in ("", "   ", "\n\t \u3000")]
            queued_after_blank = _queued(db.admin_dsn)["chat_queue"]
            ok = await http.post("/api/chat", json={"text": "a real message"})
            turns = await _turns(h, 1)
    assert [r.status_code for r in blank] == [422, 422, 422]
    assert queued_after_blank == 0
    assert ok.status_code == 202
    assert [(t["brief"], t["status"]) for t in turns] == [("a real message", "success")]


async def test_a_message_to_an_unknown_thread_is_404_and_nothing_is_queued(db: DB) -> None:
    before = _queued(db.admin_dsn)
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        unknown = await http.post("/api/chat", json={"text": "hello?", "thread_id": str(uuid.uuid4())})
        made = await http.post("/api/threads", json={"title": "fresh"})
        # a thread whose creation still waits in the queue is known already: the client may use it at once
        fresh = await http.post("/api/chat", json={"text": "hello", "thread_id": made.json()["thread_id"]})
        default = await http.post("/api/chat", json={"text": "hi", "thread_id": str(threads.DEFAULT_THREAD_ID)})
    after = _queued(db.admin_dsn)
    assert unknown.status_code == 404 and unknown.json()["status"] == 404
    assert (fresh.status_code, default.status_code) == (202, 202)
    assert after["chat_queue"] == before["chat_queue"] + 2  # the two known threads' messages only


async def test_json_nested_100000_deep_is_refused_with_a_4xx_and_writes_nothing(db: DB) -> None:
    deep_array = b"[" * 100_000 + b"]" * 100_000
    deep_object = b'{"text": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001
    just_over = b'{"text": "x", "extra": ' + b"[" * 64 + b"]" * 64 + b"}"
    before = _queued(db.admin_dsn)
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        answers = []
        for path in ("/api/chat", "/api/threads", f"/api/tasks/{uuid.uuid4()}/stop", "/api/asks/x/answer"):
            for body in (deep_array, deep_object, just_over):
                answers.append((path, (await http.post(path, content=body,
                                                       headers={"content-type": "application/json"})).status_code))
        # the string that looks nested is only a string: depth counts brackets outside strings
        stringy = await http.post("/api/chat", json={"text": "[" * 1000})
    assert all(400 <= code < 500 for _, code in answers), answers
    assert stringy.status_code == 202
    assert _queued(db.admin_dsn)["chat_queue"] == before["chat_queue"] + 1


async def test_a_thread_whose_first_turn_failed_before_the_session_existed_starts_it_on_the_next_turn(
        db: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "noted"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            # what an older ingress let through: a prompt the CLI refuses before it stores a session
            with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO chat_queue (thread_id, text) VALUES (%s, '   ')", [threads.DEFAULT_THREAD_ID])
            first = (await _turns(h, 1))[0]
            assert (await http.post("/api/chat", json={"text": "second message"})).status_code == 202
            second = (await _turns(h, 2))[1]
            assert (await http.post("/api/chat", json={"text": "third message"})).status_code == 202
            third = (await _turns(h, 3))[2]
            argvs = [await _argv(h, t["id"]) for t in (first, second, third)]
    thread = str(threads.DEFAULT_THREAD_ID)
    assert first["status"] == "failed"
    assert (second["status"], third["status"]) == ("success", "success")
    # the refused turn left nothing to resume: the next one starts the conversation with its id again
    assert argvs[0][argvs[0].index("--session-id") + 1] == thread
    assert argvs[1][argvs[1].index("--session-id") + 1] == thread
    assert argvs[2][argvs[2].index("--resume") + 1] == thread
