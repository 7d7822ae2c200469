"""scripts/setup.sh, the one command from a fresh clone: run in a `git clone` of this repository's committed HEAD
with a fresh HOME (its CLI cache a link to the real one, so the pinned CLI is not downloaded again; the session's
set-up clone), it makes the venv and installs the package, and a second run installs nothing. Where it cannot
install the system packages it stops with the one apt line to run — the line asks for npm only where apt's npm does
not conflict with the Node.js there is (NodeSource's nodejs ships npm itself)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from petal_dispatch import cli_install
from tests.shipped.conftest import ON_THE_SET_UP_CLONE, SetUp

ROOT = Path(__file__).resolve().parents[2]
# the real caches: the pinned CLI (~/.cache/petal-dispatch) and pip's, shared with the fresh HOME's runs
CLI_CACHE = cli_install.default_prefix().parents[1]
PIP_CACHE = Path(os.environ.get("PIP_CACHE_DIR") or Path.home() / ".cache" / "pip")
# what apt-get's line starts with for this user: root runs it as it is
SUDO = "" if os.geteuid() == 0 else "sudo "


def _clone(tmp: Path) -> Path:
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, capture_output=True)
    return clone


def _home(tmp: Path, *, cli_cached: bool) -> Path:
    home = tmp / "home"
    (home / ".cache").mkdir(parents=True)
    if cli_cached:
        (home / ".cache" / "petal-dispatch").symlink_to(CLI_CACHE)
    return home


def _path_without_venvs() -> str:
    """The PATH, less any venv's bin directory (this run's own .venv among them): the script must find the
    machine's python3, as a newcomer's shell would."""
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if d and not (Path(d).parent / "pyvenv.cfg").exists())


def _setup(clone: Path, home: Path, path: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {"PATH": path, "HOME": str(home), "PIP_CACHE_DIR": str(PIP_CACHE), "LANG": "C.UTF-8"}
    return subprocess.run(["bash", str(clone / "scripts" / "setup.sh"), *args], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


@ON_THE_SET_UP_CLONE
def test_after_the_set_up_the_venv_runs_the_clone_and_a_second_run_installs_nothing(set_up: SetUp) -> None:
    """The session's set-up (tests/shipped/conftest.py `set_up`) was this script's first run in a fresh clone:
    it made the venv and installed (tests/shipped/test_readme.py checks what it printed)."""
    checkout = set_up.checkout
    venv = checkout.venv_bin
    helped = subprocess.run([str(venv / "petal-dispatch"), "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "up" in helped.stdout, helped.stderr
    # editable: the venv runs the clone's code
    where = subprocess.run([str(venv / "python"), "-c", "import petal_dispatch; print(petal_dispatch.__file__)"],
                           capture_output=True, text=True, check=True, cwd=checkout.home).stdout
    assert where.startswith(str(checkout.root)), where
    before = checkout.status()
    second = _setup(checkout.root, checkout.home, _path_without_venvs())
    assert second.returncode == 0, second.stdout + second.stderr
    assert "→" not in second.stdout, second.stdout  # every step found done: nothing installed
    assert checkout.written_since(before) == []
    # what a newcomer is told to do next: activate the venv, start for real
    assert ". .venv/bin/activate" in second.stdout and "petal-dispatch up" in second.stdout


def _fake_path(tmp: Path, drop: set[str], standins: dict[str, str]) -> str:
    """One directory standing in for the PATH: every program of the real PATH (venvs left out) but those in
    `drop`, and shell scripts for those in `standins`."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for d in _path_without_venvs().split(os.pathsep):
        if not Path(d).is_dir():
            continue
        for prog in Path(d).iterdir():
            target = bin_dir / prog.name
            if prog.name in drop or prog.name in standins or target.exists() or target.is_symlink():
                continue
            if os.access(prog, os.X_OK) and not prog.is_dir():
                target.symlink_to(prog)
    for name, body in standins.items():
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(bin_dir)


def _policy(installed: str, candidate: str) -> str:
    """apt-cache policy nodejs, as apt prints it."""
    return f"cat <<'EOF'\nnodejs:\n  Installed: {installed}\n  Candidate: {candidate}\nEOF"


# apt-get and sudo that record their call and fail: the script can install nothing
FAILING = {"apt-get": 'echo "apt-get $*" >>"$HOME/tried"; exit 100',
           "sudo": 'echo "sudo $*" >>"$HOME/tried"; exit 1'}
NODESOURCE, DEBIAN = "20.11.0-1nodesource1", "18.19.0+dfsg-6~deb12u1"


@pytest.mark.parametrize(("why", "cli_cached", "standins", "packages"), [
    # the sandbox's programs missing (the CLI is in the cache: no Node.js needed)
    ("sandbox", True, {}, "bubblewrap socat"),
    # no Node.js, no CLI, NodeSource's repository configured: its nodejs brings npm; apt's npm would conflict
    ("nodesource-repo", False, {"apt-cache": _policy("(none)", NODESOURCE)}, "bubblewrap socat nodejs"),
    # no Node.js, no CLI, the distribution's packages: nodejs and npm
    ("debian", False, {"apt-cache": _policy("(none)", DEBIAN)}, "bubblewrap socat nodejs npm"),
])
def test_where_it_cannot_install_it_stops_with_the_one_apt_line(
        tmp_path: Path, why: str, cli_cached: bool, standins: dict[str, str], packages: str) -> None:
    clone, home = _clone(tmp_path), _home(tmp_path, cli_cached=cli_cached)
    path = _fake_path(tmp_path, {"bwrap", "socat", "node", "npm", "claude"}, {**FAILING, **standins})
    out = _setup(clone, home, path)
    assert out.returncode != 0, out.stdout
    line = out.stderr.strip().splitlines()[-1]
    # the one line to paste (a python3.X-venv first where this machine's python3 lacks ensurepip)
    pattern = rf"{SUDO}apt-get update && {SUDO}apt-get install -y (python3\.\d+-venv )?{packages}"
    assert re.fullmatch(pattern, line), out.stderr
    # it tried what it could (root: apt-get; a user: sudo without a password), and made nothing meanwhile
    tried = (home / "tried").read_text()
    assert ("apt-get update" in tried) if not SUDO else ("sudo -n true" in tried), tried
    assert not (clone / ".venv").exists()


def test_beside_nodesources_node_without_npm_it_never_asks_apt_for_npm(tmp_path: Path) -> None:
    clone, home = _clone(tmp_path), _home(tmp_path, cli_cached=False)
    path = _fake_path(tmp_path, {"npm", "claude"}, {
        **FAILING, "apt-cache": _policy(NODESOURCE, NODESOURCE), "node": "echo v20.11.0"})
    out = _setup(clone, home, path)
    assert out.returncode != 0, out.stdout
    assert "NodeSource" in out.stderr and "apt-get install --reinstall nodejs" in out.stderr, out.stderr
    assert not re.search(r"install -y .*\bnpm\b", out.stderr), out.stderr
    assert not (home / "tried").exists()  # nothing was asked of apt
