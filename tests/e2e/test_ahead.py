"""Sandboxes started ahead (executor/run/spawn/ahead_pool.py): a thread's next turn's sandbox, a spare started
before its message or its own started when the threads loop sees the message, its CLI only once the turn is claimed.
Against the real CLI, the scripted model and bubblewrap."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

from executor.run.spawn import ahead_pool
from executor.sandbox import bwrap, cliconfig
from executor.sandbox.bwrap import SpawnBox
from executor.sandbox.gateway import Gateway
from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer, last_user_text
from tests import tables
from tests.harness import running_executor, sandbox_for
from tests.pg import DB
from tests.served import ingress_server
from tests.wait import until


async def _turn_done(db: DB, thread: str, n: int) -> uuid.UUID:
    def done() -> uuid.UUID | None:
        turns = tables.turns(db.admin_dsn, thread, "id", "status")
        return turns[n - 1][0] if len(turns) >= n and turns[n - 1][1] == "success" else None
    return await until(done, f"turn {n} of the thread to succeed", timeout=90)


def _sandboxes() -> list[int]:
    """This process's sandboxes (an in-process executor's): the pid of each one's outer bubblewrap process (the
    pid the executor spawned, and its task.spawned names)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            parent = p.parent()
            if p.name() == "bwrap" and parent is not None and parent.name() != "bwrap":
                found.append(p.pid)
    return found


async def _two_turns(db: DB, tmp: Path, *, before_second: Callable[[str], Awaitable[None]] | None = None,
                     after_second: Callable[[], None] | None = None, **config: Any) -> tuple[dict[str, Any], list[str], list[Any], list[str]]:
    """A thread's second turn, after its first (`before_second` given the thread in between, `after_second` called
    once it succeeded): its task.spawned,
    its journal's types, the model's requests and the files left in the MCP config directory once the executor
    stopped, which left no sandbox behind."""
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp, **config), ingress_server(db.ingress_dsn) as url, \
                httpx.AsyncClient(base_url=url) as http:
            thread = str((await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"])
            await http.post("/api/chat", json={"text": "first message", "thread_id": thread})
            await _turn_done(db, thread, 1)
            if before_second is not None:
                await before_second(thread)
            await http.post("/api/chat", json={"text": "second message", "thread_id": thread})
            second = await _turn_done(db, thread, 2)
            if after_second is not None:
                after_second()
            spawned = tables.payloads(db.admin_dsn, "task.spawned", second)[0]
            lines = tables.event_types(db.admin_dsn, second)
            requests = list(model.requests)
    left = sorted(p.name for p in (tmp / "run" / "mcp").glob("*.json"))
    assert _sandboxes() == []  # the stop ended every one, the spare too
    return spawned, lines, requests, left


async def _spare_up() -> None:
    """Until the spare is up, and the only sandbox (the first turn's ended): one process tree, waiting."""
    await until(lambda: len(_sandboxes()) == 1, "the spare sandbox to be up", timeout=30)


async def test_a_turn_takes_the_spare_sandbox_started_before_its_message_and_its_message_goes_once(
        db: DB, tmp_path: Path) -> None:
    spares: list[int] = []

    async def spare_up(_: str) -> None:
        await _spare_up()
        spares.extend(_sandboxes())

    spawned, lines, requests, left = await _two_turns(db, tmp_path, before_second=spare_up)
    # the first turn taught the executor its role: a spare was started after it, before this message existed,
    # and this turn took it (the conversation linked in then); the CLI only with the turn
    assert spawned["pid"] == spares[0] and spawned["ahead"]["spare"] is True
    assert spawned["sandbox"] == "bwrap" and uuid.UUID(spawned["ahead"]["spawn_id"])
    assert spawned["ahead"]["waited_s"] >= 0 and "--resume" in spawned["argv"]
    assert "--input-format" not in spawned["argv"]  # a cold turn's command: the prompt on stdin, then its end
    # delivered exactly once, and journaled from the CLI's first line
    carrying = [r for r in requests if last_user_text(r.body).endswith("second message")]
    assert len(carrying) == 1 and json.dumps(carrying[0].body).count("second message") == 1
    at = lines.index("task.spawned")
    assert not any(t.startswith("stream.") for t in lines[:at])
    assert lines[at + 1] == "stream.system.init" and lines[-1] == "task.exited"
    assert left == []  # its credential's config went with its process


async def test_without_spares_a_turn_takes_its_own_sandbox_started_when_its_message_was_seen(
        db: DB, tmp_path: Path) -> None:
    spawned, lines, requests, left = await _two_turns(db, tmp_path, ahead_spares=0)
    assert spawned["ahead"]["spare"] is False and spawned["sandbox"] == "bwrap"
    assert lines[lines.index("task.spawned") + 1] == "stream.system.init"
    assert len([r for r in requests if last_user_text(r.body).endswith("second message")]) == 1
    assert left == []


async def test_a_conversation_with_a_side_directory_gets_its_own_sandbox_and_the_spare_waits_for_another(
        db: DB, tmp_path: Path) -> None:
    """A stored conversation's side directory needs a mount of its own, fixed when a sandbox starts: a spare cannot
    take that conversation, so the turn's own sandbox is started, the directory mounted, and the spare stays."""
    spares: list[int] = []
    seen: list[tuple[int, bool]] = []

    async def side_directory(thread: str) -> None:
        stored = next(p for p in tmp_path.rglob(f"{thread}.jsonl") if cliconfig.SPAWNS_DIR not in p.parts)
        (stored.parent / thread).mkdir()
        (stored.parent / thread / "kept.txt").write_text("the conversation's own\n")
        await _spare_up()
        spares.extend(_sandboxes())

    def spare_still_up() -> None:
        seen.extend((pid, psutil.pid_exists(pid)) for pid in spares)

    spawned, lines, requests, left = await _two_turns(db, tmp_path, before_second=side_directory,
                                                      after_second=spare_still_up)
    assert spawned["ahead"]["spare"] is False and spawned["pid"] not in spares
    assert seen == [(spares[0], True)]  # kept for another thread's turn, not ended
    assert lines[lines.index("task.spawned") + 1] == "stream.system.init" and lines[-1] == "task.exited"
    assert len([r for r in requests if last_user_text(r.body).endswith("second message")]) == 1
    assert left == []


async def test_a_spare_started_before_the_settings_every_spawn_obeys_were_replaced_is_not_handed_over(
        db: DB, tmp_path: Path) -> None:
    """A mount shows the file it was made on: a spare started before the operator replaced the settings (or a
    login replaced the credentials) would run the turn under the old ones. It is ended; the turn gets its own."""
    spares: list[int] = []

    async def settings_replaced(_: str) -> None:
        await _spare_up()
        spares.extend(_sandboxes())
        settings = tmp_path / "claude-config" / "settings.json"
        (tmp_path / "claude-config" / "new-settings.json").write_text('{"env": {"PETAL_TEST_NEW": "1"}}\n')
        os.replace(tmp_path / "claude-config" / "new-settings.json", settings)

    spawned, lines, requests, left = await _two_turns(db, tmp_path, before_second=settings_replaced)
    assert spawned["ahead"]["spare"] is False and spawned["pid"] not in spares
    assert lines[lines.index("task.spawned") + 1] == "stream.system.init" and lines[-1] == "task.exited"
    assert len([r for r in requests if last_user_text(r.body).endswith("second message")]) == 1
    assert left == []


async def test_with_the_sandbox_ahead_off_the_same_turn_spawns_cold(db: DB, tmp_path: Path) -> None:
    spawned, lines, requests, _ = await _two_turns(db, tmp_path, ahead=False)
    assert "ahead" not in spawned and spawned["sandbox"] == "bwrap"
    assert lines[lines.index("task.spawned") + 1] == "stream.system.init"
    assert len([r for r in requests if last_user_text(r.body).endswith("second message")]) == 1


async def _launched(tmp: Path, argv: list[str] | None, *, cut: int = 0) -> tuple[int, bytes, list[str]]:
    """A sandbox started ahead of its command, then given `argv` as a turn gives it (None: told there is none;
    `cut`: that many bytes of the end never written): its exit status, its output, and what ran in it before."""
    gw = await Gateway.open(tmp / "gw", {}, (), "t")
    workdir = tmp / "work"
    workdir.mkdir(exist_ok=True)
    box = SpawnBox(workdir=workdir, sockets_dir=gw.directory)
    read_end, write_end = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *bwrap.wrap(sandbox_for(tmp), box, [], argv_fd=read_end), pass_fds=(read_end,),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    finally:
        os.close(read_end)
    await asyncio.sleep(0.5)  # it is up, waiting: nothing of the command runs yet
    argv_bytes = ahead_pool.command_line(argv or [])
    argv_bytes = argv_bytes[:len(argv_bytes) - cut]
    inside = [" ".join(p.cmdline()) for p in psutil.Process(proc.pid).children(recursive=True)]
    with open(write_end, "wb", buffering=0) as command:
        if argv is not None:
            command.write(argv_bytes)
    out, _ = await asyncio.wait_for(proc.communicate(b"from stdin\n"), 30)
    await gw.close()
    assert proc.returncode is not None
    return proc.returncode, out, inside


async def test_a_sandbox_started_ahead_runs_its_command_once_given_and_ends_with_none(tmp_path: Path) -> None:
    code, out, inside = await _launched(tmp_path / "given", ["sh", "-c", 'read line; echo "ran: $1 $line"', "sh",
                                                             "with spaces"])
    assert code == 0 and out == b"ran: with spaces from stdin\n"
    assert not any("ran:" in c for c in inside)  # the command did not run before it was given
    code, out, _ = await _launched(tmp_path / "none", None)
    assert code == 0 and out == b""
    # a command line cut short runs nothing: neither without its last argument's end nor without the end mark
    for cut in (1, 4):
        code, out, _ = await _launched(tmp_path / f"cut{cut}", ["sh", "-c", "echo ran"], cut=cut)
        assert code == 0 and out == b"", cut
