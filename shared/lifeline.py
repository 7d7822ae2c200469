"""Children that die with their parent (a parent-death signal set between fork and exec), a process whose
memory and environment its children cannot read (Linux prctl), and the environment a child may inherit."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

# The services' own settings and database credentials never reach a child (a worker's CLI, git and the hooks
# of the repository it runs): a child holding the executor's DSN (or a push/ntfy secret) could write the store
# directly and go around every boundary. ANTHROPIC_LOG=debug makes the CLI write HTTP logs to stdout.
SCRUBBED_ENV_PREFIXES = ("PETAL_", "PG")
SCRUBBED_ENV_NAMES = ("DATABASE_URL", "OPEN_MODE", "ANTHROPIC_LOG")


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without what no child may inherit; case-blind, as the settings read `petal_executor_dsn` as
    readily as `PETAL_EXECUTOR_DSN`."""
    return {k: v for k, v in environ.items()
            if k.upper() not in SCRUBBED_ENV_NAMES and not k.upper().startswith(SCRUBBED_ENV_PREFIXES)}


# prctl(2) option: the signal the kernel sends a process when the thread that started it dies
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
# Resolved once here: after fork, in the child, nothing may load libraries or take locks.
_prctl = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl if sys.platform == "linux" else None


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn`: the child gets `sig` when this process dies, even by SIGKILL, so nothing it started
    runs on unsupervised. The setting survives exec; the child's own children do not inherit it. Call
    it in the thread that spawns (the signal fires when that thread ends; asyncio spawns from its loop's)."""
    parent = os.getpid()

    def preexec() -> None:
        if _prctl is None:
            return  # not Linux: whoever starts next must sweep
        _prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os.kill(os.getpid(), sig)

    return preexec


# util-linux's setpriv sets the parent-death signal in the child and execs the command. Spawning through it
# keeps `preexec_fn` out of the spawn, so Python can vfork: a fork of the executor (100+ MiB resident)
# copies its page tables and costs about 10 ms a spawn, a vfork under 1 ms.
_SETPRIV = shutil.which("setpriv") if sys.platform == "linux" else None


def spawn_dying_with_parent(argv: Sequence[str], sig: int = signal.SIGTERM, *, path: str | None = None
                            ) -> tuple[list[str], Callable[[], None] | None]:
    """The argv and `preexec_fn` to start `argv` as a child that gets `sig` when this process dies: through
    setpriv where it is installed (no preexec_fn), by `die_with_parent` otherwise. Through setpriv, an
    executor that dies in the instant between the spawn and setpriv's prctl leaves the child running; the
    next executor's start-up sweep (by the task's environment) ends it.

    Raises:
        FileNotFoundError: the command is not an executable on `path` (the child's PATH): said here, as a
            plain spawn would, rather than by setpriv's exit status once it runs.
    """
    if _SETPRIV is None:
        return list(argv), die_with_parent(sig)
    found = shutil.which(argv[0], path=path)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    return [_SETPRIV, "--pdeathsig", signal.Signals(sig).name.removeprefix("SIG"), "--", found, *argv[1:]], None


def keep_private() -> None:
    """Close this process's /proc/<pid>/environ and memory (and ptrace) to every other process of the same
    user — a worker's Bash runs as that user and would read the DSN, the ingress token or a push secret
    from there however well the children's own environment is scrubbed. Only root (with CAP_SYS_PTRACE)
    still can. It also turns off core dumps. A child gets the ordinary setting back when it execs."""
    if _prctl is not None:
        _prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
