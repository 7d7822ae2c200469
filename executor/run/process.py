"""Process-level helpers: unbounded line framing, signalling a process group, sweeping orphans."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator

import psutil

# A flood of lines is taken 64 KiB at a time: fewer reads, and bigger batches for the journal writer.
READ_CHUNK = 1 << 16
# The longest line held whole: a longer one is handed on in pieces of this size (each then a line of its own, not
# JSON). A spawn's output is its word, a process in its sandbox can write it, and one endless line would otherwise
# grow the executor's memory without bound.
MAX_LINE = 64 << 20


async def iter_line_chunks(stream: asyncio.StreamReader) -> AsyncIterator[list[bytes]]:
    """The complete lines of each read, up to MAX_LINE long (a 5 MB stream-json line is normal); split on b"\\n"
    only and decode later. Handing over a read's lines together keeps per-line overhead low. A line's start is
    kept in a bytearray each read extends in place (bytes joined again at every read cost the square of a long
    line's length: 64 MiB took the event loop 17 s)."""
    buf = bytearray()
    while chunk := await stream.read(READ_CHUNK):
        if b"\n" not in chunk:
            buf += chunk
            if len(buf) >= MAX_LINE:
                yield [bytes(buf)]
                buf.clear()
            continue
        first, *lines, rest = chunk.split(b"\n")
        buf += first
        yield [bytes(buf), *lines]
        buf = bytearray(rest)
    if buf:
        # a last line without its newline (the process died mid-write) is still a line
        yield [bytes(buf)]


async def iter_lines(stream: asyncio.StreamReader) -> AsyncIterator[bytes]:
    async for lines in iter_line_chunks(stream):
        for line in lines:
            yield line


def signal_group(pid: int, sig: int) -> bool:
    """Signal the process group led by `pid` (children start in their own session). False if gone."""
    try:
        os.killpg(pid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def signal_inside(pid: int, sig: int, skip_exe: str) -> bool:
    """Signal what runs inside a sandbox whose launcher (`skip_exe`, bubblewrap) is `pid`: every descendant but
    the launcher's own processes. Signalled itself, bubblewrap's monitor would die at once and take the
    sandbox down with SIGKILL, so the CLI could neither clean up nor exit with its own status. False if gone."""
    try:
        inside = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return False
    sent = False
    for proc in inside:
        with contextlib.suppress(psutil.Error, OSError):
            if proc.exe() != skip_exe:
                proc.send_signal(sig)
                sent = True
    return sent


def find_by_env(var: str, value: str, *, exclude: set[int] | None = None) -> list[psutil.Process]:
    """Processes whose environment holds var=value: a task's processes, including orphans that left its
    process group (the CLI's Bash tool runs commands in their own session)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me or (exclude and proc.pid in exclude):
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if proc.environ().get(var) == value:
                found.append(proc)
    return found


def kill_all(procs: list[psutil.Process]) -> list[int]:
    killed = []
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            proc.send_signal(signal.SIGKILL)
            killed.append(proc.pid)
    return killed


def reap_orphans(procs: list[psutil.Process], grace_s: float) -> list[int]:
    """Kill what is left of a dead executor's task: first a grace for the processes to end on their own (the
    CLI got SIGTERM from its parent-death signal and is ending its Bash children itself), then SIGKILL for
    what still runs. Blocking; returns the pids it had to kill."""
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    return kill_all(alive)


def tree_rss(pid: int) -> int | None:
    """Resident memory of a process and its descendants, in bytes (a sandboxed CLI runs under bubblewrap);
    None when it is gone."""
    try:
        root = psutil.Process(pid)
        total = 0
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
        return total
    except psutil.Error:
        return None
