"""Sandboxes started ahead: a thread's next turn's sandbox, started the moment its message is seen.

A cold turn's spawn waits for its bookkeeping (the threads loop's delivery, the claim, the credential, the
session) and then for its sandbox to start (bubblewrap, the forwarders listening: some 15 ms). When the threads
loop sees a message for a thread that will start a turn, this executor starts that thread's sandbox at once,
with nothing inside yet: the same mounts, gateway and per-spawn MCP config as a cold spawn of the turn, its
launcher waiting for the command on a pipe (executor/sandbox/bwrap.py, ARGV_FD). When the turn is claimed, the
runner builds the CLI's command as for a cold spawn and writes it there (executor/run/task_run.py): the CLI
starts at once, as one process per turn, its exit the boundary, journaled from its first line. Nothing of the
CLI runs before the turn is claimed; the sandbox's start runs beside the bookkeeping instead of after it.

Only for a thread whose conversation goes on here (pinned to this executor, stored in its own CLI config, no
project): anything else spawns cold. Bounded: at most `MAX_AHEAD` at once; one not taken within `IDLE_S` (its
turn went elsewhere, or waits for room) is ended; one that died, or whose conversation changed since it started
(it linked the stored conversation then), is ended and the turn spawns cold. Its credential is bound to the
turn that takes it (the harness refuses it until then). On stop every one is ended; a restart starts with none.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from executor.sandbox.gateway import Gateway
from shared import logs

log = logs.get(__name__)

MAX_AHEAD = 4
IDLE_S = 30.0


@dataclass(eq=False)
class Ahead:
    """One sandbox started ahead, its launcher waiting for the command line."""

    session_id: uuid.UUID
    role: str  # the role of the turn it was started for (its profile chose whether it has an MCP config)
    spawn_id: uuid.UUID  # its PETAL_TASK_ID and sandbox key (the run's spawn_id once a turn takes it)
    proc: asyncio.subprocess.Process
    command: asyncio.WriteTransport  # the pipe its launcher reads the command line from
    program: str  # the CLI it was started for (its install is what the sandbox shows)
    workdir: Path
    mcp_config: Path | None
    digest: bytes | None  # the hash of the credential in its config, bound to the turn's task when taken
    gateway: Gateway
    transcript: tuple[int, int] | None  # (inode, size) of the stored conversation when it started
    started: float = field(default_factory=time.monotonic)

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def give(self, argv: list[str]) -> None:
        """The CLI's command line to the launcher, which starts it."""
        self.command.write(command_line(argv))
        self.command.close()


def command_line(argv: list[str]) -> bytes:
    """A command line as the launcher reads it: each argument NUL-terminated, then an empty one, without which (a
    write cut short) it runs nothing."""
    return b"".join(os.fsencode(a) + b"\0" for a in argv) + b"\0"


class Starter(Protocol):
    """The runner's side: starting and ending sandboxes ahead (executor/run/task_run.py)."""

    async def start_ahead(self, session_id: uuid.UUID, role: str) -> Ahead | None: ...

    async def end_ahead(self, ahead: Ahead, reason: str) -> None: ...


class AheadPool:
    """The sandboxes started ahead of one executor's turns, one per thread at most."""

    def __init__(self, starter: Starter, *, enabled: bool, pinned_here: Callable[[str | None], bool]):
        self.starter = starter
        self.enabled = enabled
        self.pinned_here = pinned_here  # whether a thread pinned to this executor name runs its turns here
        self.starting: dict[uuid.UUID, asyncio.Task[Ahead | None]] = {}
        self._idle: dict[uuid.UUID, asyncio.Task[None]] = {}  # each one's end if no turn takes it in time
        self._ending: set[asyncio.Task[None]] = set()
        self._closed = False

    def turn_coming(self, session_id: uuid.UUID, role: str, pinned_to: str | None) -> None:
        """The threads loop is about to queue a turn (of `role`) of this thread, whose turns are pinned to the
        executor named `pinned_to`: start its sandbox now, when it will run here."""
        if (not self.enabled or self._closed or session_id in self.starting or len(self.starting) >= MAX_AHEAD
                or not self.pinned_here(pinned_to)):
            return
        self.starting[session_id] = asyncio.create_task(self._start(session_id, role), name=f"ahead-{session_id}")
        self._idle[session_id] = asyncio.create_task(self._retire_when_idle(session_id))

    async def take(self, session_id: uuid.UUID | None) -> Ahead | None:
        """The thread's sandbox for the turn about to start (the turn's from now on: the pool forgets it), once it
        is up; None when there is none, or it could not start or died (then it is ended)."""
        if session_id is None or (started := self.starting.pop(session_id, None)) is None:
            return None
        idle = self._idle.pop(session_id, None)
        if idle is not None:
            idle.cancel()
        try:
            ahead = await asyncio.shield(started)
        except asyncio.CancelledError:  # the turn's start was cut short: what comes up is ended
            started.add_done_callback(self._end_result)
            raise
        if ahead is not None and not ahead.alive:
            self.give_back(ahead, "died")
            return None
        return ahead

    def give_back(self, ahead: Ahead, reason: str) -> None:
        """A taken sandbox the turn could not use: ended in the background."""
        self._end_soon(self.starter.end_ahead(ahead, reason))

    async def close(self) -> None:
        """End every sandbox not taken (the executor stops)."""
        self._closed = True
        for idle in self._idle.values():
            idle.cancel()
        self._idle.clear()
        pending = list(self.starting.values())
        self.starting.clear()
        for started in pending:
            with contextlib.suppress(Exception):
                ahead = await started
                if ahead is not None:
                    await self.starter.end_ahead(ahead, "executor_stopping")
        while self._ending:  # including what a turn gave back meanwhile
            await asyncio.gather(*self._ending, return_exceptions=True)

    async def _start(self, session_id: uuid.UUID, role: str) -> Ahead | None:
        try:
            return await self.starter.start_ahead(session_id, role)
        except Exception:  # noqa: BLE001 - the turn spawns cold: said in the log, nothing else depends on it
            log.exception("ahead_not_started", thread=str(session_id))
            return None

    async def _retire_when_idle(self, session_id: uuid.UUID) -> None:
        """Cancelled when a turn takes it (or at close); else, after IDLE_S, it is ended."""
        await asyncio.sleep(IDLE_S)
        self._idle.pop(session_id, None)
        started = self.starting.pop(session_id, None)
        ahead = await started if started is not None else None
        if ahead is not None:
            self._end_soon(self.starter.end_ahead(ahead, "not_taken"))

    def _end_result(self, started: asyncio.Task[Ahead | None]) -> None:
        ahead = None if started.cancelled() or started.exception() else started.result()
        if ahead is not None:
            self.give_back(ahead, "start_cut_short")

    def _end_soon(self, ending: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(ending)
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)
