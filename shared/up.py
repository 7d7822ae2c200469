"""`petal-dispatch up`: database → migrate → executor → ingress, as one supervised group.

The two services stay separate processes (they never share memory or talk over HTTP); this only
starts them, prints where to go, and stops them together. The embedded server is shared: each child
takes a handle on it, and it stops when the last one exits.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from shared import dbserver, errors, logs
from shared.settings import Settings

log = logs.get(__name__)

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
INSTALL_HINT = ("npm install -g @anthropic-ai/claude-code  (or: petal-dispatch install-claude, then set "
                "PETAL_CLAUDE_BIN to the path it prints)")


def find_claude(settings: Settings) -> str:
    found = shutil.which(settings.claude_bin)
    if found is None:
        raise errors.ConfigError(f"the Claude Code CLI ({settings.claude_bin!r}) is not installed: {INSTALL_HINT}")
    return found


def _child_env(base: Mapping[str, str], settings: Settings, claude: str) -> dict[str, str]:
    env = dict(base)
    env.update(PETAL_DATA_DIR=str(settings.data_dir.resolve()), PETAL_CLAUDE_BIN=claude,
               PETAL_INGRESS_HOST=settings.ingress_host, PETAL_INGRESS_PORT=str(settings.ingress_port),
               PETAL_MCP_HOST=settings.mcp_host, PETAL_MCP_PORT=str(settings.mcp_port))
    return env


def _wait_ready(url: str, children: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(c.poll() is not None for c in children):
            raise errors.PetalError("a service exited during start-up (see its log above)")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise errors.PetalError(f"the ingress was not ready within {READY_TIMEOUT_S:.0f} s")


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


DEMO_MESSAGE = "Show me what you can do with this project."


def _demo_claude(settings: Settings) -> str:
    """The demo runs the real CLI (against the scripted model): the configured one, else the pinned install."""
    from executor import cli_install

    found = shutil.which(settings.claude_bin) or (str(cli_install.installed_bin() or "") or None)
    if found is None:
        raise errors.ConfigError("the demo runs the real Claude Code CLI against a scripted model: install it with "
                                 "`petal-dispatch install-claude` (or npm install -g @anthropic-ai/claude-code)")
    return found


DEMO_SCENARIO = Path(__file__).resolve().parent.parent / "executor" / "demo" / "scenario.json"


def _start_demo_model(settings: Settings, env: dict[str, str],
                      scenario: Path = DEMO_SCENARIO) -> tuple[subprocess.Popen[str], str]:
    model = subprocess.Popen([sys.executable, "-m", "executor.scripted_model", "--scenario", str(scenario)],
                             stdout=subprocess.PIPE, text=True)
    url = (model.stdout.readline() if model.stdout else "").strip()
    if not url.startswith("http://127.0.0.1:"):
        model.kill()
        raise errors.PetalError("the demo's scripted model did not start")
    project = settings.data_dir.resolve() / "demo-project"
    (project / "src").mkdir(parents=True, exist_ok=True)
    (project / "README.md").write_text("# A demo project\n\nSomething for the demo worker to look at.\n")
    (project / "src" / "app.py").write_text("print('hello')\n")
    env.update(ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="sk-ant-demo-not-a-real-key", PETAL_DEMO="1",
               PETAL_CLAUDE_CONFIG_DIR=str(settings.data_dir.resolve() / "demo-claude"),
               PETAL_CLAUDE_MAX_RETRIES="0", PETAL_WORKDIR=str(project))
    if is_loopback_bind(settings):
        env["OPEN_MODE"] = "1"  # the demo is for a browser on this machine
    return model, url


def is_loopback_bind(settings: Settings) -> bool:
    from ingress.main import is_loopback

    return is_loopback(settings.ingress_host)


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"},
                                 method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def _post_demo_message(url: str) -> None:
    # an autonomous thread: the demo's worker starts without an approval (interactive threads ask first)
    thread = _post(f"{url}/api/threads", {"title": "Demo", "mode": "autonomous"})
    _post(f"{url}/api/chat", {"text": DEMO_MESSAGE, "thread_id": thread["thread_id"]})


def run(settings: Settings, env: Mapping[str, str], *, demo: bool = False, scenario: Path | None = None) -> int:
    """Run the pair. `demo`: the real CLI against the scripted model, playing `scenario` (a JSON file as
    executor/scripted_model.py describes) or, without one, the built-in demo, which also sends its first
    message."""
    from ingress.main import check_bind  # the same refusal the ingress itself makes, before anything starts

    check_bind(settings)
    if scenario is not None and not scenario.is_file():
        raise errors.ConfigError(f"no scenario file {scenario}")
    claude = _demo_claude(settings) if demo else find_claude(settings)
    info = dbserver.resolve(settings)  # starts the embedded server when there is no DATABASE_URL, migrates
    child_env = _child_env(env, settings, claude)
    extra: list[subprocess.Popen[str]] = []
    if demo:
        model, _ = _start_demo_model(settings, child_env, scenario or DEMO_SCENARIO)
        extra.append(model)
    stop = {"signal": 0}

    def on_signal(signum: int, frame: object) -> None:
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cmd = [sys.executable, "-m", "shared.cli"]
    children: list[subprocess.Popen[bytes]] = []
    try:
        children.append(subprocess.Popen([*cmd, "executor"], env=child_env))
        children.append(subprocess.Popen([*cmd, "ingress"], env=child_env))
        host = "127.0.0.1" if settings.ingress_host in ("0.0.0.0", "::") else settings.ingress_host
        url = f"http://{host}:{settings.ingress_port}"
        _wait_ready(url, children)
        if demo and scenario is None:
            _post_demo_message(url)
        what = "the demo (a scripted model, not Claude)" if demo else "petal-dispatch"
        print(f"{what} is up: {url}/  (database: {info.location}; Ctrl-C stops everything)", flush=True)
        while not stop["signal"]:
            if any(c.poll() is not None for c in children):
                log.error("service_exited", codes=[c.returncode for c in children])
                return 1
            time.sleep(0.2)
        return 0
    finally:
        _stop(children)
        _stop(extra)  # type: ignore[arg-type]
