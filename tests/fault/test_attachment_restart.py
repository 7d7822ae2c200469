"""A message with an attachment survives the executor's death between the upload and the turn: after the
restart it is delivered, with its attachment, exactly once (the executor as a process, SIGKILL; the real
CLI against the scripted model; the ingress stays up meanwhile, as it does in production)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
from PIL import Image

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests.fault.test_executor_process import _executor_env, _spawn_executor
from tests import tables
from tests.pg import DB
from tests.served import ingress_server
from tests.wait import until

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row


def _started(admin_dsn: str) -> int:
    return tables.count_events(admin_dsn, "executor.started")


def _said(what: str, log: Path) -> Callable[[], str]:
    return lambda: f"{what}\n{log.read_text()[-3000:]}"


async def test_a_message_sent_while_the_executor_is_dead_is_delivered_with_its_attachment_once(
    db: DB, tmp_path: Path
) -> None:
    img = Image.new("RGB", (16, 16), (250, 200, 0))
    raw = io.BytesIO()
    img.save(raw, format="PNG")
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "seen"}])])
    with ScriptedModelServer(scenario) as model:
        env = _executor_env(db, model, tmp_path)
        log1, log2 = tmp_path / "executor1.log", tmp_path / "executor2.log"
        first = _spawn_executor(env, log1)
        try:
            await until(lambda: _started(db.admin_dsn) == 1, _said("the first executor never started", log1))
            async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
                up = (await http.post("/api/attachments", files={"file": ("s.png", raw.getvalue(), "image/png")}))
                assert up.status_code == 201, up.text
                first.send_signal(signal.SIGKILL)  # after the upload, before the message
                first.wait(10)
                sent = await http.post("/api/chat", json={"text": "look at this", "attachment_ids": [up.json()["id"]]})
                assert sent.status_code == 202, sent.text
                await asyncio.sleep(1.0)  # a window in which nobody may deliver it: no executor runs
                assert tables.rows(db.admin_dsn, "chat_queue", "status") == [("pending",)]
                second = _spawn_executor(env, log2)
                try:
                    def done() -> bool:
                        rows = tables.tasks(db.admin_dsn, "status", role="orchestrator")
                        return bool(rows) and all(r[0] not in ("pending", "running") for r in rows)

                    await until(done, _said("the turn never ended after the restart", log2))
                    await asyncio.sleep(2.0)  # a second delivery would start within this window
                finally:
                    second.send_signal(signal.SIGTERM)
                    second.wait(30)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait(10)
    with psycopg.connect(db.admin_dsn) as conn:
        turns = tables.tasks(conn, "status", "attachment_ids", role="orchestrator")
        queued = tables.rows(conn, "chat_queue", "status")
        stored = tables.rows(conn, "attachments", "sha256", "chat_message_id")
    assert [t[0] for t in turns] == ["success"] and [str(i) for i in turns[0][1]] == [up.json()["id"]]
    assert queued == [("delivered",)] and stored[0][1] == uuid.UUID(sent.json()["id"])
    carrying = [r for r in model.requests if r.role == "orchestrator"
                and any(b.get("type") == "image" for b in r.user_blocks)]
    assert len(carrying) == 1, [r.user_blocks for r in model.requests]
    (image,) = [b for b in carrying[0].user_blocks if b.get("type") == "image"]
    assert hashlib.sha256(base64.b64decode(image["source"]["data"])).digest() == bytes(stored[0][0])


async def test_a_turn_cut_off_by_the_executor_s_death_is_run_again_with_its_attachment(db: DB, tmp_path: Path) -> None:
    img = Image.new("RGB", (16, 16), (0, 200, 80))
    raw = io.BytesIO()
    img.save(raw, format="PNG")
    # slow enough to be killed inside the first run; the re-run waits it out and answers
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"stall": {"seconds": 6, "text": "seen"}}])])
    with ScriptedModelServer(scenario) as model:
        env = _executor_env(db, model, tmp_path)
        log1, log2 = tmp_path / "executor1.log", tmp_path / "executor2.log"
        first = _spawn_executor(env, log1)
        try:
            await until(lambda: _started(db.admin_dsn) == 1, _said("the first executor never started", log1))
            async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
                up = await http.post("/api/attachments", files={"file": ("s.png", raw.getvalue(), "image/png")})
                sent = await http.post("/api/chat", json={"text": "look at this", "attachment_ids": [up.json()["id"]]})
                assert sent.status_code == 202, sent.text
            # the turn's request (with the image) reached the model: the run is mid-turn
            await until(lambda: any(r.role == "orchestrator" for r in model.requests), _said("no turn started", log1))
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            second = _spawn_executor(env, log2)
            try:
                def rerun_done() -> bool:
                    rows = tables.tasks(db.admin_dsn, "status", role="orchestrator")
                    return len(rows) >= 2 and all(r[0] not in ("pending", "running") for r in rows)

                await until(rerun_done, _said("the cut-off turn was not run again", log2), timeout=120)
                await asyncio.sleep(2.0)  # a third run would start within this window
            finally:
                second.send_signal(signal.SIGTERM)
                second.wait(30)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait(10)
    with psycopg.connect(db.admin_dsn) as conn:
        turns = tables.tasks(conn, "id", "status", "retry_of", "attachment_ids", role="orchestrator")
        messages = tables.count_events(conn, "task.user_message")
        ((digest,),) = tables.rows(conn, "attachments", "sha256")
    assert [t[1] for t in turns] == ["crashed", "success"] and turns[1][2] == turns[0][0]
    assert [str(i) for i in turns[1][3]] == [up.json()["id"]]
    assert messages == 1  # the message itself was delivered once; its turn ran again
    carrying = [r for r in model.requests if r.role == "orchestrator"
                and any(b.get("type") == "image" for b in r.user_blocks)]
    assert len(carrying) >= 2
    for request in carrying:
        (image,) = [b for b in request.user_blocks if b.get("type") == "image"]
        assert hashlib.sha256(base64.b64decode(image["source"]["data"])).digest() == bytes(digest)
