"""A worker's tree goes however it left its directories: read-only, or unreadable (mode 000), which only binds an
executor without root's power to pass permissions — so, run as root, the removal runs without it (the capabilities
that override file modes dropped: root then meets the modes of the files it owns) (executor/projects/worktrees.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[2]
_REMOVE = "import sys; from pathlib import Path; from executor.projects.worktrees import _rmtree; _rmtree(Path(sys.argv[1]))"


def _remove_unprivileged(tree: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", _REMOVE, str(tree)]
    if os.getuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("run as root without setpriv: file modes cannot bind here")
        argv = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--", *argv]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_tree_with_unreadable_and_read_only_directories_is_removed() -> None:
    base = Path(tempfile.mkdtemp(prefix="petal-rmtree-"))
    try:
        base.chmod(0o755)
        tree = base / "tree"
        (tree / "locked" / "inner").mkdir(parents=True)
        (tree / "locked" / "inner" / "f").write_text("x")
        (tree / "read-only").mkdir()
        (tree / "read-only" / "g").write_text("y")
        (tree / "locked" / "inner").chmod(0)
        (tree / "locked").chmod(0)
        (tree / "read-only").chmod(0o500)
        done = _remove_unprivileged(tree)
        assert done.returncode == 0, done.stderr
        assert not tree.exists()
    finally:
        for top, dirs, _ in os.walk(base):
            for d in dirs:
                os.chmod(os.path.join(top, d), 0o700)
        shutil.rmtree(base, ignore_errors=True)
