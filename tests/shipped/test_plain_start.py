"""`OPEN_MODE=1 petal-dispatch up` with nothing else set, from the venv the set-up made: from a directory of the
user's own and from the repository's checkout, a chat message gets its reply, the turn runs in the default working
directory (~/.local/share/petal-dispatch/workdir), and nothing is written into the checkout.

Started from the checkout, `up` keeps its data in the checkout's ./var, as the README documents ("the next start
reuses the data in ./var"; .gitignore'd): the service's own state, which the set-up's demo already made, so
`git status` lists it before and after alike. What the checkout must not get is a worker's write or the mount
points bubblewrap makes for a sandbox bound over it (as it did when the workdir was an unresolved `.`), both
outside ./var — the workdir is refused inside the data directory.

The negative control: a turn whose free workdir is an unresolved `Path(".")`, run by the executor in the checkout
(in-process, tests/harness.py), fails — `--bind . .` puts the checkout over the sandbox's root, and bubblewrap
finds no bash — and the doctor's sandbox probe on that workdir fails the same way."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import httpx
import psycopg
import pytest

from petal_dispatch import config, doctor
from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.harness import claude_bin, running_executor
from tests.pg import DB
from tests.served import free_port, ingress_server
from tests.shipped.conftest import (
    FAKE_KEY,
    ON_THE_SET_UP_CLONE,
    REPLY,
    Running,
    SetUp,
    chat_turn,
    model_env,
    start,
    turn_cwd,
)
from tests.wait import until

pytestmark = [ON_THE_SET_UP_CLONE]


@pytest.mark.parametrize("where", ["a project directory", "the checkout"])
def test_a_plain_start_answers_in_petals_workdir_and_writes_nothing_into_the_checkout(
        set_up: SetUp, model: ScriptedModelServer, running: list[Running], tmp_path: Path, where: str) -> None:
    checkout = set_up.checkout
    cwd = checkout.root if where == "the checkout" else tmp_path / "my-project"
    cwd.mkdir(exist_ok=True)
    port, mcp_port = free_port(), free_port()
    before = checkout.status()
    up = start(f". {checkout.root}/.venv/bin/activate\n"
               f"OPEN_MODE=1 petal-dispatch up --port {port} --mcp-port {mcp_port}\n",
               checkout.env(**model_env(model)), cwd, tmp_path / "logs")
    running.append(up)
    up.wait_url(port)
    turn = chat_turn(up)
    info, turn_dir = up.get("/api/info"), turn_cwd(up, turn["id"])
    assert up.stop() == 0, up.output()
    workdir = checkout.home / ".local" / "share" / "petal-dispatch" / "workdir"
    assert [w["workdir"] for w in info["workdirs"]] == [str(workdir)], info
    assert turn_dir == str(workdir)
    assert checkout.written_since(before) == []
    assert (cwd / "var" / "pgdata").is_dir()  # the data directory: ./var where `up` started


# ---- the negative control: the workdir as it was, an unresolved "." -------------------------------------

async def _turn_events(db: DB, task_id: str) -> list[tuple[str, object]]:
    async with await psycopg.AsyncConnection.connect(db.admin_dsn) as conn:
        rows = await (await conn.execute("SELECT event_type, payload FROM journal WHERE task_id = %s ORDER BY seq",
                                         [task_id])).fetchall()
    return [(r[0], r[1]) for r in rows]


async def test_with_the_workdir_an_unresolved_dot_the_same_turn_fails_in_bubblewrap(
        set_up: SetUp, db: DB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = set_up.checkout
    monkeypatch.chdir(checkout.root)  # where `up` was started: the checkout
    before = checkout.status()
    with ScriptedModelServer(Scenario.from_data({"orchestrator": [{"text": REPLY}]})) as model:
        async with running_executor(db, model, tmp_path, default_workdir=Path(".")), \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = (await http.post("/api/threads", json={"title": "dot"})).json()["thread_id"]
            await http.post("/api/chat", json={"text": "Say something, please.", "thread_id": thread})

            async def ended() -> dict[str, object] | None:
                tasks = (await http.get(f"/api/tasks?thread_id={thread}")).json()["tasks"]
                return next((t for t in tasks if t["status"] not in ("pending", "running")), None)

            turn = await until(ended, "the turn to end", timeout=90)
            events = await _turn_events(db, str(turn["id"]))
    assert turn["status"] != "success", turn
    stderr = [p["line"] for t, p in events if t == "task.stderr" and isinstance(p, dict)]
    assert any("bwrap: execvp" in line and "No such file or directory" in line for line in stderr), events
    assert REPLY not in json.dumps([p for _, p in events])  # the model was never reached
    # what bubblewrap left in the checkout (its mount points: the other symptom) goes, for the tests after
    for line in checkout.written_since(before):
        shutil.rmtree(checkout.root / line[3:].rstrip("/"), ignore_errors=True)


async def test_the_doctors_sandbox_probe_refuses_an_unresolved_dot_and_passes_the_default(
        set_up: SetUp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = set_up.checkout
    monkeypatch.chdir(checkout.root)
    settings = config.absolute(config.Settings(data_dir=tmp_path / "var"), cwd=checkout.root)
    env = {"PATH": os.environ["PATH"], "HOME": str(checkout.home), "ANTHROPIC_API_KEY": FAKE_KEY}
    claude = Path(claude_bin()).resolve()
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    assert "Claude Code" in await doctor.sandbox_probe(settings, env, claude, workdir)  # the control
    with pytest.raises(RuntimeError, match="execvp"):
        await asyncio.wait_for(doctor.sandbox_probe(settings, env, claude, Path(".")), 90)
