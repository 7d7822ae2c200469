"""The README's blocks, run as pasted: a test fails when the README changes and its commands stop working.

`setup` (`bash scripts/setup.sh --demo`) runs in a fresh clone with a fresh HOME (the session's `set_up`,
tests/shipped/conftest.py): it makes the venv, installs, and its `up --demo` plays to the demo's question; Ctrl-C
stops it with exit 0. Then, in the same clone, the "For real" section: its login block after activating the venv
(`claude` is the pinned CLI), and the `for-real` block from a directory of the user's own: a chat message gets
its reply from the model, in the documented working directory, and nothing is written into the clone.

The only changes to a block: `--port`/`--mcp-port` added to its `up` (free ports: the defaults 8000/8002 may be
taken by another test on the machine; for the setup block, setup.sh hands what follows --demo to `up`), and the
model's address (ANTHROPIC_BASE_URL at the scripted model, a fake ANTHROPIC_API_KEY as the login)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from petal_dispatch.demo.scripted_model import ScriptedModelServer
from tests.served import free_port
from tests.shipped.conftest import (
    DEMO_QUESTION,
    ON_THE_SET_UP_CLONE,
    Running,
    SetUp,
    chat_turn,
    model_env,
    readme_block,
    start,
    turn_cwd,
    with_ports,
)

pytestmark = [ON_THE_SET_UP_CLONE]


def test_the_setup_block_in_a_fresh_clone_installs_and_plays_the_demo_and_ctrl_c_stops_it(set_up: SetUp) -> None:
    assert set_up.rc == 0, set_up.output
    assert "making .venv" in set_up.output and "pip install -e ." in set_up.output, set_up.output
    assert set_up.info["demo"] is True
    assert DEMO_QUESTION in set_up.asks[0]["questions"][0]["question"]
    # what it made in the clone: the venv, the data directory (./var, as the README says) and bytecode caches
    made = [line for line in set_up.status if not line.endswith("__pycache__/")]
    assert made == ["!! .venv/", "!! var/"], set_up.status


def _login_block(readme: Path) -> str:
    """The "For real" section's first block: activate the venv, log in."""
    section = readme.read_text().split("\n## For real", 1)[1]
    found = re.search(r"^```[a-z]*\n(.*?)^```", section, re.M | re.S)
    assert found and "auth login" in found.group(1), section[:600]
    return found.group(1)


def test_after_the_setup_the_login_block_runs_the_pinned_claude(set_up: SetUp) -> None:
    checkout = set_up.checkout
    block = _login_block(checkout.root / "README.md")
    # `auth login` opens a browser to sign in: its `--version` stands in, run by the same `claude`
    script = block.replace("auth login", "--version") + "command -v claude\n"
    out = subprocess.run(["bash", "-ec", script], cwd=checkout.root, env=checkout.env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    version, where = out.stdout.strip().splitlines()[-2:]
    assert version.endswith("(Claude Code)") and where == str(checkout.venv_bin / "claude"), out.stdout
    assert Path(os.readlink(where)).is_relative_to(checkout.home / ".cache" / "petal-dispatch"), where


def test_the_for_real_block_from_a_project_directory_answers_in_petals_workdir_and_writes_nothing_in_the_clone(
        set_up: SetUp, model: ScriptedModelServer, running: list[Running], tmp_path: Path) -> None:
    checkout = set_up.checkout
    project = tmp_path / "my-project"
    project.mkdir()
    port, mcp_port = free_port(), free_port()
    block = with_ports(readme_block(checkout.root / "README.md", "for-real"), "petal-dispatch up", port, mcp_port)
    before = checkout.status()
    up = start(f". {checkout.root}/.venv/bin/activate\n{block}", checkout.env(**model_env(model)), project,
               tmp_path / "logs")
    running.append(up)
    up.wait_url(port)
    turn = chat_turn(up)
    info, cwd = up.get("/api/info"), turn_cwd(up, turn["id"])
    assert up.stop() == 0, up.output()
    # the working directory the README documents, in /api/info and where the CLI ran the turn
    workdir = checkout.home / ".local" / "share" / "petal-dispatch" / "workdir"
    assert [w["workdir"] for w in info["workdirs"]] == [str(workdir)], info
    assert cwd == str(workdir)
    # nothing in the clone: its status as the set-up left it (the data directory is ./var of the project)
    assert checkout.written_since(before) == []
    assert sorted(p.name for p in project.iterdir()) == ["var"]
