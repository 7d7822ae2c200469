"""Sandboxes started ahead: a thread's next turn's sandbox, up before its turn is claimed.

A cold turn's spawn waits for its bookkeeping (the threads loop's delivery, the claim, the credential, the
session) and for its sandbox to start (bubblewrap, the forwarders listening: 13 ms on an idle machine, 20-30 ms
beside the bookkeeping). Two ways take the sandbox off that path; in both, nothing of the CLI runs before the
turn is claimed. When the turn is claimed, the spawner builds the CLI's command as for a cold spawn and writes it
to the sandbox's launcher, waiting on a pipe (executor/sandbox/bwrap.py, ARGV_FD; executor/run/spawn/ahead.py): the
CLI starts at once, as one process per turn, its exit the boundary, journaled from its first line.

- **Spares**: up to `spares` sandboxes kept started for no thread yet, for the role of the turns this executor
  has had (the first one's message teaches it), with the mounts, gateway and per-spawn MCP config a plain
  thread's turn gets. A thread's message takes one: its stored conversation is linked into the spare's private
  conversations directory then (executor/sandbox/cliconfig.py, `link_conversation`), and a new spare is started
  `SPARE_REFILL_S` later (not beside the CLI's start). A conversation that needs a mount of its own (its side
  directory) cannot go into a spare. A mount shows the file it was made on, so a spare whose CLI config files
  were replaced since it started (a new login, edited settings: `bwrap.config_state`) is ended, not handed
  over, and each spare is replaced after `SPARE_AGE_S` anyway.
- **On the message**: without a spare to take, the thread's own sandbox is started the moment the threads loop
  sees its message, beside the bookkeeping rather than after it.

Only for a thread whose conversation goes on here (pinned to this executor, stored in its own CLI config, no
project): anything else spawns cold. Bounded: at most `MAX_AHEAD` threads at once; one not taken within `IDLE_S`
(its turn went elsewhere, or waits for room) is ended; one that died, or whose conversation changed since it was
linked, is ended and the turn spawns cold. Its credential is bound to the turn that takes it (the harness
refuses it until then). On stop every one is ended, spares too; a restart starts with none.
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
from shared import logs, timers

log = logs.get(__name__)

MAX_AHEAD = 4
IDLE_S = 30.0
# a spare is started this long after the last one was taken: after the taking turn's CLI has started
SPARE_REFILL_S = 1.0
# and replaced this long after its own start; one that could not start or died is tried again this long after
SPARE_AGE_S = 300.0
SPARE_RETRY_S = 5.0


@dataclass(eq=False)
class Ahead:
    """One sandbox started ahead, its launcher waiting for the command line."""

    session_id: uuid.UUID | None  # the thread it is for (None: a spare, for whichever thread comes first)
    role: str  # the role of the turn it was started for (its profile chose whether it has an MCP config)
    spawn_id: uuid.UUID  # its PETAL_TASK_ID and sandbox key (the run's spawn_id once a turn takes it)
    proc: asyncio.subprocess.Process
    command: asyncio.WriteTransport  # the pipe its launcher reads the command line from
    program: str  # the CLI it was started for (its install is what the sandbox shows)
    workdir: Path
    mcp_config: Path | None
    digest: bytes | None  # the hash of the credential in its config, bound to the turn's task when taken
    gateway: Gateway
    transcript: tuple[int, int] | None  # (inode, size) of the stored conversation when it was linked
    started: float = field(default_factory=time.monotonic)
    spare: bool = False  # started as a spare (its thread took it later)
    # a spare's: the CLI config files it shows, as they were when it started (bwrap.config_state)
    config_state: tuple[tuple[str, int, int], ...] = ()

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


class SpareStale(Exception):
    """A spare shows a CLI config file (the login, the settings every spawn obeys) that was replaced since it
    started: its mount still shows the old one. It is ended, not handed over."""


class Starter(Protocol):
    """Starting, handing over and ending sandboxes ahead (executor/run/spawn/ahead.py `AheadStarter`)."""

    async def start(self, session_id: uuid.UUID | None, role: str) -> Ahead | None:
        """A thread's next turn's sandbox (`session_id` None: a spare), or None when there is none to start."""
        ...

    async def link(self, spare: Ahead, session_id: uuid.UUID) -> Ahead | None:
        """The spare with the thread's conversation linked in, or None when the conversation cannot go into it
        (nothing linked: the spare may take another's). Raises SpareStale for a spare no thread may take."""
        ...

    async def end(self, ahead: Ahead, reason: str) -> None:
        """A sandbox no turn will take: ended, and what it held released."""
        ...


class AheadPool:
    """The sandboxes started ahead of one executor's turns: one per thread at most, and its spares."""

    def __init__(self, starter: Starter, *, enabled: bool, pinned_here: Callable[[str | None], bool],
                 spares: int = 1, clock: timers.Clock = timers.MONOTONIC):
        self.starter = starter
        self.clock = clock  # a spare's age is this clock's (Ahead.started: time.monotonic)
        self.enabled = enabled
        self.pinned_here = pinned_here  # whether a thread pinned to this executor name runs its turns here
        self.starting: dict[uuid.UUID, asyncio.Task[Ahead | None]] = {}
        self._idle: dict[uuid.UUID, asyncio.Task[None]] = {}  # each one's end if no turn takes it in time
        self._ending: set[asyncio.Task[None]] = set()
        self._closing = asyncio.Event()  # `close` began: the loop ends, nothing more is started
        self.spares_wanted = spares if enabled else 0
        self.spares: list[asyncio.Future[Ahead | None]] = []
        self.spare_role: str | None = None  # the role of the turns seen here (what a spare is started for)
        self._refill_at = 0.0
        self._next_look = 0.0  # until the loop's next look, as its last look chose
        # a look at once, then when the last one said, or at once when woken (a spare taken, up or exited, a stop)
        self.timer = timers.every("sandbox-spares", lambda: self._next_look, self._look, clock=clock, at_start=True)
        self._watching: set[asyncio.Future[int]] = set()  # each spare's process, woken on its exit

    def turn_coming(self, session_id: uuid.UUID, role: str, pinned_to: str | None) -> None:
        """The threads loop is about to queue a turn (of `role`) of this thread, whose turns are pinned to the
        executor named `pinned_to`: hand it a spare, or start its sandbox now, when it will run here."""
        if not self.enabled or self._closing.is_set():
            return
        if self.spare_role != role and (pinned_to is None or self.pinned_here(pinned_to)):
            # the spares are for the role of the turns that may run here (a new thread's first turn teaches it)
            self.spare_role = role
            self._refill_at = self.clock.now() + SPARE_REFILL_S
            self._end_spares("role_changed")
        if session_id in self.starting or len(self.starting) >= MAX_AHEAD or not self.pinned_here(pinned_to):
            return
        spare = self._ready_spare()
        self.starting[session_id] = asyncio.create_task(
            self._start(session_id, role) if spare is None else self._hand_over(spare, session_id, role),
            name=f"ahead-{session_id}")
        self._idle[session_id] = asyncio.create_task(self._retire_when_idle(session_id))

    def _ready_spare(self) -> Ahead | None:
        """A spare that is up and alive (the pool's no longer): None while each is still starting. One that died
        is left to the loop, which its exit woke (`_watch`): ended there, and replaced."""
        for started in [s for s in self.spares if s.done()]:
            spare = _result(started)
            if spare is not None and spare.alive:
                self.spares.remove(started)
                self._refill_at = self.clock.now() + SPARE_REFILL_S
                self.timer.wake()
                return spare
        return None

    async def _hand_over(self, spare: Ahead, session_id: uuid.UUID, role: str) -> Ahead | None:
        try:
            linked = await self.starter.link(spare, session_id)
        except asyncio.CancelledError:
            self.give_back(spare, "start_cut_short")
            raise
        except SpareStale:
            self.give_back(spare, "spare_stale")
        except Exception:  # noqa: BLE001 - the turn gets its own: said in the log
            log.exception("spare_not_linked", thread=str(session_id))
            self.give_back(spare, "link_failed")
        else:
            if linked is not None:
                return linked
            if self._closing.is_set() or len(self.spares) >= self.spares_wanted:
                self.give_back(spare, "not_needed")
            else:  # nothing was linked: another thread's conversation may go into it
                kept: asyncio.Future[Ahead | None] = asyncio.get_running_loop().create_future()
                kept.set_result(spare)
                self.spares.append(kept)
        return None if self._closing.is_set() else await self._start(session_id, role)

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
        self._end_soon(self.starter.end(ahead, reason))

    async def run(self) -> None:
        """Keep the spares until `close` (or cancelled): started once a turn's role is known (`SPARE_REFILL_S` after
        the last was taken), one that died or could not start replaced, each replaced after `SPARE_AGE_S`."""
        await self.timer.run(self._closing)

    async def _look(self) -> None:
        try:
            self._next_look = self._keep_spares()
        except Exception:  # noqa: BLE001 - a bug here must not end the loop: said, and tried again later
            log.exception("spares_not_kept")
            self._next_look = SPARE_RETRY_S

    def _keep_spares(self) -> float:
        """One look at the spares: what is dead or old is ended, one is started if due; how long until the next."""
        now = self.clock.now()
        for started in [s for s in self.spares if s.done()]:
            spare = _result(started)
            if spare is None or not spare.alive or now - spare.started > SPARE_AGE_S:
                self.spares.remove(started)
                if spare is None or not spare.alive:  # not again at once: what failed may fail again
                    self._refill_at = max(self._refill_at, now + SPARE_RETRY_S)
                if spare is not None:
                    self.give_back(spare, "spare_replaced" if spare.alive else "died")
        if self.spare_role is not None and len(self.spares) < self.spares_wanted:
            if now >= self._refill_at:
                started = asyncio.create_task(self._start(None, self.spare_role), name="ahead-spare")
                started.add_done_callback(self._watch)
                self.spares.append(started)
                return 0.0
            return min(self._refill_at - now, _next_age(self.spares, now))
        return _next_age(self.spares, now)

    def _watch(self, started: asyncio.Future[Ahead | None]) -> None:
        """A spare's start ended: the loop looks again now, and again once its process exits (a spare that died
        waiting is replaced then, not when it would have been old)."""
        self.timer.wake()
        spare = _result(started)
        if spare is not None:
            watching = asyncio.ensure_future(spare.proc.wait())
            self._watching.add(watching)
            watching.add_done_callback(self._exited)

    def _exited(self, watching: asyncio.Future[int]) -> None:
        self._watching.discard(watching)
        self.timer.wake()

    async def close(self) -> None:
        """End every sandbox not taken (the executor stops), spares too."""
        self._closing.set()
        for idle in self._idle.values():
            idle.cancel()
        self._idle.clear()
        pending = [*self.starting.values(), *self.spares]
        self.starting.clear()
        self.spares.clear()
        for watching in self._watching:
            watching.cancel()
        # together: each may take the grace to end
        await asyncio.gather(*(self._end_when_up(started, "executor_stopping") for started in pending))
        while self._ending:  # including what a turn gave back meanwhile
            await asyncio.gather(*self._ending, return_exceptions=True)

    async def _start(self, session_id: uuid.UUID | None, role: str) -> Ahead | None:
        try:
            return await self.starter.start(session_id, role)
        except Exception:  # noqa: BLE001 - the turn spawns cold: said in the log, nothing else depends on it
            log.exception("ahead_not_started", thread=str(session_id))
            return None

    def _end_spares(self, reason: str) -> None:
        for started in self.spares:  # ended once up (the stop waits for those endings too)
            self._end_soon(self._end_when_up(started, reason))
        self.spares.clear()
        self.timer.wake()

    async def _end_when_up(self, started: asyncio.Future[Ahead | None], reason: str) -> None:
        with contextlib.suppress(Exception):
            ahead = await started
            if ahead is not None:
                await self.starter.end(ahead, reason)

    async def _retire_when_idle(self, session_id: uuid.UUID) -> None:
        """Cancelled when a turn takes it (or at close); else, after IDLE_S, it is ended."""
        await self.clock.sleep(IDLE_S)
        self._idle.pop(session_id, None)
        started = self.starting.pop(session_id, None)
        ahead = await started if started is not None else None
        if ahead is not None:
            self._end_soon(self.starter.end(ahead, "not_taken"))

    def _end_result(self, started: asyncio.Future[Ahead | None]) -> None:
        ahead = _result(started)
        if ahead is not None:
            self.give_back(ahead, "start_cut_short")

    def _end_soon(self, ending: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(ending)
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)


def _result(started: asyncio.Future[Ahead | None]) -> Ahead | None:
    """What a finished start gave (None if it gave none, failed or was cancelled)."""
    return None if started.cancelled() or started.exception() is not None else started.result()


def _next_age(spares: list[asyncio.Future[Ahead | None]], now: float) -> float:
    """Until the oldest spare that is up is due to be replaced."""
    ups = [a.started for a in (_result(s) for s in spares if s.done()) if a is not None]
    return max(0.01, SPARE_AGE_S - (now - min(ups))) if ups else SPARE_AGE_S
