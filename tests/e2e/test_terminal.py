"""One session, two screens: `petal-dispatch claude` run in tmux (the real interactive CLI against the scripted
model), held by the executor in a pseudo-terminal, followed and steered from the page, detached and attached."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.harness import Harness, claude_bin, running_executor
from tests.pg import DB
from tests.served import ingress_server
from tests.wait import until

pytestmark = pytest.mark.e2e

KEY = "sk-ant-fake-terminal-key"
PROMPT = "❯\u00a0"
PETAL = str(Path(sys.executable).with_name("petal-dispatch"))


class Desk(Scenario):
    """"RUN: <command>" → a Bash call of it, then "done"; "SLOW" → forty words, slowly; anything else → "echo: <the
    last line>"."""

    def choose(self, role: str | None, first_user_text: str, turn: int, last_user_text: str = "",
               session: str = "") -> dict[str, Any]:
        if "RUN:" in last_user_text:
            cmd = last_user_text.split("RUN:", 1)[1].strip().splitlines()[0]
            return {"tool_use": {"name": "Bash", "input": {"command": cmd, "description": "desk command"}},
                    "text": "I will run it."}
        if "SLOW" in last_user_text:  # a turn of ~10 s, one word every quarter second
            return {"text": " ".join(f"word{i}" for i in range(40)), "delay_s": 0.25}
        said = [line for line in last_user_text.splitlines() if line.strip() and not line.startswith("<")]
        if not said:
            return {"text": "done"}
        return {"text": "echo: " + said[-1].strip()[-200:]}


class Tmux:
    """A terminal at the desk: tmux on a socket of its own."""

    def __init__(self, root: Path):
        self.socket = f"petal-{uuid.uuid4().hex[:8]}"
        self.root = root

    async def run(self, *args: str) -> str:
        proc = await asyncio.create_subprocess_exec("tmux", "-L", self.socket, *args, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.DEVNULL)
        out, _ = await proc.communicate()
        return out.decode()

    async def open(self, name: str, command: str) -> None:
        script = self.root / f"{name}.sh"
        # the exit code written aside and renamed into place: a reader never finds the file made but still empty
        exit_file = self.root / f"{name}.exit"
        script.write_text(f"{command}\necho \"EXIT:$?\" > {exit_file}.part && mv {exit_file}.part {exit_file}\n"
                          "sleep 600\n")
        await self.run("new-session", "-d", "-s", name, "-x", "120", "-y", "40", f"bash {script}")

    async def screen(self, name: str) -> str:
        return await self.run("capture-pane", "-p", "-t", name)

    async def keys(self, name: str, *keys: str, literal: bool = False) -> None:
        await self.run("send-keys", "-t", name, *(["-l"] if literal else []), *keys)

    def exit_code(self, name: str) -> str | None:
        p = self.root / f"{name}.exit"
        return p.read_text().strip().removeprefix("EXIT:") if p.exists() else None

    async def shows(self, name: str, text: str, timeout: float = 30) -> str:
        async def seen() -> str | None:
            s = await self.screen(name)
            return s if text in s else None
        return await until(seen, lambda: f"{text!r} on the terminal {name}", timeout, every=0.05)

    async def close(self) -> None:
        path = (await self.run("display-message", "-p", "#{socket_path}")).strip()
        await self.run("kill-server")
        if path:
            Path(path).unlink(missing_ok=True)  # tmux leaves its socket file behind


def desk_env(model: ScriptedModelServer, root: Path, cwd: Path, data_dir: Path) -> dict[str, str]:
    """A user at the desk: a HOME and config directory of their own (onboarded, the folder trusted, the key
    accepted: the CLI starts at its prompt), the data directory of the running executor."""
    home, config = root / "home", root / "claude"
    home.mkdir(parents=True, exist_ok=True)
    config.mkdir(parents=True, exist_ok=True)
    (config / ".claude.json").write_text(json.dumps({
        "hasCompletedOnboarding": True, "customApiKeyResponses": {"approved": [KEY[-20:]], "rejected": []},
        "projects": {str(cwd): {"hasTrustDialogAccepted": True}}}))
    fake = root / "bin"  # an npm that only fails: nothing here installs anything
    fake.mkdir(exist_ok=True)
    (fake / "npm").write_text("#!/bin/sh\nexit 1\n")
    (fake / "npm").chmod(0o755)
    return {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(home), "CLAUDE_CONFIG_DIR": str(config), "TERM": "xterm-256color",
            "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": KEY, "NO_PROXY": "127.0.0.1,localhost",
            "PETAL_DATA_DIR": str(data_dir), "LANG": "C.UTF-8"}


def wrapper(env: dict[str, str], cwd: Path, *args: str, umask: str = "0022") -> str:
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f"umask {umask} && cd {shlex.quote(str(cwd))} && env -i {envs} {shlex.quote(PETAL)} {shlex.join(args)}"


@asynccontextmanager
async def desk(db: DB, tmp: Path, tmux: Tmux | None = None
               ) -> AsyncIterator[tuple[Harness, httpx.AsyncClient, Tmux, dict[str, str], Path, ScriptedModelServer]]:
    """The services, the scripted model and a desk; its tmux is closed at the end unless the test gave its own."""
    roots = tmp / "projects"
    cwd = roots / "app"
    cwd.mkdir(parents=True)
    own = tmux is None
    tmux = tmux or Tmux(tmp)
    with ScriptedModelServer(Desk()) as model:
        env = desk_env(model, tmp / "desk", cwd, tmp)
        try:
            async with running_executor(db, model, tmp, project_roots=(roots,)) as h, \
                    ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
                yield h, http, tmux, env, cwd, model
        finally:
            if own:
                await tmux.close()
    # the executor stopped: no session's CLI outlives it
    with psycopg.connect(db.admin_dsn) as conn:
        pids = [p for (p,) in conn.execute("SELECT pid FROM tasks WHERE role = 'terminal' AND pid IS NOT NULL")]
    assert [p for p in pids if _alive(p)] == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"  # a zombie is gone but for its parent


async def live_thread(http: httpx.AsyncClient) -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        threads = (await http.get("/api/threads")).json()["threads"]
        return next((t for t in threads if t.get("terminal")), None)
    return await until(found, "a thread live in a terminal", 30)


async def rows(h: Harness, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    conn = await h._conn()
    cur = await conn.execute(sql, params)
    return list(await cur.fetchall())


async def journaled(h: Harness, thread: str, event_type: str, text: str) -> dict[str, Any] | None:
    for (payload,) in await rows(h, "SELECT payload FROM journal WHERE session_id = %s AND event_type = %s ORDER BY seq",
                                 uuid.UUID(thread), event_type):
        if text in json.dumps(payload):
            return dict(payload)
    return None


async def started(tmux: Tmux, http: httpx.AsyncClient, env: dict[str, str], cwd: Path,
                  umask: str = "0022") -> dict[str, Any]:
    await tmux.open("desk", wrapper(env, cwd, "claude", "--permission-mode", "default", umask=umask))
    await tmux.shows("desk", PROMPT)
    return await live_thread(http)


async def test_what_the_terminal_says_is_on_the_page_and_the_page_types_at_the_empty_prompt(db: DB, tmp_path: Path) -> None:
    async with desk(db, tmp_path) as (h, http, tmux, env, cwd, _):
        thread = await started(tmux, http, env, cwd)
        tid = thread["id"]
        assert thread["terminal"]["held_by"]  # the terminal holds its screen
        # the Sessions picker lists it first, with who holds it
        listed = (await http.get("/api/claude-sessions")).json()["terminals"]
        assert [(t["thread_id"], t["held_by"]) for t in listed] == [(tid, thread["terminal"]["held_by"])]

        # typed at the desk: journaled within a second of the CLI writing it to its conversation
        await tmux.keys("desk", "hello from the desk", literal=True)
        await tmux.keys("desk", "Enter")
        await tmux.shows("desk", "echo: hello from the desk")
        stored = Path(env["CLAUDE_CONFIG_DIR"]) / "projects"

        async def written() -> float | None:
            # the screen can show the reply before the CLI has made its conversation file: wait for both
            conversation = next(stored.glob("*/*.jsonl"), None)
            found = conversation is not None and "echo: hello from the desk" in conversation.read_text()
            return time.monotonic() if found else None
        async def said() -> float | None:
            return time.monotonic() if await journaled(h, tid, "terminal.entry", "echo: hello from the desk") else None
        at_file = await until(written, "the reply in the conversation file", 20, every=0.02)
        at_journal = await until(said, "the reply journaled", 20, every=0.02)
        assert at_journal - at_file < 1.0
        prompt = await journaled(h, tid, "task.user_message", "hello from the desk")
        assert prompt is not None and prompt["origin"] == "terminal"

        # from the page: typed at the next prompt, answered, journaled once (with its message id)
        sent = await http.post("/api/chat", json={"text": "from the phone", "thread_id": tid})
        assert sent.status_code == 202, sent.text
        await tmux.shows("desk", "echo: from the phone")
        echoes = await rows(h, "SELECT message_id FROM journal WHERE session_id = %s AND event_type = 'task.user_message' "
                               "AND payload ->> 'text' = 'from the phone'", uuid.UUID(tid))
        assert len(echoes) == 1 and echoes[0][0] is not None

        # a message beginning as the CLI's shell escape is typed as a prompt, never run as a command
        await http.post("/api/chat", json={"text": "!touch bang.txt", "thread_id": tid})
        await tmux.shows("desk", "echo: !touch bang.txt")
        assert not (cwd / "bang.txt").exists()

        # the user is typing: the page's message waits, and the thread says so; cleared, it goes in
        await tmux.keys("desk", "half a thought", literal=True)
        await tmux.shows("desk", "half a thought")
        await http.post("/api/chat", json={"text": "second from the phone", "thread_id": tid})

        async def waiting() -> bool:
            t = next(t for t in (await http.get("/api/threads")).json()["threads"] if t["id"] == tid)
            return bool(t["terminal"]["input_waiting"])
        await until(waiting, "the page told the message waits on the terminal's typing", 20)
        assert "second from the phone" not in await tmux.screen("desk")
        assert "half a thought" in await tmux.screen("desk")  # the user's draft untouched
        await tmux.keys("desk", "Escape")
        await tmux.keys("desk", "Escape")
        await tmux.shows("desk", "echo: second from the phone")
        told = [p["waiting"] for (p,) in await rows(h, "SELECT payload FROM journal WHERE session_id = %s AND "
                                                       "event_type = 'terminal.input_waiting' ORDER BY seq", uuid.UUID(tid))]
        assert told == [True, False]  # said when it began to wait, and when it stopped


async def test_a_permission_prompt_is_answered_on_the_page_or_in_the_terminal_whichever_is_first(
        db: DB, tmp_path: Path) -> None:
    async with desk(db, tmp_path) as (h, http, tmux, env, cwd, _):
        thread = await started(tmux, http, env, cwd, umask="0002")  # the executor's own is not the session's

        async def card() -> dict[str, Any] | None:
            asks = (await http.get("/api/asks")).json()["asks"]
            return next((a for a in asks if a["status"] == "pending" and a["questions"][0].get("header") == "Terminal"),
                        None)

        # answered on the phone: the dialog closes, the command runs once
        await tmux.keys("desk", "RUN: touch from-phone.txt", literal=True)
        await tmux.keys("desk", "Enter")
        await tmux.shows("desk", "Do you want to proceed?")
        ask = await until(card, "the terminal's permission prompt as a card", 20)
        q = ask["questions"][0]["question"]
        answered = await http.post(f"/api/asks/{ask['id']}/answer", json={"answers": {q: "Allow once"}})
        assert answered.status_code == 200, answered.text
        await tmux.shows("desk", "Allowed by PermissionRequest hook")
        await until(lambda: (cwd / "from-phone.txt").exists(), "the command allowed on the page run", 20)
        assert (cwd / "from-phone.txt").stat().st_mode & 0o777 == 0o664  # made with the terminal's umask

        # answered in the terminal first: the phone's card closes as answered there
        await tmux.keys("desk", "RUN: touch from-desk.txt", literal=True)
        await tmux.keys("desk", "Enter")
        ask = await until(card, "the second prompt as a card", 20)
        await tmux.shows("desk", "Do you want to proceed?")
        # a person reads the dialog before answering it (the CLI ignores keys in the first moments a dialog shows,
        # against an answer typed ahead by accident)
        await asyncio.sleep(1.5)
        await tmux.keys("desk", "Enter")  # 1. Yes
        await until(lambda: (cwd / "from-desk.txt").exists(), "the command allowed in the terminal run", 20)

        async def closed() -> dict[str, Any] | None:
            got = next(a for a in (await http.get("/api/asks")).json()["asks"] if a["id"] == ask["id"])
            return got if got["status"] != "pending" else None
        done = await until(closed, "the card closed", 20)
        assert done["status"] == "cancelled" and done["response"] == "answered in the terminal"
        assert await until(lambda: journaled(h, thread["id"], "question.cancelled", "answered in the terminal"),
                           "the card's close on the record", 20)
        assert thread["terminal"]


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
async def test_with_sandbox_the_session_writes_only_in_its_directory_and_the_page_says_so(
        db: DB, tmp_path: Path, sandboxed: bool) -> None:
    async with desk(db, tmp_path) as (h, http, tmux, env, cwd, _):
        await tmux.open("desk", wrapper(env, cwd, "claude", *(["--sandbox"] if sandboxed else []),
                                        "--permission-mode", "default"))
        if sandboxed:  # the sandbox's copy of the CLI's state keeps no folder's trust: the terminal is asked
            await tmux.shows("desk", "Yes, I trust this folder")
            await asyncio.sleep(1.5)  # a person reads the dialog (the CLI ignores keys in its first moments)
            await tmux.keys("desk", "Down")  # from "No, exit"
            await tmux.keys("desk", "Enter")
        await tmux.shows("desk", PROMPT)
        thread = await live_thread(http)
        assert thread["terminal"]["sandboxed"] is sandboxed

        async def card() -> dict[str, Any] | None:
            asks = (await http.get("/api/asks")).json()["asks"]
            return next((a for a in asks if a["status"] == "pending"), None)
        async def results(n: int) -> bool:
            found = await rows(h, "SELECT count(*) FROM journal WHERE session_id = %s AND event_type = 'terminal.entry' "
                                  "AND payload ->> 'role' = 'tool'", uuid.UUID(thread["id"]))
            return bool(found[0][0] >= n)
        for i, name in enumerate(("inside.txt", "../outside.txt")):
            await tmux.keys("desk", f"RUN: touch {name}", literal=True)
            await tmux.keys("desk", "Enter")
            ask = await until(card, f"the prompt for {name} as a card", 30)
            q = ask["questions"][0]["question"]
            assert (await http.post(f"/api/asks/{ask['id']}/answer", json={"answers": {q: "Allow once"}})).status_code == 200
            await until(lambda: results(i + 1), f"the result of touching {name} journaled", 30)
        await until(lambda: (cwd / "inside.txt").exists(), "the write in the session's directory", 20)
        # outside its directory: written only without the sandbox (the negative control)
        assert (cwd.parent / "outside.txt").exists() is not sandboxed
        # the conversation is followed from inside the sandbox too
        assert await journaled(h, thread["id"], "task.user_message", "RUN: touch inside.txt") is not None


async def test_stop_on_the_page_interrupts_the_terminal_s_turn_and_the_session_goes_on(db: DB, tmp_path: Path) -> None:
    async with desk(db, tmp_path) as (h, http, tmux, env, cwd, _):
        thread = await started(tmux, http, env, cwd)
        task_id = thread["terminal"]["task_id"]
        # no turn runs: Stop does nothing (Esc at the prompt would clear what the user is typing)
        await tmux.keys("desk", "my precious draft", literal=True)
        await tmux.shows("desk", "my precious draft")
        assert (await http.post(f"/api/tasks/{task_id}/stop", json={})).status_code == 202
        async def handled() -> bool:
            return await rows(h, "SELECT status FROM stop_queue WHERE task_id = %s", uuid.UUID(task_id)) == [("done",)]
        await until(handled, "the stop handled", 20)
        await asyncio.sleep(1.0)  # must not happen within: the draft cleared by an Esc the Stop sent
        assert "my precious draft" in await tmux.screen("desk")
        await tmux.keys("desk", "Escape")
        await tmux.keys("desk", "Escape")
        await until(lambda: _draft_gone(tmux), "the draft cleared", 10)
        await tmux.keys("desk", "SLOW please", literal=True)
        await tmux.keys("desk", "Enter")
        await tmux.shows("desk", "word2")
        stopped = await http.post(f"/api/tasks/{task_id}/stop", json={"reason": "enough"})
        assert stopped.status_code == 202, stopped.text
        await tmux.shows("desk", "Interrupted")
        assert "word39" not in await tmux.screen("desk")  # the turn did not run to its end
        [(status,)] = await rows(h, "SELECT status FROM tasks WHERE id = %s", uuid.UUID(task_id))
        assert status == "running"  # the session is not ended by a Stop
        await tmux.keys("desk", "still here", literal=True)
        await tmux.keys("desk", "Enter")
        await tmux.shows("desk", "echo: still here")


async def _draft_gone(tmux: Tmux) -> bool:
    return "my precious draft" not in await tmux.screen("desk")


async def test_a_closed_terminal_leaves_the_session_running_attach_brings_it_back_and_the_page_ends_it(
        db: DB, tmp_path: Path) -> None:
    async with desk(db, tmp_path) as (h, http, tmux, env, cwd, _):
        thread = await started(tmux, http, env, cwd)
        tid, task_id = thread["id"], thread["terminal"]["task_id"]
        [(pid,)] = await rows(h, "SELECT pid FROM tasks WHERE id = %s", uuid.UUID(task_id))

        await tmux.run("kill-session", "-t", "desk")  # the terminal is closed

        async def detached() -> bool:
            t = next(t for t in (await http.get("/api/threads")).json()["threads"] if t["id"] == tid)
            return t["terminal"] is not None and t["terminal"]["held_by"] is None
        await until(detached, "the session detached", 20)
        os.kill(pid, 0)  # still running
        # a turn completes meanwhile, from the page
        await http.post("/api/chat", json={"text": "while detached", "thread_id": tid})
        await until(lambda: journaled(h, tid, "terminal.entry", "echo: while detached"), "the detached turn", 30)

        await tmux.open("again", wrapper(env, cwd, "attach"))
        await tmux.shows("again", "echo: while detached")
        # Ctrl-\ then d: this terminal lets go, the session runs on
        await tmux.keys("again", "C-\\")
        await tmux.keys("again", "d")
        await until(lambda: tmux.exit_code("again") == "0", "the wrapper to detach", 20)
        assert "petal-dispatch attach" in await tmux.screen("again")
        await until(detached, "the session detached again", 20)
        os.kill(pid, 0)
        await tmux.open("third", wrapper(env, cwd, "attach", tid[:8]))
        await tmux.shows("third", "echo: while detached")

        ended = await http.post(f"/api/threads/{tid}/terminal/end", json={})
        assert ended.status_code == 202, ended.text
        await until(lambda: tmux.exit_code("third") is not None, "the attached wrapper to exit", 30)
        [(status, reason)] = await rows(h, "SELECT status, status_reason FROM tasks WHERE id = %s", uuid.UUID(task_id))
        assert (status, reason) == ("cancelled", "ended_from_the_page")
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        # the conversation goes on in the thread (--resume), and the page can no longer end what has ended
        assert (await http.post(f"/api/threads/{tid}/terminal/end", json={})).status_code == 409


async def test_after_the_session_ends_the_page_s_messages_continue_the_same_conversation(db: DB, tmp_path: Path) -> None:
    async with desk(db, tmp_path) as (h, http, tmux, env, cwd, model):
        thread = await started(tmux, http, env, cwd)
        tid = thread["id"]
        await tmux.keys("desk", "remember the word kiwi", literal=True)
        await tmux.keys("desk", "Enter")
        await tmux.shows("desk", "echo: remember the word kiwi")
        assert (await http.post(f"/api/threads/{tid}/terminal/end", json={})).status_code == 202
        await until(lambda: tmux.exit_code("desk") is not None, "the wrapper to exit", 30)
        await http.post("/api/chat", json={"text": "which word was it?", "thread_id": tid})

        async def replied() -> bool:
            return bool(await rows(h, "SELECT 1 FROM journal WHERE session_id = %s AND event_type = 'stream.result' "
                                      "AND payload ->> 'result' LIKE %s", uuid.UUID(tid), "%which word was it%"))
        await until(replied, "the page's turn after the session, answered", 60)
        [(argv,)] = await rows(h, "SELECT payload -> 'argv' FROM journal WHERE session_id = %s "
                                  "AND event_type = 'task.spawned' ORDER BY seq DESC LIMIT 1", uuid.UUID(tid))
        [(session_id,)] = await rows(h, "SELECT cli_session_id FROM sessions WHERE id = %s", uuid.UUID(tid))
        assert argv[argv.index("--resume") + 1] == session_id  # the terminal's conversation, resumed
        asked = [json.dumps(r.body.get("messages")) for r in model.requests]
        turn = [m for m in asked if "which word was it?" in m]
        assert turn and all("remember the word kiwi" in m for m in turn)  # the model was given the desk's words


async def test_a_stopping_executor_ends_its_sessions_and_their_threads_go_on_with_resume(db: DB, tmp_path: Path) -> None:
    tmux = Tmux(tmp_path)
    async with desk(db, tmp_path, tmux) as (h, http, _, env, cwd, _):
        thread = await started(tmux, http, env, cwd)
        tid, task_id = thread["id"], thread["terminal"]["task_id"]
        await tmux.keys("desk", "before the restart", literal=True)
        await tmux.keys("desk", "Enter")
        await tmux.shows("desk", "echo: before the restart")
    # (desk's end stopped the executor, and checked no CLI of a session outlives it)
    with psycopg.connect(db.admin_dsn) as conn:
        [(status, reason)] = conn.execute("SELECT status, status_reason FROM tasks WHERE id = %s",
                                          (uuid.UUID(task_id),)).fetchall()
        [(ended, end_reason)] = conn.execute("SELECT ended_at, end_reason FROM terminal_sessions WHERE task_id = %s",
                                             (uuid.UUID(task_id),)).fetchall()
        [(resume, session_id)] = conn.execute("SELECT resume_command, cli_session_id FROM sessions WHERE id = %s",
                                              (uuid.UUID(tid),)).fetchall()
    assert (status, reason) == ("cancelled", "executor_stopped") and ended is not None
    assert end_reason == "executor_stopped"
    assert f"--resume {session_id}" in resume  # the thread's way back to a terminal, and its turns', is the same
    try:  # the terminal's wrapper ended with the session, with the CLI's exit code
        await until(lambda: tmux.exit_code("desk") is not None, "the wrapper to exit", 20)
        assert tmux.exit_code("desk") in ("0", "129")
    finally:
        await tmux.close()


async def test_a_directory_outside_the_project_roots_is_refused_with_one_line(db: DB, tmp_path: Path) -> None:
    async with desk(db, tmp_path) as (h, http, tmux, env, cwd, _):
        outside = tmp_path / "elsewhere"
        outside.mkdir()
        await tmux.open("desk", wrapper(env, outside, "claude"))
        await until(lambda: tmux.exit_code("desk") is not None, "the wrapper to exit", 20)
        assert tmux.exit_code("desk") == "2"
        said = (await tmux.screen("desk")).strip()
        assert said.startswith("petal-dispatch: refused:")
        # one line, wrapped at the terminal's width (where tmux drops the wrapped line's trailing space)
        assert "outsidetheallowedprojectroots" in "".join(said.split())
        assert await rows(h, "SELECT id FROM tasks WHERE role = 'terminal'") == []
        assert claude_bin()  # the pinned CLI, as every session uses
