"""A set-up `up` cannot run is refused before anything starts, in one line naming the setting and the fix, and
`petal-dispatch doctor` says the same in a ✗ line (exit 1); a good set-up passes every check. Started as the
README says (`petal-dispatch up` from the venv, in a directory of the user's own, a fresh HOME): each case
differs from the good one in the one thing it breaks."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.served import free_port
from tests.shipped._start import (FAKE_KEY, ROOT, VENV_BIN, cli, fresh_home, port_free, processes_under,
                                  user_env)

pytestmark = [pytest.mark.shipped, pytest.mark.timeout(120)]

REFUSAL_S = 20.0  # a refusal is a few checks and `claude --version` / `auth status`: seconds, not a start


@dataclass(frozen=True)
class Case:
    """What breaks the good set-up (settings added or taken away, or the PATH), and the words the refusal
    must say: the setting (or program) and the fix."""

    settings: Callable[[Path], dict[str, str]]
    says: tuple[str, ...]
    path: Callable[[Path], str] | None = None
    # refused when the settings are read, by every command (`doctor` too: its one line, exit 2, no checks run)
    at_load: bool = False


def _path_without_bwrap(tmp: Path) -> str:
    """A PATH with everything a start needs but bubblewrap."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for prog in ("socat", "bash", "git", "setpriv", "node", "true", "env"):
        found = shutil.which(prog)
        if found:
            (bin_dir / prog).symlink_to(found)
    return f"{VENV_BIN}:{tmp / 'home' / '.local' / 'bin'}:{bin_dir}"


CASES = {
    "no-login": Case(lambda tmp: {"ANTHROPIC_API_KEY": ""}, ("login", "claude auth login")),
    "no-bwrap": Case(lambda tmp: {}, ("bwrap", "apt-get install bubblewrap socat"), _path_without_bwrap),
    "bad-claude-bin": Case(lambda tmp: {"PETAL_CLAUDE_BIN": str(tmp / "no-such" / "claude")},
                           ("PETAL_CLAUDE_BIN", "unset it")),
    "relative-workdir": Case(lambda tmp: {"PETAL_WORKDIR": "petal-work"},
                             ("PETAL_WORKDIR=petal-work", "relative", "absolute path"), at_load=True),
    "missing-workdir": Case(lambda tmp: {"PETAL_WORKDIR": str(tmp / "nowhere")},
                            ("PETAL_WORKDIR", "does not exist", "mkdir -p")),
    "workdir-is-the-checkout": Case(lambda tmp: {"PETAL_WORKDIR": str(ROOT)},
                                    ("PETAL_WORKDIR", "choose a directory of its own")),
    "workdir-contains-the-checkout": Case(lambda tmp: {"PETAL_WORKDIR": str(ROOT.parent)},
                                          ("PETAL_WORKDIR", "choose a directory of its own")),
}


def _setup(tmp: Path, case: Case | None) -> tuple[Path, dict[str, str]]:
    """The user's project directory (where `up` starts) and the environment: the good set-up, broken by `case`."""
    home = fresh_home(tmp)
    project = tmp / "project"
    (project / "petal-work").mkdir(parents=True)  # the relative workdir exists: refused for being relative
    settings = {"OPEN_MODE": "1", "ANTHROPIC_API_KEY": FAKE_KEY}  # the README's `OPEN_MODE=1 petal-dispatch up`
    if case is not None:
        settings.update(case.settings(tmp))
    settings = {k: v for k, v in settings.items() if v}  # "" takes a setting away
    env = user_env(home, case.path(tmp) if case is not None and case.path is not None else None, **settings)
    return project, env


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"not one line on stderr:\n{stderr}"
    assert lines[0].startswith("petal-dispatch: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("name", list(CASES))
def test_up_is_refused_in_one_line_naming_the_setting_and_the_fix_and_nothing_starts(name: str,
                                                                                     tmp_path: Path) -> None:
    case = CASES[name]
    project, env = _setup(tmp_path, case)
    port, mcp_port = free_port(), free_port()
    started = time.monotonic()
    out = subprocess.run(cli("up", "--port", str(port), "--mcp-port", str(mcp_port)), cwd=project, env=env,
                         capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert out.returncode != 0, out.stdout + out.stderr
    line = _one_line(out.stderr)
    for words in case.says:
        assert words in line, f"{words!r} not in {line!r}"
    print(f"{name}: refused in {took:.1f} s: {line}")
    assert took < REFUSAL_S, f"the refusal took {took:.1f} s"
    # nothing started: no database made, no process left, both ports free
    assert not (project / "var" / "pgdata").exists()
    assert processes_under(tmp_path) == []
    assert port_free(port) and port_free(mcp_port)


def _doctor(project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # doctor checks the ports `up` would take: the README's settings for them (doctor has no --port)
    env = {**env, "PETAL_INGRESS_PORT": str(free_port()), "PETAL_MCP_PORT": str(free_port())}
    return subprocess.run(cli("doctor"), cwd=project, env=env, capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize("name", list(CASES))
def test_doctor_says_the_same_in_a_cross_line_and_exits_1_or_refuses_the_settings_it_cannot_read(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    project, env = _setup(tmp_path, case)
    out = _doctor(project, env)
    if case.at_load:
        assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
        line = _one_line(out.stderr)
        assert all(words in line for words in case.says), line
        return
    assert out.returncode == 1, out.stdout + out.stderr
    failed = [line for line in out.stdout.splitlines() if line.startswith("✗ ")]
    assert len(failed) >= 1, out.stdout
    assert any(all(words in line for words in case.says) for line in failed), "\n".join(failed)
    assert "Traceback" not in out.stderr, out.stderr
    assert not (project / "var" / "pgdata").exists()


def test_doctor_on_a_good_set_up_passes_every_check_the_sandbox_probe_among_them_before_the_first_start_too(tmp_path: Path) -> None:
    project, env = _setup(tmp_path, None)
    # before the first start: the sandbox is probed on a temporary directory, and the default is not made
    default = tmp_path / "home" / ".local" / "share" / "petal-dispatch" / "workdir"
    before = _doctor(project, env)
    assert before.returncode == 0, before.stdout + before.stderr
    probe = [line for line in before.stdout.splitlines() if line.startswith("✓ sandbox probe: ")]
    assert probe and "a temporary directory" in probe[0], before.stdout
    assert not default.exists()
    # the default working directory as the first `up` leaves it: the probe runs a turn's sandbox there
    default.mkdir(parents=True)
    out = _doctor(project, env)
    assert out.returncode == 0, out.stdout + out.stderr
    *checks, summary = out.stdout.splitlines()
    assert summary == "all checks passed", out.stdout
    assert checks and all(line.startswith("✓ ") for line in checks), out.stdout
    names = [line[2:].split(":", 1)[0] for line in checks]
    for name in ("python", "sandbox", "claude", "login", "workdir", "sandbox probe"):
        assert name in names, names
    assert not (project / "var" / "pgdata").exists()  # doctor looks; it starts nothing
