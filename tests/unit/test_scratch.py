"""The executor's socket directories in the temporary directory: those a killed executor left are removed by the next
one's sweep; a living executor's, and anything not made as one, are not (executor/sandbox/scratch.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from executor.sandbox import scratch

pytestmark = pytest.mark.unit

# a process that makes a scratch directory the executor's way, says where, and waits
_MAKER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from executor.sandbox import scratch
    s = scratch.Scratch(sys.argv[1], Path(sys.argv[2]))
    (s.path / "sock").write_text("x")
    print(s.path, flush=True)
    sys.stdin.read()
""")


def _holder(prefix: str, root: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen([sys.executable, "-c", _MAKER, prefix, str(root)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_executors_directories_are_swept_a_living_ones_are_kept(tmp_path: Path) -> None:
    (killed, left), (living, held) = _holder("petal-gw-", tmp_path), _holder("petal-term-", tmp_path)
    with killed, living:
        assert left.is_dir() and held.is_dir()
        assert scratch.sweep(tmp_path) == []  # both held: nothing goes
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        assert left.is_dir()  # the kill left it behind
        assert scratch.sweep(tmp_path) == [left]
        assert not left.exists() and (held / "sock").exists()
        living.kill()
        living.wait()
        assert scratch.sweep(tmp_path) == [held]


def test_this_process_keeps_its_own_and_removes_it_at_the_end(tmp_path: Path) -> None:
    own = scratch.Scratch("petal-gw-", tmp_path)
    assert scratch.sweep(tmp_path) == []  # another open of the lock file conflicts, in this process too
    own.remove()
    assert not own.path.exists()


def test_what_was_not_made_as_one_is_left_alone(tmp_path: Path) -> None:
    no_lock = tmp_path / "petal-gw-nolock"  # an older executor's, or one caught between mkdtemp and its lock
    no_lock.mkdir()
    fifo_dir = tmp_path / "petal-term-fifo"  # a lock file that is not a file: never opened to block on
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / scratch.OWNER)
    linked = tmp_path / "petal-gw-linked"  # a link to a directory elsewhere: not followed
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / scratch.OWNER).write_text("")
    linked.symlink_to(target)
    other = tmp_path / "unrelated"
    other.mkdir()
    (other / scratch.OWNER).write_text("")
    assert scratch.sweep(tmp_path) == []
    assert all(p.exists() for p in (no_lock, fifo_dir, linked, target, other))


def test_only_the_executors_prefixes_are_made() -> None:
    with pytest.raises(ValueError):
        scratch.Scratch("petal-push-")
