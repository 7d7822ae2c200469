"""Input never breaks a thread: refused at the door when it cannot work, and a failed turn heals."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

from ingress.auth import AuthConfig
from ingress.http import MAX_JSON_DEPTH
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import threads
from tests.harness import Harness, running_executor
from tests import tables
from tests.pg import DB
from tests.served import ingress_server
from tests.wait import until

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

QUEUES = ("chat_queue", "thread_control_queue", "stop_queue")


def _queued(dsn: str) -> dict[str, int]:
    return {t: tables.count(dsn, t) for t in QUEUES}


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
            turns = await h.ended_turns(1)
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


async def test_json_nested_past_the_depth_limit_is_400_on_real_targets_under_the_size_limit_and_writes_nothing(
        db: DB) -> None:
    deep_array = b"[" * 100_000 + b"]" * 100_000
    deep_object = b'{"text": ' + b'{"a": ' * 20_000 + b"1" + b"}" * 20_001
    just_over = b'{"text": "x", "extra": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}"
    at_limit = b'{"text": "x", "extra": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    # each under the size limit: it is the depth check that answers, not the 413
    assert all(len(b) < AuthConfig.max_body_bytes for b in (deep_array, deep_object, just_over))
    with psycopg.connect(db.admin_dsn) as conn:  # real targets: a thread, a pending task, a pending ask
        tables.ensure_thread(conn, threads.DEFAULT_THREAD_ID, mode="interactive")
        task = tables.insert_task(conn)
        ask = tables.insert(conn, "questions", tool_use_id="toolu_deep", source_session_uuid=threads.DEFAULT_THREAD_ID,
                            questions=json.dumps([{"question": "Go?", "header": "Go", "multiSelect": False, "options": [
                                {"label": "Yes", "description": ""}, {"label": "No", "description": ""}]}]))
    paths = ("/api/chat", "/api/threads", f"/api/tasks/{task}/stop", f"/api/asks/{ask}/answer")
    json_type = {"content-type": "application/json"}
    before = _queued(db.admin_dsn)
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        answers = {}
        for path in paths:
            for name, body in (("array", deep_array), ("object", deep_object), ("just over", just_over)):
                r = await http.post(path, content=body, headers=json_type)
                answers[(path, name)] = (r.status_code, r.json().get("detail", ""))
        # one level less passes the depth check and meets the route's own checks (an unknown field: 422)
        at = {path: (await http.post(path, content=at_limit, headers=json_type)).status_code for path in paths}
        after = _queued(db.admin_dsn)
        still_pending = tables.rows(db.admin_dsn, "questions", "status", id=ask)[0]
        # the targets were real: the same routes take a plain body
        answered = await http.post(f"/api/asks/{ask}/answer", json={"answers": {"Go?": "Yes"}})
        stopped = await http.post(f"/api/tasks/{task}/stop", json={})
        # the string that looks nested is only a string: depth counts brackets outside strings
        stringy = await http.post("/api/chat", json={"text": "[" * 1000})
    refused = f"malformed JSON: nested deeper than {MAX_JSON_DEPTH} levels"
    assert {k: v for k, v in answers.items() if v != (400, refused)} == {}, answers
    assert at == dict.fromkeys(paths, 422), at
    assert after == before and still_pending == ("pending",)
    assert answered.status_code == 200 and stopped.status_code == 202, (answered.text, stopped.text)
    assert stringy.status_code == 202
    assert _queued(db.admin_dsn)["chat_queue"] == before["chat_queue"] + 1


async def test_a_thread_whose_first_turn_failed_before_the_session_existed_starts_it_on_the_next_turn(
        db: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "noted"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            made = await http.post("/api/threads", json={"title": "older", "mode": "interactive"})
            thread = made.json()["thread_id"]

            def created() -> bool:
                return tables.count(db.admin_dsn, "sessions", id=thread) == 1

            await until(created, "the thread's session row")
            # a turn an older version queued with a prompt the CLI refuses before it stores a session (a
            # blank one: the ingress and request_task refuse those now, so it is written as it was then)
            tables.insert_task(db.admin_dsn, session_id=thread, role="orchestrator", brief="   ", status="pending")
            first = (await h.ended_turns(1))[0]
            said = {"text": "second message", "thread_id": thread}
            assert (await http.post("/api/chat", json=said)).status_code == 202
            second = (await h.ended_turns(2))[1]
            assert (await http.post("/api/chat", json={**said, "text": "third message"})).status_code == 202
            third = (await h.ended_turns(3))[2]
            argvs = [await _argv(h, t["id"]) for t in (first, second, third)]
    assert first["status"] == "failed"
    assert (second["status"], third["status"]) == ("success", "success")
    # the refused turn left nothing to resume: the next one starts the conversation with its id again
    assert argvs[0][argvs[0].index("--session-id") + 1] == thread
    assert argvs[1][argvs[1].index("--session-id") + 1] == thread
    assert argvs[2][argvs[2].index("--resume") + 1] == thread


async def test_a_blank_chat_row_from_an_older_ingress_is_refused_visibly_and_the_next_message_gets_its_turn(
        db: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "noted"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            blank = tables.insert(db.admin_dsn, "chat_queue", thread_id=threads.DEFAULT_THREAD_ID, text="   ")

            def refused() -> tuple[str, str] | None:
                found = tables.rows(db.admin_dsn, "chat_queue", "status", "error", id=blank, status="failed")
                return (found[0][0], found[0][1]) if found else None

            # without the refusal the blank row stays pending, and every next message waits behind it
            status, error = await until(refused, "the blank message refused")
            assert (await http.post("/api/chat", json={"text": "second message"})).status_code == 202
            [turn] = await h.ended_turns(1)
    assert (status, error) == ("failed", "a task needs a non-empty brief")
    assert turn["status"] == "success" and turn["brief"].strip() == "second message"
