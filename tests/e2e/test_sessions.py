"""Conversations begun in a terminal, continued from the phone, and handed back: the real CLI run directly (its
own HOME and config directory, as a terminal would), the executor's index of its files, adoption into a thread,
the phone's turns resuming it, the terminal going on with it."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from executor.sandbox.cliconfig import session_dir
from executor.sessions.index import SessionsConfig
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import threads
from tests import tables, wait
from tests.harness import Harness, claude_bin, running_executor
from tests.pg import DB
from tests.served import ingress_server

pytestmark = pytest.mark.e2e


def _scenario() -> Scenario:
    # by what was said, not by role: a resumed conversation keeps the system prompt of its first run (the
    # terminal's), so the phone's turns carry no role marker (docs/claude-cli.md "Stored conversations")
    return Scenario(rules=[Rule(match_last="phone", replies=[{"text": "phone reply"}]),
                           Rule(replies=[{"text": "terminal reply"}])])


class Terminal:
    """The CLI as someone at the desk runs it: its own HOME and config directory, in a project directory."""

    def __init__(self, model: ScriptedModelServer, root: Path, cwd: Path):
        self.home, self.config, self.cwd = root / "home", root / "claude", cwd
        self.home.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home),
                    "CLAUDE_CONFIG_DIR": str(self.config), "ANTHROPIC_BASE_URL": model.url,
                    "ANTHROPIC_API_KEY": "sk-ant-fake", "NO_PROXY": "127.0.0.1,localhost",
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                    "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_MAX_RETRIES": "0"}

    def argv(self, *extra: str) -> list[str]:
        return [claude_bin(), "-p", "--output-format", "stream-json", "--verbose", *extra]

    async def say(self, prompt: str, resume: str | None = None) -> str:
        """One turn, to its end; the conversation's id."""
        proc = await asyncio.create_subprocess_exec(
            *self.argv(*(["--resume", resume] if resume else [])), prompt, cwd=self.cwd, env=self.env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        result = [json.loads(x) for x in out.decode().splitlines() if x.strip()][-1]
        assert result["type"] == "result" and not result["is_error"], result
        return str(result["session_id"])

    def file(self, session_id: str) -> Path:
        return next((self.config / "projects").glob(f"*/{session_id}.jsonl"))


def stored_conversation(config: Path, cwd: Path, *exchanges: tuple[str, str]) -> str:
    """A conversation file as the CLI stores one (docs/claude-cli.md), written directly: for what needs the
    file only (the index, the picker, adoption), not a run. Its id."""
    session_id = str(uuid.uuid4())
    lines = []
    for i, (prompt, reply) in enumerate(exchanges):
        for role, text in (("user", prompt), ("assistant", [{"type": "text", "text": reply}])):
            lines.append({"type": role, "message": {"role": role, "content": text}, "uuid": str(uuid.uuid4()),
                          "timestamp": f"2026-12-01T10:00:{i:02d}.000Z", "cwd": str(cwd), "sessionId": session_id,
                          "gitBranch": "main", "isSidechain": False})
    path = session_dir(config, cwd) / f"{session_id}.jsonl"  # where the CLI keeps that directory's conversations
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return session_id


async def _listed(http: httpx.AsyncClient, session_id: str, **params: str) -> dict[str, Any] | None:
    rows = (await http.get("/api/claude-sessions", params=params)).json()["sessions"]
    return next((r for r in rows if r["session_id"] == session_id), None)


async def _listed_with(http: httpx.AsyncClient, session_id: str, messages: int) -> dict[str, Any] | None:
    row = await _listed(http, session_id)
    # and no longer live: the terminal's run has exited (a pass during its turn saw it live)
    return row if row and row["message_count"] == messages and not row["live"] else None


async def _chat(h: Harness, thread_id: str) -> list[tuple[str, str, bool]]:
    """(type, text, imported) of the records the thread's Chat renders as messages, in journal order."""
    conn = await h._conn()
    cur = await conn.execute(
        "SELECT event_type, payload FROM journal WHERE session_id = %s AND event_type IN "
        "('task.user_message', 'stream.result', 'thread.harness_message') ORDER BY seq", (uuid.UUID(thread_id),))
    return [(t, p.get("text") or p.get("result") or "", "imported" in p) for t, p in await cur.fetchall()]


async def _turns_done(h: Harness, thread_id: str, n: int) -> list[dict[str, Any]]:
    conn = await h._conn()

    async def done() -> list[dict[str, Any]] | None:
        cur = await conn.execute("SELECT id, status, executor_name, settled_at FROM tasks WHERE session_id = %s "
                                 "ORDER BY created_at", (uuid.UUID(thread_id),))
        rows = [dict(zip(("id", "status", "executor", "settled_at"), r)) for r in await cur.fetchall()]
        return rows if len(rows) >= n and all(r["settled_at"] is not None for r in rows[:n]) else None
    return await wait.until(done, f"{n} turns of thread {thread_id} settled", timeout=90)


async def _spawned_argv(h: Harness, task_id: Any) -> tuple[list[str], str]:
    spawned = [e for e in await h.events(task_id) if e.event_type == "task.spawned"][0].payload
    return spawned["argv"], spawned["workdir"]


def _model_saw(model: ScriptedModelServer, *texts: str) -> bool:
    """Whether the model's latest request that carries the last of `texts` carries them all."""
    said = [json.dumps(r.body.get("messages")) for r in model.requests]
    last = [m for m in said if texts[-1] in m]
    return bool(last) and all(t in last[-1] for t in texts)


async def _adopt(http: httpx.AsyncClient, session_id: str, **more: Any) -> str:
    made = await http.post("/api/threads", json={"adopt_session_id": session_id, **more})
    assert made.status_code == 202, made.text
    return str(made.json()["thread_id"])


async def test_a_terminal_conversation_is_listed_adopted_continued_from_the_phone_and_handed_back(
        db: DB, tmp_path: Path) -> None:
    roots = tmp_path / "projects"
    with ScriptedModelServer(_scenario()) as model:
        term = Terminal(model, tmp_path / "desk", roots / "my app")
        sessions = SessionsConfig(dirs=(term.config,), poll_s=0.2)
        async with running_executor(db, model, tmp_path, project_roots=(roots,), sessions=sessions) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            sid = await term.say("first terminal prompt")
            assert await term.say("second terminal prompt", resume=sid) == sid
            # listed by the index's poll (0.2 s here), not by the turn's end: within seconds even on busy cores (5 s
            # was once missed by 0.4 s beside a full parallel pass)
            row = await wait.until(lambda: _listed_with(http, sid, 4), "the terminal's conversation listed", timeout=15)
            assert row["title"] == "first terminal prompt" and row["cwd"] == str(term.cwd), row
            assert row["readable"] and row["adoptable"] and not row["live"] and row["message_count"] == 4, row
            # searchable by text and by directory; another directory finds nothing
            assert await _listed(http, sid, q="FIRST terminal") and await _listed(http, sid, dir=str(roots))
            assert await _listed(http, sid, dir=str(tmp_path / "elsewhere")) is None

            thread = await _adopt(http, sid)
            got = await wait.until(lambda: _thread(http, thread), "the adopted thread made")
            assert got["adopted_session_id"] == sid
            # the CLI by its path: the pinned one is not a terminal's `claude` on PATH
            assert got["resume_command"] == (f"cd '{term.cwd}' && CLAUDE_CONFIG_DIR={term.config} "
                                             f"{claude_bin()} --resume {sid} {shlex.join(threads.HANDBACK_FLAGS)}"), got
            chat = await _chat(h, thread)
            assert [(t, x) for t, x, imported in chat if imported] == [
                ("task.user_message", "first terminal prompt"), ("stream.result", "terminal reply"),
                ("task.user_message", "second terminal prompt"), ("stream.result", "terminal reply")], chat
            # the conversation page renders them (the records Chat reads)
            page = (await http.get(f"/api/threads/{thread}/conversation")).json()["events"]
            assert [e["payload"].get("text") for e in page if e["event_type"] == "task.user_message"] == [
                "first terminal prompt", "second terminal prompt"]
            assert (await http.post("/api/threads", json={"adopt_session_id": sid})).status_code == 409

            # the phone's turn continues the conversation itself, in its directory, with what was said before
            assert (await http.post("/api/chat", json={"thread_id": thread, "text": "phone message"})).status_code == 202
            first = (await _turns_done(h, thread, 1))[0]
            assert first["status"] == "success", first
            argv, workdir = await _spawned_argv(h, first["id"])
            assert argv[argv.index("--resume") + 1] == sid and "--fork-session" not in argv
            assert workdir == str(term.cwd)
            assert _model_saw(model, "first terminal prompt", "second terminal prompt", "phone message")

            # back at the desk: the terminal goes on with it; the thread shows what it said, once
            assert await term.say("terminal after the phone", resume=sid) == sid
            await wait.until(lambda: _has(h, thread, "terminal after the phone"), "the terminal's turn in the thread")
            chat = await _chat(h, thread)
            assert [x for t, x, _ in chat if t == "task.user_message"] == [
                "first terminal prompt", "second terminal prompt", "phone message", "terminal after the phone"], chat
            assert [x for t, x, imp in chat if t == "stream.result" and not imp] == ["phone reply"]

            # and the next phone turn sees both
            assert (await http.post("/api/chat", json={"thread_id": thread, "text": "phone again"})).status_code == 202
            await _turns_done(h, thread, 2)
            assert _model_saw(model, "phone message", "terminal after the phone", "phone again")


async def _thread(http: httpx.AsyncClient, thread_id: str) -> dict[str, Any] | None:
    got = await http.get(f"/api/threads/{thread_id}")
    return got.json() if got.status_code == 200 else None


async def _has(h: Harness, thread_id: str, text: str) -> bool:
    return any(x == text for _, x, _ in await _chat(h, thread_id))


async def test_a_conversation_a_live_terminal_holds_is_forked_and_its_file_left_alone(db: DB, tmp_path: Path) -> None:
    roots = tmp_path / "projects"
    with ScriptedModelServer(_scenario()) as model:
        term = Terminal(model, tmp_path / "desk", roots / "app")
        sessions = SessionsConfig(dirs=(term.config,), poll_s=0.2)
        async with running_executor(db, model, tmp_path, project_roots=(roots,), sessions=sessions) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            sid = await term.say("started at the desk")
            # the terminal stays open on the conversation (a long-lived CLI that has taken one message)
            live = await asyncio.create_subprocess_exec(
                *term.argv("--input-format", "stream-json", "--resume", sid), cwd=term.cwd, env=term.env,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
            try:
                assert live.stdin is not None and live.stdout is not None
                live.stdin.write(json.dumps({"type": "user", "message": {"role": "user",
                                                                         "content": "still here"}}).encode() + b"\n")
                await live.stdin.drain()
                while json.loads(await asyncio.wait_for(live.stdout.readline(), 30)).get("type") != "result":
                    pass
                row = await wait.until(lambda: _live(http, sid), "the conversation listed as held", timeout=10)
                assert row["live_pid"] == live.pid, row
                before = term.file(sid).read_bytes()

                thread = await _adopt(http, sid)
                await wait.until(lambda: _thread(http, thread), "the adopted thread made")
                chat = await _chat(h, thread)
                assert any(t == "thread.harness_message" and "fork" in x for t, x, _ in chat), chat
                assert (await http.post("/api/chat", json={"thread_id": thread, "text": "from the phone"})
                        ).status_code == 202
                turn = (await _turns_done(h, thread, 1))[0]
                assert turn["status"] == "success", turn
                argv, _ = await _spawned_argv(h, turn["id"])
                assert argv[argv.index("--resume") + 1] == sid and "--fork-session" in argv
                assert argv[argv.index("--session-id") + 1] == thread
                assert _model_saw(model, "started at the desk", "still here", "from the phone")
                assert term.file(sid).read_bytes() == before  # the terminal's conversation is untouched
                assert term.file(thread).is_file()  # the thread's fork, beside it
                got = await _thread(http, thread)
                assert got is not None and f"{claude_bin()} --resume {thread} " in got["resume_command"], got
            finally:
                if live.returncode is None:
                    live.terminate()
                await live.wait()


async def _live(http: httpx.AsyncClient, sid: str) -> dict[str, Any] | None:
    row = await _listed(http, sid)
    return row if row and row["live"] else None


async def test_outside_the_roots_is_403_a_corrupt_file_is_unreadable_and_unknown_is_404(db: DB, tmp_path: Path) -> None:
    roots = tmp_path / "projects"
    with ScriptedModelServer(_scenario()) as model:
        term = Terminal(model, tmp_path / "desk", tmp_path / "elsewhere")
        corrupt = term.config / "projects" / "-x" / f"{uuid.uuid4()}.jsonl"
        corrupt.parent.mkdir(parents=True)
        corrupt.write_text(json.dumps({"type": "user", "cwd": str(roots), "message": {"role": "user", "content": "hi"},
                                       "timestamp": "2026-01-01T00:00:00Z"}) + "\n{not json\n")
        sessions = SessionsConfig(dirs=(term.config,), poll_s=0.2)
        async with running_executor(db, model, tmp_path, project_roots=(roots,), sessions=sessions), \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            sid = stored_conversation(term.config, tmp_path / "elsewhere", ("outside the roots", "ok"))
            row = await wait.until(lambda: _listed(http, sid), "the conversation listed", timeout=15)
            assert row["readable"] and not row["adoptable"], row
            refused = await http.post("/api/threads", json={"adopt_session_id": sid})
            assert refused.status_code == 403 and "outside the project roots" in refused.json()["detail"], refused.text
            bad = await wait.until(lambda: _listed(http, corrupt.stem), "the corrupt file listed", timeout=15)
            assert not bad["readable"] and "line 2 is not JSON" in bad["unreadable_reason"], bad
            refused = await http.post("/api/threads", json={"adopt_session_id": corrupt.stem})
            assert refused.status_code == 422 and "cannot be read" in refused.json()["detail"], refused.text
            unknown = await http.post("/api/threads", json={"adopt_session_id": str(uuid.uuid4())})
            assert unknown.status_code == 404, unknown.text
            wrong = await http.post("/api/threads", json={"adopt_session_id": sid, "executor": "nobody"})
            assert wrong.status_code == 404, wrong.text
            # a conversation published by an executor that is not running: nothing could make its thread
            gone = str(uuid.uuid4())
            tables.add(db.admin_dsn, "claude_sessions", executor="gone", session_id=gone, config_dir="/x",
                       path="/x/y.jsonl", cwd=str(roots), adoptable=True)
            refused = await http.post("/api/threads", json={"adopt_session_id": gone})
            assert refused.status_code == 409 and "not running" in refused.json()["detail"], refused.text
            threads = (await http.get("/api/threads")).json()["threads"]
            assert not any(t.get("adopted_session_id") for t in threads)  # nothing was queued
            # paged, newest first
            first = (await http.get("/api/claude-sessions", params={"limit": 1})).json()
            second = (await http.get("/api/claude-sessions", params={"limit": 1, "offset": 1})).json()
            assert first["more"] and len(first["sessions"]) == len(second["sessions"]) == 1
            assert first["sessions"][0]["last_activity"] >= second["sessions"][0]["last_activity"]
            assert first["sessions"][0]["session_id"] != second["sessions"][0]["session_id"]
            assert (await http.get("/api/claude-sessions", params={"limit": 0})).status_code == 400
            # a file that went is unlisted
            corrupt.unlink()
            await wait.until(lambda: _gone(http, corrupt.stem), "the deleted file unlisted", timeout=15)


async def _gone(http: httpx.AsyncClient, sid: str) -> bool:
    return await _listed(http, sid) is None


async def test_a_fleet_lists_each_executors_conversations_and_runs_the_adopted_thread_where_the_file_is(
        db: DB, tmp_path: Path) -> None:
    roots = tmp_path / "projects"
    with ScriptedModelServer(_scenario()) as model:
        desk_a = Terminal(model, tmp_path / "desk-a", roots / "a")
        desk_b = Terminal(model, tmp_path / "desk-b", roots / "b")
        async with running_executor(db, model, tmp_path / "ea", project_roots=(roots,), name="exec-a",
                                    sessions=SessionsConfig(dirs=(desk_a.config,), poll_s=0.2)) as h, \
                running_executor(db, model, tmp_path / "eb", project_roots=(roots,), name="exec-b",
                                 sessions=SessionsConfig(dirs=(desk_b.config,), poll_s=0.2)), \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            sid_a, sid_b = await asyncio.gather(desk_a.say("on a"), desk_b.say("on b"))
            row_a = await wait.until(lambda: _listed(http, sid_a), "a's conversation listed", timeout=15)
            row_b = await wait.until(lambda: _listed(http, sid_b), "b's conversation listed", timeout=15)
            assert (row_a["executor"], row_b["executor"]) == ("exec-a", "exec-b")
            assert await _listed(http, sid_b, executor="exec-a") is None
            thread = await _adopt(http, sid_b)
            await wait.until(lambda: _thread(http, thread), "the adopted thread made")
            assert (await http.post("/api/chat", json={"thread_id": thread, "text": "phone to b"})).status_code == 202
            turn = (await _turns_done(h, thread, 1))[0]
            assert (turn["status"], turn["executor"]) == ("success", "exec-b"), turn
            assert _model_saw(model, "on b", "phone to b")


async def test_a_thread_begun_on_the_phone_is_handed_to_a_terminal_and_back(db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(_scenario()) as model:
        async with running_executor(db, model, tmp_path, sessions=SessionsConfig(poll_s=0.2)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            made = await http.post("/api/threads", json={"title": "from the phone"})
            thread = str(made.json()["thread_id"])
            await wait.until(lambda: _thread(http, thread), "the thread made")
            assert (await http.post("/api/chat", json={"thread_id": thread, "text": "phone first"})).status_code == 202
            await _turns_done(h, thread, 1)
            got = await wait.until(lambda: _with_command(http, thread), "the thread's command for a terminal")
            workdir, config = tmp_path / "work", tmp_path / "claude-config"
            assert got["resume_command"] == (f"cd {workdir} && CLAUDE_CONFIG_DIR={config} {claude_bin()} --resume {thread} "
                                             f"{shlex.join(threads.HANDBACK_FLAGS)}")
            # the thread's own conversation is listed too, as the thread's
            row = await wait.until(lambda: _listed(http, thread), "the thread's conversation listed", timeout=15)
            assert row["thread_id"] == thread and row["cwd"] == str(workdir), row

            # the command, as a terminal runs it: the thread shows what was said there
            desk = Terminal(model, tmp_path / "desk", workdir)
            desk.env["CLAUDE_CONFIG_DIR"] = str(config)
            assert await desk.say("desk note", resume=thread) == thread
            await wait.until(lambda: _has(h, thread, "desk note"), "the terminal's turn in the thread", timeout=10)
            assert (await http.post("/api/chat", json={"thread_id": thread, "text": "phone second"})).status_code == 202
            await _turns_done(h, thread, 2)
            assert _model_saw(model, "phone first", "desk note", "phone second")
            chat = await _chat(h, thread)
            assert [x for t, x, _ in chat if t == "task.user_message"] == ["phone first", "desk note", "phone second"]


async def _with_command(http: httpx.AsyncClient, thread_id: str) -> dict[str, Any] | None:
    got = await _thread(http, thread_id)
    return got if got and got["resume_command"] else None
