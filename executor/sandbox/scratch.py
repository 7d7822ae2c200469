"""Private directories in the system's temporary directory (a Unix socket's path holds at most 108 bytes, a data
directory's can be longer), each holding a lock for as long as its executor lives: a killed executor cannot remove
its own, and the next one to start removes those whose lock nobody holds.

A lock rather than a process id: another executor's id says nothing across PID namespaces sharing `/tmp`, and a
reused id would keep a dead one's directory for good. The lock is an open file description's (flock), released by
the kernel however its executor ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from shared import logs

log = logs.get(__name__)

# the executor's directories there (executor/run/isolation.py's gateways, executor/terminals/server.py's socket)
PREFIXES = ("petal-gw-", "petal-term-")
_NAME = re.compile(r"petal-(?:gw|term)-[A-Za-z0-9_]{1,64}")
OWNER = ".owner"


class Scratch:
    """A 0700 directory of this executor's (tempfile.mkdtemp) and the lock that says it is in use."""

    def __init__(self, prefix: str, root: Path | None = None):
        if prefix not in PREFIXES:
            raise ValueError(f"not a scratch prefix: {prefix!r}")
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        # not inherited by spawns (Python's descriptors are close-on-exec): the lock lives with this process
        self._fd: int | None = os.open(self.path / OWNER, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _abandoned(path: Path) -> int | None:
    """The directory's lock, taken, when its owner is gone; None when it is held or the directory is not one of
    ours as made (no lock file, or something else in its place)."""
    try:
        fd = os.open(path / OWNER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
    except OSError:
        pass  # held: its executor lives
    os.close(fd)
    return None


def sweep(root: Path | None = None) -> list[Path]:
    """Remove this user's executor directories that no living executor holds; the ones removed."""
    removed: list[Path] = []
    uid = os.getuid()
    with os.scandir(root or tempfile.gettempdir()) as entries:
        for entry in entries:
            if not _NAME.fullmatch(entry.name):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
                    continue
                fd = _abandoned(Path(entry.path))
                if fd is None:
                    continue
                try:
                    shutil.rmtree(entry.path)  # fd-based on Linux: a link inside is removed, not followed
                    removed.append(Path(entry.path))
                finally:
                    os.close(fd)
    if removed:
        log.info("scratch_swept", removed=len(removed))
    return removed
