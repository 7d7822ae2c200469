"""What the `shipped` tier shares: a fresh clone of the committed HEAD where a user would put it (in a fresh HOME,
its CLI cache a link to the real one so the pinned CLI is not downloaded again), the README's marked blocks, the
product started as a user's shell starts it, and the scripted model on loopback standing in for Anthropic's API.

The product's environment is a user's shell, not the test's: PATH without any venv, HOME, LANG — and only what
these tests change on purpose, the model's address (ANTHROPIC_BASE_URL at the scripted model, a fake
ANTHROPIC_API_KEY as the login) and free ports (`--port`/`--mcp-port`, docs/commands.md). No PETAL_* setting the
README does not name."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from petal_dispatch import cli_install
from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.wait import until_blocking

ROOT = Path(__file__).resolve().parents[2]
# the real caches: the pinned CLI (~/.cache/petal-dispatch) and pip's, shared with the fresh HOME's runs
CLI_CACHE = cli_install.default_prefix().parents[1]
PIP_CACHE = Path(os.environ.get("PIP_CACHE_DIR") or Path.home() / ".cache" / "pip")
FAKE_KEY = "sk-ant-shipped-not-a-real-key"


def path_without_venvs() -> str:
    """The PATH, less any venv's bin directory (this run's own .venv among them), as a newcomer's shell has it."""
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if d and not (Path(d).parent / "pyvenv.cfg").exists())


@dataclass
class Checkout:
    """A fresh clone at ~/petal-dispatch of a fresh HOME (where a user clones it: the service's checkout then
    lies inside the home the sandbox hides, as it does for most users)."""
    root: Path
    home: Path

    @property
    def venv_bin(self) -> Path:
        return self.root / ".venv" / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": path_without_venvs(), "HOME": str(self.home), "LANG": "C.UTF-8",
                "PIP_CACHE_DIR": str(PIP_CACHE), **extra}

    def status(self) -> list[str]:
        """`git status --porcelain --ignored`: every path that differs from the commit, ignored ones too."""
        out = subprocess.run(["git", "-C", str(self.root), "status", "--porcelain", "--ignored"],
                             capture_output=True, text=True, check=True).stdout
        return sorted(out.splitlines())

    def written_since(self, before: list[str]) -> list[str]:
        """What `status` lists now and did not before, less the interpreter's bytecode caches of the editable
        install (each `__pycache__/` new beside the modules it caches, holding only their .pyc): the service's own
        Python writes those on import, no worker can."""
        return [line for line in self.status() if line not in before and not _bytecode_only(self.root, line)]


def _bytecode_only(root: Path, line: str) -> bool:
    path = root / line[3:].rstrip("/")
    if path.name != "__pycache__" or not path.is_dir():
        return False
    return all(f.suffix == ".pyc" and (path.parent / f"{f.name.split('.', 1)[0]}.py").is_file()
               for f in path.iterdir())


def fresh_checkout(tmp: Path) -> Checkout:
    home = tmp / "home"
    (home / ".cache").mkdir(parents=True)
    (home / ".cache" / "petal-dispatch").symlink_to(CLI_CACHE)
    root = home / "petal-dispatch"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(root)], check=True, capture_output=True)
    return Checkout(root, home)


def readme_block(readme: Path, name: str) -> str:
    """The shell block README.md marks `<!-- shipped: NAME -->` (on the line before its fence)."""
    found = re.findall(rf"^<!-- shipped: {re.escape(name)} -->\n```[a-z]*\n(.*?)^```", readme.read_text(),
                       re.M | re.S)
    assert len(found) == 1, f"README.md marks {len(found)} blocks `shipped: {name}`"
    return str(found[0])


def with_ports(block: str, command: str, port: int, mcp_port: int) -> str:
    """The block with `--port`/`--mcp-port` added to the one line that runs `command` (the only change the tests
    make to a block: the default ports may be taken on a machine running tests in parallel)."""
    lines = block.splitlines()
    at = [i for i, line in enumerate(lines) if command in line]
    assert len(at) == 1, f"the block runs `{command}` {len(at)} times:\n{block}"
    lines[at[0]] += f" --port {port} --mcp-port {mcp_port}"
    return "\n".join(lines) + "\n"


# ---- the product running ---------------------------------------------------------------------------------

URL_LINE = re.compile(r"(http://127\.0\.0\.1:\d+)/")


@dataclass
class Running:
    """A shell script running the product, in a process group of its own as a terminal's job is; stopped as
    Ctrl-C stops it, by SIGINT to the group."""
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    base: str = ""
    stopped: int | None = field(default=None)

    def output(self) -> str:
        return self.out.read_text(errors="replace") + "\n--- stderr ---\n" + self.err.read_text(errors="replace")[-6000:]

    def wait_url(self, port: int, timeout: float = 240) -> str:
        def url() -> str | None:
            assert self.proc.poll() is None, f"it ended (exit {self.proc.returncode}):\n{self.output()}"
            return next((m.group(1) for m in URL_LINE.finditer(self.out.read_text(errors="replace"))
                         if m.group(1).endswith(f":{port}")), None)
        self.base = until_blocking(url, lambda: f"the URL line:\n{self.output()}", timeout=timeout, every=0.2)
        return self.base

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.base}{path}", timeout=10) as r:
            return json.load(r)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(f"{self.base}{path}", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"POST {path}: {exc.code} {exc.read()[:500]!r}") from None

    def stop(self, timeout: float = 90) -> int:
        """Ctrl-C: SIGINT to the job's process group; its exit code."""
        if self.stopped is None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.stopped = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                raise AssertionError(f"it did not stop within {timeout} s of SIGINT:\n{self.output()}") from None
        return self.stopped


def start(script: str, env: dict[str, str], cwd: Path, logs: Path) -> Running:
    """`script` run by bash (`set -e`) in `cwd` with exactly `env`."""
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / "out", logs / "err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(["bash", "-ec", script], env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=o,
                                stderr=e, start_new_session=True)
    return Running(proc, out, err)


@pytest.fixture
def running() -> Iterator[list[Running]]:
    """Where a test puts what it starts: each is stopped at the end whatever happened."""
    started: list[Running] = []
    yield started
    for r in started:
        try:
            r.stop()
        except AssertionError:
            pass


# ---- a chat turn against the scripted model --------------------------------------------------------------

REPLY = "Shipped: the reply from the scripted model."


@pytest.fixture
def model() -> Iterator[ScriptedModelServer]:
    """The scripted model on loopback: every orchestrator turn answers REPLY."""
    with ScriptedModelServer(Scenario.from_data({"rules": [{"role": "orchestrator", "replies": [{"text": REPLY}]}],
                                                 "default": {"text": "ok"}})) as server:
        yield server


def model_env(model: ScriptedModelServer) -> dict[str, str]:
    return {"ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": FAKE_KEY}


def chat_turn(up: Running, text: str = "Say something, please.") -> dict[str, Any]:
    """POST /api/chat in a new thread and wait for the reply in its conversation; the turn's task row."""
    thread = up.post("/api/threads", {"title": "shipped"})["thread_id"]
    up.post("/api/chat", {"text": text, "thread_id": thread})

    def replied() -> bool:
        return REPLY in json.dumps(up.get(f"/api/threads/{thread}/conversation"))

    until_blocking(replied, lambda: f"the reply in thread {thread}:\n{up.output()}", timeout=120, every=0.3)
    turns = [t for t in up.get(f"/api/tasks?thread_id={thread}")["tasks"] if t["role"] == "orchestrator"]
    assert len(turns) == 1, turns
    return dict(turns[0])


def turn_cwd(up: Running, task_id: str) -> str:
    """The working directory the CLI reported for the turn (its stream's `system/init` line, as journaled)."""
    events = up.get(f"/api/tasks/{task_id}/events")["events"]
    found = [e["payload"]["cwd"] for e in events if isinstance(e.get("payload"), dict) and "cwd" in e["payload"]]
    assert found, [e["event_type"] for e in events]
    return str(found[0])


# ---- the README's set-up, once per session -----------------------------------------------------------------

DEMO_QUESTION = "no tests"  # what the demo's question asks (petal_dispatch/demo/scenario.json)


@dataclass
class SetUp:
    """A fresh clone after the README's `setup` block ran in it (its `up --demo` played to the question and
    stopped by Ctrl-C): what it printed and answered, and the clone's `git status` then."""
    checkout: Checkout
    rc: int
    output: str
    asks: list[dict[str, Any]]
    info: dict[str, Any]
    status: list[str]


# The tests on the set-up clone share it: one xdist worker runs them all (`--dist loadgroup`), one after another
# (each compares the clone's status before and after), and the set-up runs once per session.
ON_THE_SET_UP_CLONE = pytest.mark.xdist_group("shipped-set-up-clone")


@pytest.fixture(scope="session")
def set_up(tmp_path_factory: pytest.TempPathFactory) -> SetUp:
    from tests.served import free_port

    tmp = tmp_path_factory.mktemp("set-up")
    checkout = fresh_checkout(tmp)
    block = readme_block(checkout.root / "README.md", "setup")
    port, mcp_port = free_port(), free_port()
    # from the clone's top, as the README's reader runs it; setup.sh hands arguments after --demo to `up`
    up = start(with_ports(block, "scripts/setup.sh --demo", port, mcp_port), checkout.env(), checkout.root,
               tmp / "logs")
    try:
        up.wait_url(port, timeout=600)  # a venv made and the package installed first
        asks = until_blocking(lambda: up.get("/api/asks?status=pending")["asks"],
                              lambda: f"the demo's question:\n{up.output()}", timeout=180, every=0.5)
        info = up.get("/api/info")
    finally:
        rc = up.stop()
    return SetUp(checkout, rc, up.output(), asks, info, checkout.status())
