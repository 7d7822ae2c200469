"""`up --demo`: its settings, the scripted model it starts, and its first message."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from petal_dispatch import config
from petal_dispatch.config import Settings
from shared import errors, lifeline

DEMO_MESSAGE = "Show me what you can do with this project."
DEMO_SCENARIO = Path(__file__).resolve().parent / "scenario.json"


def demo_settings(settings: Settings) -> tuple[Settings, dict[str, str]]:
    """The demo's own settings and environment: its project as the working directory (petal's own, beside the
    default working directory, never in the data directory or the checkout), its own CLI config directory, the
    scripted model's fake key; the page in open mode on loopback. The model's address is added when it starts."""
    project = config.default_workdir().parent / "demo-project"
    (project / "src").mkdir(parents=True, exist_ok=True)
    (project / "README.md").write_text("# A demo project\n\nSomething for the demo worker to look at.\n")
    (project / "src" / "app.py").write_text("print('hello')\n")
    claude_config = settings.data_dir / "demo-claude"
    env = {"ANTHROPIC_API_KEY": "sk-ant-demo-not-a-real-key", "PETAL_DEMO": "1",
           "PETAL_CLAUDE_CONFIG_DIR": str(claude_config), "PETAL_CLAUDE_MAX_RETRIES": "0", "PETAL_WORKDIR": str(project)}
    if config.is_loopback(settings.ingress_host):
        env["OPEN_MODE"] = "1"  # the demo is for a browser on this machine
    return settings.model_copy(update={"workdir": project, "claude_config_dir": claude_config}), env


def start_model(env: dict[str, str], scenario: Path = DEMO_SCENARIO) -> tuple[subprocess.Popen[str], str]:
    model = subprocess.Popen([sys.executable, "-m", "petal_dispatch.demo.scripted_model", "--scenario", str(scenario)],
                             stdout=subprocess.PIPE, text=True, preexec_fn=lifeline.die_with_parent(signal.SIGTERM))
    url = (model.stdout.readline() if model.stdout else "").strip()
    if not url.startswith("http://127.0.0.1:"):
        model.kill()
        raise errors.PetalError("the demo's scripted model did not start")
    env["ANTHROPIC_BASE_URL"] = url
    return model, url


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"},
                                 method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        answer: dict[str, object] = json.load(r)
    return answer


DEMO_THREAD_FILE = "demo-thread"


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def post_first_message(url: str, data_dir: Path) -> None:
    """The demo's thread is made once per data directory (its id kept in DEMO_THREAD_FILE) and its first
    message sent once: a later `up --demo` on the same directory reuses both."""
    marker = data_dir / DEMO_THREAD_FILE
    known = marker.read_text().strip() if marker.is_file() else ""
    if known:
        listed = _get(f"{url}/api/threads")
        threads = listed.get("threads") if isinstance(listed, dict) else None
        # reused unless the user archived it (then the demo starts over in a new thread)
        if any(isinstance(t, dict) and str(t.get("id")) == known and t.get("lifecycle") != "archived"
               for t in threads or []):
            return
    # an autonomous thread: the demo's worker starts without an approval (interactive threads ask first)
    thread = _post(f"{url}/api/threads", {"title": "Demo", "mode": "autonomous"})
    marker.write_text(f"{thread['thread_id']}\n")
    _post(f"{url}/api/chat", {"text": DEMO_MESSAGE, "thread_id": thread["thread_id"]})
