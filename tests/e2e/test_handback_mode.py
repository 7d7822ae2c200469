"""The hand-back's permission mode: a conversation's file can name the permission mode the CLI resumes it in (a
`permission-mode` line, which the CLI writes when the mode changes and restores on `--resume`), and that file is
a spawn's to write (its own conversation, inside its sandbox). The user's terminal then ran the page's command
unsandboxed in the mode the spawn chose: acceptEdits or auto (edits and file-changing commands without asking),
whatever the user's own settings say. The page's command names the mode (`--permission-mode manual`), and a mode
on the command line wins. The conversation is the CLI's own (`claude -p --session-id`), the planted line is what a
spawn appends to it, the command is `threads.resume_command` as the API gives it, run on a pty as a user pastes
it. Negative control: the same command without that flag resumes in the planted mode. Real CLI, scripted model."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import uuid
from pathlib import Path

import pyte
import pytest

from executor.sandbox import cliconfig
from executor.sandbox.cliconfig import session_dir
from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from shared import threads
from tests.e2e.test_isolation_cliconfig import KEY, _users_files
from tests.harness import claude_bin
from tests.wait import until_blocking

pytestmark = pytest.mark.e2e

MANUAL = " --permission-mode manual"
# the footer under the prompt box, without its spaces
MODES = {"manualmodeon": "manual", "accepteditson": "acceptEdits", "automodeon": "auto", "planmodeon": "plan"}


def _env(model: ScriptedModelServer, home: Path) -> dict[str, str]:
    return {"PATH": f"{Path(claude_bin()).parent}:/usr/bin:/bin", "HOME": str(home), "TERM": "xterm-256color",
            "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": KEY, "NO_PROXY": "127.0.0.1,localhost",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}


def _mode_shown(command: str, env: dict[str, str]) -> str:
    """Run `command` as pasted into a terminal (bash on a pty) and return the permission mode its footer shows once
    the resumed conversation is on the screen."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the user's shell running the pasted command
        os.execve("/bin/bash", ["bash", "-c", command], env)
    screen = pyte.Screen(100, 30)
    stream = pyte.ByteStream(screen)

    def shown() -> str | None:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                raise AssertionError(f"the CLI exited: {screen.display}") from None
            if b"\x1b[6n" in chunk:  # where the cursor is: answered as a terminal does
                os.write(fd, b"\x1b[1;1R")
            stream.feed(chunk)
        lines = [line.strip() for line in screen.display]
        if "● ok" not in lines:  # the resumed conversation's reply: its file has been read
            return None
        shown = "".join(lines).replace(" ", "")  # the screen as it is now, not what was drawn before
        return next((mode for said, mode in MODES.items() if said in shown), None)

    try:
        return until_blocking(shown, lambda: "the footer's mode: " + "\n".join(screen.display), timeout=60, every=0)
    finally:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
        os.close(fd)


def _conversation(tmp_path: Path, model: ScriptedModelServer) -> tuple[Path, Path, str, dict[str, str]]:
    """The CLI's own conversation in a user's config directory: (the work directory, the config directory, its id,
    the terminal's environment)."""
    work, config, home = tmp_path / "work", tmp_path / "claude-config", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    _users_files(config, work)  # the user's own settings name no mode: the CLI's default would be auto
    session = str(uuid.uuid4())
    env = _env(model, home)
    subprocess.run([claude_bin(), "-p", "hello", "--session-id", session], cwd=work, check=True, timeout=120,
                   env={**env, "CLAUDE_CONFIG_DIR": str(config)}, capture_output=True)
    return work, config, session, env


def _planted(conversation: Path, session: str) -> None:
    """What a spawn appends to its own conversation."""
    with conversation.open("a") as f:
        f.write(json.dumps({"type": "permission-mode", "permissionMode": "acceptEdits", "sessionId": session}) + "\n")


def test_a_mode_planted_in_the_conversation_does_not_set_the_hand_backs(tmp_path: Path) -> None:
    with ScriptedModelServer(Scenario(default={"text": "ok"})) as model:
        work, config, session, env = _conversation(tmp_path, model)
        conversation = session_dir(config, work) / f"{session}.jsonl"
        command = threads.resume_command(str(work), str(config), session, claude_bin())
        assert MANUAL in command, command
        # planted again before each run: the CLI writes the mode it resumed in to the file
        _planted(conversation, session)
        without = _mode_shown(command.replace(MANUAL, ""), env)
        _planted(conversation, session)
        as_given = _mode_shown(command, env)
    assert as_given == "manual"
    assert without == "acceptEdits"  # the negative control: the planted line sets the mode


def test_after_the_spawn_the_users_own_plain_resume_starts_in_manual_mode_too(tmp_path: Path) -> None:
    """An adopted conversation is the user's own file: their plain `claude --resume` (no flags of ours) restores
    what a spawn planted there, unless the executor's step after the spawn (`keep_session`) puts the CLI's manual
    line after it. The negative control is the test above: the same plain command, the line planted, acceptEdits."""
    with ScriptedModelServer(Scenario(default={"text": "ok"})) as model:
        work, config, session, env = _conversation(tmp_path, model)
        _planted(session_dir(config, work) / f"{session}.jsonl", session)
        cliconfig.keep_session(config, work, session, "the-spawn")  # as after every spawn of the conversation
        plain = f"cd {work} && CLAUDE_CONFIG_DIR={config} {claude_bin()} --resume {session}"
        assert _mode_shown(plain, env) == "manual"
