"""The executor's children are watched by their pidfds (shared/children.py), not by a thread each: in a Python of
its own that installs the watcher as the `executor` command does, 20 children running at once start no thread,
and each one's exit status arrives as asyncio's own watcher gives it; the default watcher (the negative control)
starts a thread per child, as the watcher itself does for a child it can get no pidfd for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHILDREN = """
import asyncio, json, signal, sys, threading
from shared import children
installed = children.watch_by_pidfd() if sys.argv[1] != "default" else False
if sys.argv[1] == "no-fd":  # out of file descriptors for a pidfd: a thread waits for that child
    def refused(pid, flags=0):
        raise OSError(24, "Too many open files")
    children.os.pidfd_open = refused
async def main():
    before = threading.active_count()
    procs = [await asyncio.create_subprocess_exec("sleep", "30") for _ in range(20)]
    during = threading.active_count()
    quick = [await asyncio.create_subprocess_exec("sh", "-c", f"exit {i}") for i in range(4)]
    for p in procs:
        p.send_signal(signal.SIGTERM)
    codes = [await p.wait() for p in quick] + [await p.wait() for p in procs]
    print(json.dumps({"installed": installed, "threads": during - before, "codes": codes}))
asyncio.run(main())
"""


def _run(watcher: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", CHILDREN, watcher], capture_output=True, text=True, timeout=60,
                         check=True, cwd=Path(__file__).parents[2])
    result: dict[str, object] = json.loads(out.stdout)
    return result


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="asyncio watches pidfds itself from 3.12 on")
def test_children_are_watched_by_their_pidfds_without_a_thread_each() -> None:
    pidfd, default, no_fd = _run("pidfd"), _run("default"), _run("no-fd")
    assert pidfd == {"installed": True, "threads": 0, "codes": [0, 1, 2, 3] + [-15] * 20}
    assert default["codes"] == pidfd["codes"] and default["threads"] == 20  # a thread per running child
    assert no_fd == {"installed": True, "threads": 20, "codes": pidfd["codes"]}

