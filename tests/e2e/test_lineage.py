"""The journal's execution tree (parent_id), written by the real executor around the real CLI on the
scripted model: a worker hangs under the orchestrator's dispatch call, a tool result under its call, an
exit under its spawn, an extractor under the worker's exit, and a handoff under the extraction."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from petal_dispatch.demo.scripted_model import ScriptedModelServer
from tests.harness import running_executor
from tests.pg import DB
from tests.scenarios import handoff, one_worker
from tests.served import ingress_server
from tests.wait import until

HANDOFF = handoff("count the files", "there are 3 files")


def _journal(admin_dsn: str) -> dict[uuid.UUID, dict[str, Any]]:
    with psycopg.connect(admin_dsn, row_factory=dict_row) as conn:
        rows = conn.execute("SELECT j.*, t.role FROM journal j LEFT JOIN tasks t ON t.id = j.task_id"
                            " ORDER BY seq").fetchall()
    return {r["event_id"]: r for r in rows}


def _with_handoff(events: dict[uuid.UUID, dict[str, Any]]) -> dict[uuid.UUID, dict[str, Any]] | None:
    return events if any(e["event_type"] == "handoff" for e in events.values()) else None


def _chain(events: dict[uuid.UUID, dict[str, Any]], start: dict[str, Any]) -> list[dict[str, Any]]:
    chain, e = [], start
    while e["parent_id"] is not None:
        e = events[e["parent_id"]]
        chain.append(e)
    return chain


def _tool_uses(e: dict[str, Any]) -> list[dict[str, Any]]:
    content = (e["payload"].get("message") or {}).get("content") or []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]


async def test_a_worker_hangs_under_its_dispatch_call_and_a_handoff_under_its_workers_exit(
    db: DB, tmp_path: Path
) -> None:
    scenario = one_worker("count the files here", {"text": "3 files"}, said="A worker is counting.",
                          noted="The worker counted 3 files.", result=HANDOFF)
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True), ingress_server(db.ingress_dsn) as url, \
                httpx.AsyncClient(base_url=url) as http:
            made = (await http.post("/api/threads", json={"title": "Files", "mode": "autonomous"})).json()

            async def listed() -> bool:
                return any(t["id"] == made["thread_id"] for t in (await http.get("/api/threads")).json()["threads"])
            await until(listed, "the new thread to be listed", 30)
            sent = await http.post("/api/chat", json={"text": "how many files?", "thread_id": made["thread_id"]})
            assert sent.status_code < 300, sent.text
            events = await until(lambda: _with_handoff(_journal(db.admin_dsn)), "the worker's handoff", every=0.2)
    def by_type(t: str, role: str | None = None) -> list[dict[str, Any]]:
        return [e for e in events.values() if e["event_type"] == t and (role is None or e["role"] == role)]

    [handoff] = by_type("handoff")
    [spawned] = by_type("task.spawned", "worker")
    # the worker's spawn → the orchestrator's line that holds the dispatch_worker call
    call = events[spawned["parent_id"]]
    assert call["event_type"] == "stream.assistant" and call["role"] == "orchestrator"
    assert [b["name"] for b in _tool_uses(call)] == ["mcp__harness__dispatch_worker"]
    # that call's result → the same line
    [result_line] = [e for e in by_type("stream.user", "orchestrator") if e["parent_id"] == call["event_id"]]
    assert result_line["payload"]["message"]["content"][0]["tool_use_id"] == _tool_uses(call)[0]["id"]
    # every exit → its own spawn
    for exited in by_type("task.exited"):
        parent = events[exited["parent_id"]]
        assert (parent["event_type"], parent["task_id"]) == ("task.spawned", exited["task_id"])
    # the handoff → the extractor's exit → the extractor's spawn → the worker's exit → … → the dispatch call
    chain = _chain(events, handoff)
    assert [(e["event_type"], e["role"]) for e in chain] == [
        ("task.exited", "extractor"), ("task.spawned", "extractor"), ("task.exited", "worker"),
        ("task.spawned", "worker"), ("stream.assistant", "orchestrator")]
    assert chain[2]["task_id"] == handoff["task_id"]
