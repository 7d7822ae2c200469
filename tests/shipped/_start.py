"""Starting the product as a user of the README does: `petal-dispatch up` from the repository's venv (activated:
its bin first on PATH), from a directory of the user's own, in an environment that holds nothing but what a
login shell has and what the README names. What differs from a user's machine: a fresh HOME whose
`~/.local/bin/claude` links to the pinned CLI (where the CLI's native installer puts it), the model's address
(ANTHROPIC_BASE_URL at the scripted model, with a fake ANTHROPIC_API_KEY as the login) and free ports."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.harness import claude_bin
from tests.served import free_port
from tests.wait import until_blocking

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent  # `. .venv/bin/activate`
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FAKE_KEY = "sk-ant-fake-not-a-real-key"
UP_TIMEOUT_S = 120.0


def fresh_home(tmp: Path) -> Path:
    """A user's home with nothing in it but the CLI on ~/.local/bin (no login, no petal data)."""
    home = tmp / "home"
    local_bin = home / ".local" / "bin"
    local_bin.mkdir(parents=True)
    (local_bin / "claude").symlink_to(claude_bin())
    return home


def user_env(home: Path, path: str | None = None, **settings: str) -> dict[str, str]:
    """A login shell's environment with the venv activated: nothing inherited from the test run (no DSN, no
    PETAL_* of the suite's), plus `settings` (the README's, and the model's address)."""
    env = {"HOME": str(home), "LANG": "C.UTF-8", "USER": "petal", "VIRTUAL_ENV": str(VENV_BIN.parent),
           "PATH": path if path is not None else f"{VENV_BIN}:{home / '.local' / 'bin'}:{SYSTEM_PATH}"}
    env.update(settings)
    return env


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "petal_dispatch.cli", *args]


@contextmanager
def scripted_model(scenario_file: Path) -> Iterator[ScriptedModelServer]:
    """The scripted model playing a scenario file, as the tests start it."""
    with ScriptedModelServer(Scenario.from_data(json.loads(scenario_file.read_text()))) as model:
        yield model


@dataclass
class Up:
    proc: subprocess.Popen[str]
    url: str
    port: int
    mcp_port: int
    cwd: Path


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def processes_under(tmp: Path) -> list[str]:
    """Processes that work in `tmp` or name it (a service's cwd, the database's data directory): what a start
    there left running."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.info["cmdline"] or [])
            if str(tmp) in cmdline or (proc.info["cwd"] or "").startswith(str(tmp)):
                found.append(f"{proc.info['pid']} {cmdline[:200]}")
        except psutil.Error:
            pass
    return found


@contextmanager
def up(cwd: Path, env: dict[str, str], log: Path) -> Iterator[Up]:
    """`petal-dispatch up --port P --mcp-port M` started in `cwd`; stopped with Ctrl-C at the end, and nothing of
    it left running."""
    port, mcp_port = free_port(), free_port()
    with log.open("w") as err:
        proc = subprocess.Popen(cli("up", "--port", str(port), "--mcp-port", str(mcp_port)), cwd=cwd, env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]  # stdout=PIPE: never None
        assert f"http://127.0.0.1:{port}/" in line, f"{line!r}\n{log.read_text()[-3000:]}"
        yield Up(proc, f"http://127.0.0.1:{port}", port, mcp_port, cwd)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        finally:
            proc.kill()
            proc.stdout.close()  # type: ignore[union-attr]  # stdout=PIPE: never None
    assert proc.returncode == 0, f"up ended {proc.returncode}\n{log.read_text()[-3000:]}"
    tmp = cwd.parent  # the test's own directory: HOME, the project, the data directory
    until_blocking(lambda: not processes_under(tmp), lambda: f"up's processes to end: {processes_under(tmp)}",
                   timeout=30)


def scenario_file(tmp: Path, scenario: dict[str, Any]) -> Path:
    path = tmp / "scenario.json"
    path.write_text(json.dumps(scenario))
    return path
