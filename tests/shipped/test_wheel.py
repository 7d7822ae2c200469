"""A wheel install, not editable: `pip wheel .` from a fresh clone, installed into a fresh venv (its
dependencies from PyPI or pip's cache), started from a directory that has nothing to do with the clone. What only
a wheel shows: the migrations, the page's static files and the demo's scenario are in it — an editable install
reads them from the checkout."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.served import free_port
from tests.shipped.conftest import DEMO_QUESTION, PIP_CACHE, Running, fresh_checkout, path_without_venvs, start
from tests.wait import until_blocking

# the demo orchestrator's reply once it asked for a worker (demo/scenario.json): the turn's result, which the
# thread's conversation shows (in an interactive thread the worker then waits for an approval)
DEMO_REPLY = "A worker is on it."


def _run(*cmd: str, cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.mark.timeout(900)
def test_a_wheel_in_a_fresh_venv_plays_the_demo_and_runs_a_turn_from_an_unrelated_directory(
        tmp_path: Path, running: list[Running]) -> None:
    checkout = fresh_checkout(tmp_path)
    env = checkout.env()
    python = next(p for p in ("python3", sys.executable) if subprocess.run(
        ["bash", "-c", f"command -v {p}"], env=env, capture_output=True).returncode == 0)
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    _run(python, "-m", "pip", "wheel", ".", "-w", str(wheels), "--no-deps", "--quiet", "--disable-pip-version-check",
         cwd=checkout.root, env=env)
    [wheel] = wheels.glob("petal_dispatch-*.whl")
    _run(python, "-m", "venv", str(venv), cwd=tmp_path, env=env)
    _run(str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", str(wheel),
         cwd=tmp_path, env=env)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    user = {**env, "PATH": f"{venv / 'bin'}:{path_without_venvs()}", "VIRTUAL_ENV": str(venv),
            "PIP_CACHE_DIR": str(PIP_CACHE)}
    where = _run("python", "-c", "import petal_dispatch; print(petal_dispatch.__file__)", cwd=elsewhere, env=user)
    assert where.startswith(str(venv)), where  # the wheel's copy, not the clone's
    version = _run("petal-dispatch", "--version", cwd=elsewhere, env=user).strip()
    assert version.startswith("petal-dispatch ") and version.split()[1] in wheel.name, (version, wheel.name)

    port, mcp_port = free_port(), free_port()
    up = start(f"petal-dispatch up --demo --port {port} --mcp-port {mcp_port} --data-dir {tmp_path / 'data'}\n",
               user, elsewhere, tmp_path / "logs")
    running.append(up)
    up.wait_url(port)  # migrated: the migrations are in the wheel
    asks = until_blocking(lambda: up.get("/api/asks?status=pending")["asks"],
                          lambda: f"the demo's question:\n{up.output()}", timeout=180, every=0.5)
    assert DEMO_QUESTION in asks[0]["questions"][0]["question"]
    with urllib.request.urlopen(f"{up.base}/", timeout=10) as r:
        page = r.read().decode()
    assert "Demo:" in page  # the page: the static files are in the wheel
    # a turn of one's own: a new thread's message answered by the demo's orchestrator
    thread = up.post("/api/threads", {"title": "mine"})["thread_id"]
    up.post("/api/chat", {"text": "And this one?", "thread_id": thread})
    until_blocking(lambda: DEMO_REPLY in json.dumps(up.get(f"/api/threads/{thread}/conversation")),
                   lambda: f"the reply in thread {thread}:\n{up.output()}", timeout=120, every=0.3)
    assert up.stop() == 0, up.output()
    assert sorted(p.name for p in elsewhere.iterdir()) == []  # --data-dir elsewhere: nothing where it started
