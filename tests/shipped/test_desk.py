"""The README's "Continue at your desk, keep going on the phone", as pasted: `up` started as the "For real" block
says, then `petal-dispatch claude` in a project directory under the home (in tmux, as a terminal is), with no
setting the README does not name: the wrapper finds the executor by the link it leaves, and what is typed at the
desk is on the page. The only changes: free ports on `up`, the model's address and a fake key as the login, and a
CLI config directory of the user's with its first-run questions answered (as the user's own would have them)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from petal_dispatch.demo.scripted_model import ScriptedModelServer
from tests.served import free_port
from tests.shipped._start import processes_under
from tests.shipped.conftest import FAKE_KEY, ON_THE_SET_UP_CLONE, Running, SetUp, model_env, readme_block, start, with_ports
from tests.wait import until_blocking

pytestmark = [ON_THE_SET_UP_CLONE]


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, check=False).stdout


def test_the_desk_block_shows_the_terminal_session_on_the_page(
        set_up: SetUp, model: ScriptedModelServer, running: list[Running], tmp_path: Path) -> None:
    checkout = set_up.checkout
    code = checkout.home / f"code-{tmp_path.name}"
    app = code / "app"
    app.mkdir(parents=True)
    config = checkout.home / f"claude-{tmp_path.name}"  # the user's own CLI config, first-run questions answered
    config.mkdir()
    (config / ".claude.json").write_text(json.dumps({
        "hasCompletedOnboarding": True, "customApiKeyResponses": {"approved": [FAKE_KEY[-20:]], "rejected": []},
        "projects": {str(app): {"hasTrustDialogAccepted": True}}}))
    env = checkout.env(**model_env(model))
    port, mcp_port = free_port(), free_port()
    for_real = with_ports(readme_block(checkout.root / "README.md", "for-real"), "petal-dispatch up", port, mcp_port)
    up = start(f". {checkout.root}/.venv/bin/activate\n{for_real}", env, code, tmp_path / "logs")
    running.append(up)
    up.wait_url(port)
    link = checkout.home / ".local" / "state" / "petal-dispatch" / "terminals.sock"
    until_blocking(link.exists, "the executor's link to its terminal socket", 30)

    desk = readme_block(checkout.root / "README.md", "desk")
    sock = f"desk-{tmp_path.name[-8:]}"
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**env, "CLAUDE_CONFIG_DIR": str(config),
                                                          "TERM": "xterm-256color"}.items())
    script = tmp_path / "desk.sh"
    # the user's shell (tmux's server has the test's environment), then the venv activated as the README says
    script.write_text(f"export {envs}\ncd {shlex.quote(str(app))}\n. {checkout.root}/.venv/bin/activate\n"
                      f"{desk}echo EXIT:$? > {tmp_path}/desk.exit\nsleep 600\n")
    _tmux(sock, "new-session", "-d", "-s", "desk", "-x", "120", "-y", "40", f"bash {script}")
    try:
        until_blocking(lambda: "❯" in _tmux(sock, "capture-pane", "-p", "-t", "desk"),
                       lambda: "the CLI's prompt:\n" + _tmux(sock, "capture-pane", "-p", "-t", "desk"), 60)
        _tmux(sock, "send-keys", "-t", "desk", "-l", "hello from the desk")
        _tmux(sock, "send-keys", "-t", "desk", "Enter")

        def live() -> dict[str, object] | None:
            return next((t for t in up.get("/api/threads")["threads"] if t.get("terminal")), None)
        thread = until_blocking(live, "the thread live in a terminal", 30)
        assert thread["terminal"]["cwd"] == str(app)  # type: ignore[index]

        def said() -> list[str] | None:
            events = up.get(f"/api/threads/{thread['id']}/conversation")["events"]
            said = [json.dumps(e["payload"]) for e in events]
            return said if any("hello from the desk" in s for s in said) and \
                any(e["event_type"] == "terminal.entry" for e in events) else None
        until_blocking(said, "the desk's prompt and the reply on the page", 30)
    finally:
        _tmux(sock, "kill-server")
    assert up.stop() == 0, up.output()
    assert not link.exists() and not link.is_symlink()  # the link goes with the executor
    until_blocking(lambda: processes_under(app) == [], lambda: f"left running: {processes_under(app)}", 30)
