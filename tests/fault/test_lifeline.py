"""A child started by lifeline.spawn_dying_with_parent dies with its parent, even when the parent is killed
by SIGKILL (real processes: a parent Python that spawns the way the executor does, then is killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from shared import lifeline
from tests.wait import until_blocking

PARENT = """
import asyncio, signal, sys
from shared import lifeline
if sys.argv[1] == "fallback":
    lifeline._SETPRIV = None  # the path for a machine without setpriv
async def main():
    argv, preexec = lifeline.spawn_dying_with_parent(["sleep", "600"], signal.SIGTERM)
    proc = await asyncio.create_subprocess_exec(*argv, start_new_session=True, preexec_fn=preexec)
    print(proc.pid, flush=True)
    await asyncio.sleep(600)  # not a wait: the parent lives on until the test kills it
asyncio.run(main())
"""


def _wait_for_exec(pid: int) -> None:
    """Until the child runs `sleep` itself (through setpriv, the pid is setpriv's until it execs)."""
    until_blocking(lambda: psutil.Process(pid).name() == "sleep", lambda: f"{psutil.Process(pid).cmdline()} to exec",
                   10, every=0.01)


@pytest.mark.parametrize("way", ["setpriv", "fallback"])
def test_a_spawned_child_gets_sigterm_when_its_parent_is_killed(way: str, tmp_path: Path) -> None:
    if way == "setpriv" and lifeline._SETPRIV is None:
        pytest.skip("setpriv is not installed here")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, way], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[2])
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        _wait_for_exec(child.pid)
        if way == "setpriv":
            assert lifeline.spawn_dying_with_parent(["sleep"])[1] is None  # no preexec_fn: Python may vfork
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        # the child is not ours to reap (init adopts it): gone, or a zombie, within a few seconds
        until_blocking(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE,
                       lambda: f"{child.cmdline()} to die with its parent", 10, every=0.05)
    finally:
        parent.kill()
        parent.wait(10)
        parent.stdout.close()  # type: ignore[union-attr]  # stdout=PIPE: never None


def test_a_live_parent_leaves_its_child_running(tmp_path: Path) -> None:
    """The negative control: the child above died of its parent's death, not of something else."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, "setpriv"], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[2])
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        _wait_for_exec(child.pid)
        time.sleep(1)  # a window in which the child must not die (above, a dead parent's child dies within it)
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
        child.kill()
    finally:
        parent.kill()
        parent.wait(10)
        parent.stdout.close()  # type: ignore[union-attr]  # stdout=PIPE: never None
