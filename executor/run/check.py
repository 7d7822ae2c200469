"""A project's check command (migration 0043), run by code after one of its workers ended, before the end is
final: in a sandbox of the worker's own kind (its worktree writable, nothing of the executor's in sight, out only
through the project's allowlist) on the worktree the worker left, with the same limits. What it says is kept as
code saw it: passed (exit 0), the exit code, the last lines of its output, how long it took."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from executor.projects import check_leftovers
from executor.projects.git import GitError
from executor.run import process, substrate
from executor.run.isolation import Isolation
from executor.sandbox.gateway import Gateway
from shared import lifeline

TAIL_LINES = 200
LINE_CHARS = 2000  # of one output line kept


@dataclass(frozen=True)
class CheckResult:
    command: str
    passed: bool
    exit_code: int | None  # None: it was killed (timed out, or by a signal)
    duration_s: float
    tail: list[str]  # its last TAIL_LINES lines (stdout and stderr as it wrote them)
    timed_out: bool = False

    def payload(self) -> dict[str, object]:
        return asdict(self)


def check_env(spawn_id: uuid.UUID, workdir: Path) -> dict[str, str]:
    """What the check sees of the environment: a PATH, a locale, HOME in its tree; none of the executor's
    settings or the CLI's credentials. The task's marker lets a sweep find what it leaves behind."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(workdir),
            "CI": "true", substrate.TASK_ENV_VAR: str(spawn_id)}


async def check_worktree(isolation: Isolation | None, project_id: uuid.UUID | None, workdir: Path, command: str,
                         timeout_s: float, on_output: Callable[[], Awaitable[None]] | None = None) -> dict[str, object]:
    """The check's record: `run_check` on the worktree, and what it left there undone (bytecode, build output: not
    the worker's work, it never reaches the branch). Not run, and failed, when git may not touch the worker's
    repository (a link planted in it): its branch is refused for the same reason when its changes are read."""
    try:
        before = await check_leftovers.changed_paths(workdir)
    except (GitError, OSError) as exc:
        return {**CheckResult(command, False, None, 0.0, [f"not run: {exc}"]).payload(), "undone": []}
    result = await run_check(isolation, project_id, workdir, command, timeout_s, on_output)
    return {**result.payload(), "undone": await check_leftovers.undo(workdir, before)}


async def run_check(isolation: Isolation | None, project_id: uuid.UUID | None, workdir: Path, command: str,
                    timeout_s: float, on_output: Callable[[], Awaitable[None]] | None = None) -> CheckResult:
    """Run `command` with `bash -c` in `workdir`, sandboxed unless the operator turned the sandbox off;
    `on_output` is told (at most once a second) that it printed: its run is not silent meanwhile."""
    spawn_id = uuid.uuid4()
    env = check_env(spawn_id, workdir)
    argv = ["bash", "-c", command]
    gateway: Gateway | None = None
    started = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    rc: int | None = None
    timed_out = False
    try:
        if isolation is not None:
            gateway = await isolation.open_gateway(spawn_id, project_id)
            argv, env = isolation.wrap(gateway, workdir, None, argv, env, spawn_id, None)
        argv, preexec = lifeline.spawn_dying_with_parent(argv, signal.SIGTERM, path=env.get("PATH"))
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, cwd=workdir, env=env, start_new_session=True, preexec_fn=preexec)
        assert proc.stdout is not None

        async def read() -> None:
            assert proc.stdout is not None
            told = 0.0
            async for raw in proc.stdout:
                tail.append(raw.decode(errors="replace").rstrip("\n")[:LINE_CHARS])
                if on_output is not None and time.monotonic() - told >= 1.0:
                    told = time.monotonic()
                    await on_output()

        try:
            await asyncio.wait_for(asyncio.gather(read(), proc.wait()), timeout_s)
            rc = proc.returncode
        except TimeoutError:
            timed_out = True
            process.signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()
            tail.append(f"… the check was stopped after {timeout_s:g} s")
    except OSError as exc:
        tail.append(f"the check could not start: {exc}")
    finally:
        await asyncio.to_thread(lambda: process.kill_all(process.find_by_env(substrate.TASK_ENV_VAR, str(spawn_id))))
        if gateway is not None:
            await gateway.close()
        if isolation is not None:
            await asyncio.to_thread(isolation.forget_spawn, spawn_id)
    exit_code = rc if rc is not None and rc >= 0 else None
    return CheckResult(command, exit_code == 0 and not timed_out, exit_code, round(time.monotonic() - started, 3),
                       list(tail), timed_out)
