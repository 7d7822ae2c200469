"""One data directory, one `up` (and one executor): an OS lock the kernel releases when its holder dies.

The lock is `fcntl.flock` on a file in the data directory's run/ directory, taken before anything starts;
once it is held the file is rewritten with a small JSON naming the holder (pid, ports), so a second
process refused by it can say who holds the directory. `up` holds `run/up.lock`; the executor (alone or
as `up`'s child) holds `run/executor.lock` — so `up`'s own child never meets its parent's lock, and a bare
`executor` beside a running `up` meets the lock `up`'s child holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from petal_dispatch.config import Settings
from shared import errors

UP = "up"
EXECUTOR = "executor"
# a holder writes its JSON right after it takes the lock: a reader that finds the file empty looks again
READ_HOLDER_S = 1.0


class DataDirInUse(errors.ConfigError):
    """Another process holds this data directory's lock (named in the message)."""


@dataclass
class DataDirLock:
    """A held lock; `release` (or the holder's death) frees it."""

    path: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_path(settings: Settings, kind: str) -> Path:
    return settings.data_dir.resolve() / "run" / f"{kind}.lock"


def _ports(settings: Settings, kind: str) -> dict[str, str]:
    mcp = f"{settings.mcp_host}:{settings.mcp_port}"
    if kind == EXECUTOR:
        return {"harness MCP": mcp}
    return {"ingress": f"{settings.ingress_host}:{settings.ingress_port}", "harness MCP": mcp}


def acquire(settings: Settings, kind: str) -> DataDirLock:
    """Take `kind`'s lock on the data directory (its run/ must exist: dbfiles.check_data_dir makes it),
    or raise DataDirInUse naming the holder. Never blocks."""
    path = lock_path(settings, kind)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirInUse(in_use_message(settings, kind, read_holder(path))) from None
    except BaseException:
        os.close(fd)
        raise
    body = json.dumps({"pid": os.getpid(), "command": kind, "ports": _ports(settings, kind),
                       "started_at": time.time()}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, body, 0)
    return DataDirLock(path, fd)


def probe(settings: Settings, kind: str) -> None:
    """Refuse (DataDirInUse) when `kind`'s lock is held now; hold nothing."""
    acquire(settings, kind).release()


def read_holder(path: Path) -> dict[str, Any]:
    deadline = time.monotonic() + READ_HOLDER_S
    while True:
        try:
            data = json.loads(path.read_text() or "null")
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) or time.monotonic() >= deadline:
            return data if isinstance(data, dict) else {}
        time.sleep(0.05)


def in_use_message(settings: Settings, kind: str, holder: dict[str, Any]) -> str:
    data_dir = settings.data_dir.resolve()
    who = f"`petal-dispatch {holder.get('command') or kind}`"
    facts = [f"pid {holder['pid']}"] if holder.get("pid") else []
    ports = holder.get("ports")
    if isinstance(ports, dict):
        facts += [f"{name} {where}" for name, where in ports.items()]
    held = f" ({', '.join(facts)})" if facts else ""
    return (f"the data directory {data_dir} is in use by {who}{held}: stop it first, or give this one "
            "another --data-dir")
