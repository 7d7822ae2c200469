"""Attachments into a turn: uploaded through the ingress, queued with their message, fed to the real CLI as
content blocks of its stream-json input, and read by the scripted model (real PostgreSQL, the real CLI)."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from petal_dispatch.demo.scripted_model import Request, Rule, Scenario, ScriptedModelServer
from tests import tables
from tests.harness import Harness, running_executor
from tests.pg import DB
from tests.scenarios import dispatch
from tests.served import ingress_server
from tests.wait import until

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row


async def _pending_asks(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    asks: list[dict[str, Any]] = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
    return asks


def _png() -> bytes:
    img = Image.new("RGBA", (32, 24), (0, 128, 255, 255))
    img.putpixel((1, 1), (255, 0, 0, 128))
    exif = Image.Exif()
    exif[0x010F] = "PhoneMaker"
    out = io.BytesIO()
    img.save(out, format="PNG", exif=exif)
    return out.getvalue()


def _first_turn_request(model: ScriptedModelServer, marker: str) -> Request:
    """The model request of the turn whose user text carries `marker` (the CLI may make side requests)."""
    found = [r for r in model.requests if r.role == "orchestrator"
             and any(marker in b.get("text", "") for b in r.user_blocks if b.get("type") == "text")]
    assert found, [r.user_blocks for r in model.requests]
    return found[0]


async def test_an_image_and_a_text_file_reach_the_model_as_an_image_block_and_inline_text(db: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "seen"}])])
    log = b"2026-12-01 12:00:01 ERROR disk full on /var\n"
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            image = (await http.post("/api/attachments", files={"file": ("screen.png", _png(), "image/png")})).json()
            text = (await http.post("/api/attachments", files={"file": ("server.log", log, "text/plain")})).json()
            sent = await http.post("/api/chat", json={"text": "what is wrong here?",
                                                      "attachment_ids": [image["id"], text["id"]]})
            assert sent.status_code == 202, sent.text
            # the negative control: a message without attachments goes as plain -p input, as before
            (turn,) = await h.ended_turns(1)
            assert (await http.post("/api/chat", json={"text": "and without a file?"})).status_code == 202
            turns = await h.ended_turns(2)
            events = await h.events()
            argv = {e.task_id: e.payload["argv"] for e in events if e.event_type == "task.spawned"}
            echoes = [e.payload for e in events if e.event_type == "task.user_message"]
    assert [t["status"] for t in turns] == ["success", "success"]
    assert [str(i) for i in turn["attachment_ids"]] == [image["id"], text["id"]]
    assert "--input-format" in argv[turn["id"]] and "--input-format" not in argv[turns[1]["id"]]
    # the journal keeps what was sent: each file's name, type, size and hash (the bytes may be purged)
    assert [(a["id"], a["name"], a["media_type"], a["sha256"]) for a in echoes[0]["attachments"]] == [
        (image["id"], "screen.png", "image/png", image["sha256"]), (text["id"], "server.log", "text/plain",
                                                                    text["sha256"])]
    assert "attachments" not in echoes[1]

    blocks = _first_turn_request(model, "what is wrong here?").user_blocks
    images = [b for b in blocks if b.get("type") == "image"]
    assert len(images) == 1 and images[0]["source"]["media_type"] == "image/png"
    decoded = base64.b64decode(images[0]["source"]["data"])
    (stored,) = tables.row(db.admin_dsn, "attachments", image["id"], "sha256")
    assert hashlib.sha256(decoded).digest() == bytes(stored)
    assert bytes(stored).hex() == image["sha256"]
    assert b"PhoneMaker" not in decoded  # the metadata-stripped image, same pixels
    assert Image.open(io.BytesIO(decoded)).tobytes() == Image.open(io.BytesIO(_png())).tobytes()
    text_blocks = "\n".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    assert '[attached file "server.log"]' in text_blocks and log.decode().strip() in text_blocks
    later = _first_turn_request(model, "and without a file?").user_blocks
    assert sum(1 for b in later if b.get("type") == "image") == 1  # only the first turn's, from the history


async def test_a_phone_photo_goes_to_the_model_as_its_copy_within_the_clis_limits_which_the_cli_passes_through(
    db: DB, tmp_path: Path
) -> None:
    side = 1400  # noise: about 5.6 MiB as PNG, over the CLI's byte budget
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, format="PNG", compress_level=1)
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "a photo"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
            photo = (await http.post("/api/attachments", files={"file": ("photo.png", out.getvalue(), "image/png")})).json()
            await http.post("/api/chat", json={"text": "what is in the photo?", "attachment_ids": [photo["id"]]})
            (turn,) = await h.ended_turns(1)
    (row,) = tables.rows(db.admin_dsn, "attachments", "sha256", "model_data", "model_media_type")
    assert turn["status"] == "success"
    stored, copy, copy_type = bytes(row[0]), bytes(row[1]), row[2]
    assert stored.hex() == photo["sha256"] and copy_type == "image/jpeg" and len(copy) < len(out.getvalue()) / 4
    images = [b for b in _first_turn_request(model, "what is in the photo?").user_blocks if b.get("type") == "image"]
    # the CLI re-encodes an image over its limits on every request; the copy is within them, so it goes as made
    assert len(images) == 1 and images[0]["source"]["media_type"] == "image/jpeg"
    assert base64.b64decode(images[0]["source"]["data"]) == copy


PDF = (b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj 2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj "
       b"3 0 obj<</Type/Page/MediaBox[0 0 200 200]/Parent 2 0 R>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n")


async def test_a_pdf_reaches_the_model_as_a_document_block(db: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "read it"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            pdf = (await http.post("/api/attachments", files={"file": ("invoice.pdf", PDF, "application/pdf")})).json()
            assert pdf["media_type"] == "application/pdf"
            await http.post("/api/chat", json={"text": "summarise the invoice", "attachment_ids": [pdf["id"]]})
            (turn,) = await h.ended_turns(1)
    assert turn["status"] == "success"
    documents = [b for b in _first_turn_request(model, "summarise the invoice").user_blocks
                 if b.get("type") == "document"]
    assert len(documents) == 1 and base64.b64decode(documents[0]["source"]["data"]) == PDF


async def test_a_message_with_an_attachment_is_not_taken_as_a_reply_to_a_question_but_waits_for_the_next_turn(
    db: DB, tmp_path: Path
) -> None:
    question = {"question": "Which way?", "header": "Way", "multiSelect": False,
                "options": [{"label": "Left", "description": ""}, {"label": "Right", "description": ""}]}
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[
        {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [question]}}},
        {"text": "ok"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, ask_timeout_s=4) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            await http.post("/api/chat", json={"text": "start"})
            await until(lambda: _pending_asks(http), "the question asked", 60)
            image = (await http.post("/api/attachments", files={"file": ("map.png", _png(), "image/png")})).json()
            await http.post("/api/chat", json={"text": "this way", "attachment_ids": [image["id"]]})
            turns = await h.ended_turns(2)
    # the question timed out unanswered: the reply in chat would have dropped the file
    assert [str(i) for i in turns[1]["attachment_ids"]] == [image["id"]] and turns[1]["brief"] == "this way"
    assert tables.rows(db.admin_dsn, "questions", "answered_via") != [("chat",)]
    blocks = _first_turn_request(model, "this way").user_blocks
    assert sum(1 for b in blocks if b.get("type") == "image") == 1


def _tool_output(model: ScriptedModelServer, brief_marker: str) -> str:
    """What a worker's Bash call printed, as its next model request carried it back."""
    for r in model.requests:
        if r.role != "worker" or not any(brief_marker in b.get("text", "") for b in r.user_blocks):
            continue
        for b in r.user_blocks:
            if b.get("type") == "tool_result":
                content = b.get("content")
                return content if isinstance(content, str) else "".join(c.get("text", "") for c in content or [])
    raise AssertionError(f"no tool result from the worker {brief_marker!r}")


async def test_a_project_worker_finds_the_turns_files_in_its_worktree_outside_its_recorded_changes(
    db: DB, tmp_path: Path
) -> None:
    roots = tmp_path / "roots"
    repo = roots / "repo"
    repo.mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=Test", "-c", "user.email=test@example.invalid"]
    subprocess.run([*git, "init", "--quiet", "-b", "main"], check=True)
    (repo / "app.py").write_text("print('hi')\n")
    subprocess.run([*git, "add", "--all"], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "start"], check=True)
    look = ("sha256sum .petal/attachments/screen.png .petal/attachments/server.log; "
            "git status --porcelain --untracked-files=all; echo listed; printf 'fixed\\n' > fix.txt")
    scenario = Scenario(rules=[
        Rule(role="orchestrator", replies=[dispatch("fix what the screenshot shows"),
                                           dispatch("tidy the readme", attachments=[]), {"text": "dispatched"}]),
        Rule(role="worker", match="fix what the screenshot shows", replies=[
            {"tool_use": {"name": "Bash", "input": {"command": look, "description": "look"}}}, {"text": "fixed"}]),
        Rule(role="worker", match="tidy the readme", replies=[
            {"tool_use": {"name": "Bash", "input": {"command": "ls -a", "description": "look"}}}, {"text": "tidy"}]),
    ])
    log = b"ERROR: the button is grey\n"
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, project_roots=(roots,)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            made = await http.post("/api/projects", json={"slug": "app", "workdir": str(repo)})
            request_id = made.json()["id"]
            project = await until(lambda: _project_made(http, request_id), "the project", 60)
            thread = (await http.post("/api/threads", json={"mode": "autonomous", "project_id": project})).json()
            image = (await http.post("/api/attachments", files={"file": ("screen.png", _png(), "image/png")})).json()
            text = (await http.post("/api/attachments", files={"file": ("server.log", log, "text/plain")})).json()
            sent = await http.post("/api/chat", json={"text": "the button is broken", "thread_id": thread["thread_id"],
                                                      "attachment_ids": [image["id"], text["id"]]})
            assert sent.status_code == 202, sent.text
            workers = await until(lambda: _ended_workers(h, 2), "both workers to end with their changes", 120)
            diffs = {w["brief"].split("\n")[0]: (await http.get(f"/api/tasks/{w['id']}/diff")).json() for w in workers}
    by_brief = {w["brief"].split("\n")[0]: w for w in workers}
    fixer, tidier = by_brief["fix what the screenshot shows"], by_brief["tidy the readme"]
    assert [fixer["status"], tidier["status"]] == ["success", "success"]
    assert [str(i) for i in fixer["attachment_ids"]] == [image["id"], text["id"]] and tidier["attachment_ids"] == []
    # the brief says where the files are; the files are the stored bytes
    assert ".petal/attachments/screen.png (image/png," in fixer["brief"]
    assert ".petal/attachments/server.log (text/plain," in fixer["brief"]
    assert "Files the user sent" not in tidier["brief"]
    printed = _tool_output(model, "fix what the screenshot shows")
    assert f"{image['sha256']}  .petal/attachments/screen.png" in printed, printed
    assert f"{hashlib.sha256(log).hexdigest()}  .petal/attachments/server.log" in printed, printed
    # git does not see them (the folder ignores itself), so the worker's branch holds only its own change
    assert printed.split("listed")[0].strip().splitlines()[-1].endswith(".petal/attachments/server.log"), printed
    assert [f["path"] for f in diffs["fix what the screenshot shows"]["files"]] == ["fix.txt"]
    # the negative control: a worker handed none has no folder at all
    assert ".petal" not in _tool_output(model, "tidy the readme").split()
    # nothing reached the model as an image block for the workers: they read the files
    assert not [b for r in model.requests if r.role == "worker" for b in r.user_blocks if b.get("type") == "image"]


async def _project_made(http: httpx.AsyncClient, request_id: str) -> str | None:
    row = (await http.get(f"/api/project-requests/{request_id}")).json()
    assert row["status"] != "failed", row
    return str(row["result"]["project_id"]) if row["status"] == "done" else None


async def _ended_workers(h: Harness, n: int) -> list[dict[str, Any]] | None:
    conn = await h._conn()
    cur = await conn.execute("SELECT id, brief, status, attachment_ids, changes_recorded_at FROM tasks "
                             "WHERE role = 'worker' ORDER BY created_at")
    rows = [dict(zip(("id", "brief", "status", "attachment_ids", "changes_recorded_at"), r))
            for r in await cur.fetchall()]
    done = [r for r in rows if r["status"] not in ("pending", "running") and r["changes_recorded_at"] is not None]
    return rows if len(rows) >= n and len(done) == len(rows) else None
