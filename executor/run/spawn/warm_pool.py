"""Warm turns: a thread's next turn's `claude` process, started before its message exists.

A thread likely to get the next message — one a page shows (`client_presence`, which the page reports), or
one whose turn just ended here — gets its next turn's process started ahead of time: `--resume <thread>`,
`--input-format stream-json`, its own per-spawn MCP config, sandboxed like any spawn, waiting on stdin. When
the turn's task is claimed, the spawner hands that process over instead of spawning one (executor/run/spawn/warm.py):
the message is written as one stream-json line and stdin closed, so a turn is still one process, its exit
the boundary, journaled from its first line. Observed on 2.1.328 (docs/claude-cli.md, "Warm turns"): started
this way the CLI loads its config and the conversation and connects its MCP servers before any input, prints
nothing until the message, and answers it in a fraction of a cold spawn's start.

Bounded: at most `turns` warm processes (the threads signalled most recently), each retired `idle_s` after
its start; never a running task (the supervisor counts runs, not these); one that died is replaced, never
used. A warm process read the conversation when it started, so one whose conversation changed since (a turn
elsewhere, a re-run) is retired, not used. The credential in its config is bound to a task only when a turn
takes it (the harness refuses it until then, as any unknown one). On stop every warm process group is ended;
a restart starts with none (their config files are swept with every spawn's).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

from executor.run import substrate
from executor.run.task_rows import Template
from executor.sandbox.gateway import Gateway
from shared import logs, timers
from shared.database import OUTAGE_ERRORS

log = logs.get(__name__)


@dataclass(frozen=True)
class WarmConfig:
    # at most this many warm processes (each holds a sandboxed node process: ~205 MiB resident, docs/claude-cli.md)
    turns: int = 2
    # a warm process unused this long after its start is retired
    idle_s: float = 300.0
    # a page that reported its thread this recently is showing it
    presence_s: float = 60.0
    # how often the candidates are looked at again (a turn's end, a warm process's exit look at once)
    poll_s: float = 2.0


@dataclass(eq=False)
class Warm:
    """One warm process, waiting on stdin for its turn's message."""

    session_id: uuid.UUID
    spawn_id: uuid.UUID  # its PETAL_TASK_ID and sandbox key until a turn takes it (then the run's spawn_id)
    proc: asyncio.subprocess.Process
    spec: substrate.SpawnSpec
    cmd: list[str]  # the CLI's command line, as the turn's task.spawned shows it
    workdir: Path
    project_id: uuid.UUID | None
    mcp_config: Path | None
    digest: bytes | None  # the hash of the credential in its config, bound to the turn's task when taken
    gateway: Gateway | None
    transcript: tuple[int, int] | None  # (inode, size) of the stored conversation when it started
    started: float = field(default_factory=time.monotonic)
    signal: datetime | None = None  # the presence or turn end it was started for
    watcher: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


class Starter(Protocol):
    """Making and ending warm processes (executor/run/spawn/warm.py `WarmStarter`)."""

    async def start(self, template: Template) -> Warm | None:
        """A thread's next turn's process, started now and left waiting on stdin (None if it cannot be)."""
        ...

    async def end(self, warm: Warm, reason: str) -> None:
        """A warm process no turn will take: ended, and what it held released."""
        ...


Candidates = Callable[[list[uuid.UUID], float, int], Awaitable[list[Template]]]


class WarmPool:
    """The warm processes of one executor, one per thread at most, and the loop that keeps them."""

    def __init__(self, config: WarmConfig, starter: Starter, candidates: Candidates, *,
                 clock: timers.Clock = timers.MONOTONIC):
        self.config = config
        self.starter = starter
        self.candidates = candidates
        self.clock = clock  # a warm process's age is this clock's (Warm.started: time.monotonic)
        self.warm: dict[uuid.UUID, Warm] = {}
        self._ended: dict[uuid.UUID, datetime] = {}  # turns that just ended here: thread → when
        self._retired: dict[uuid.UUID, datetime | None] = {}  # thread → the signal its idle warm was for
        # threads a turn started in since the running pass read its candidates: what it read of them is stale
        self._turn_started: set[uuid.UUID] = set()
        self._closing = asyncio.Event()  # `close` began: the loop ends, nothing more is started
        # a pass at once, then every poll_s, or at once when woken (a turn's end, a warm process's exit)
        self.timer = timers.every("warm-turns", config.poll_s, self._keep, clock=clock, at_start=True)
        self._ending: set[asyncio.Task[None]] = set()
        self._pass = asyncio.Lock()  # one pass at a time; `close` waits for the one under way (it may be spawning)

    # ---- what the runner tells it --------------------------------------------------------------------

    def turn_ended(self, session_id: uuid.UUID) -> None:
        """A thread's turn ended here: its next message is likely; warm its next turn now."""
        if self.config.turns > 0:
            self._ended[session_id] = datetime.now(UTC)
            self.timer.wake()

    def take(self, session_id: uuid.UUID | None) -> Warm | None:
        """The thread's warm process for the turn about to start, if it has a live one (it is the turn's
        from now on: the pool forgets it). A dead one is ended and replaced, not used."""
        if session_id is None:
            return None
        self._turn_started.add(session_id)
        warm = self.warm.pop(session_id, None)
        if warm is None:
            return None
        if warm.watcher is not None:
            warm.watcher.cancel()
        if not warm.alive:
            self._end_soon(warm, "died")
            return None
        return warm

    def give_back(self, warm: Warm, reason: str) -> None:
        """A taken warm process the turn could not use (its spawn differs, its conversation moved on)."""
        self._end_soon(warm, reason)

    # ---- the loop ------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the warm set until `close` (which ends what is left) or cancelled."""
        if self.config.turns <= 0:
            return
        await self.timer.run(self._closing)

    async def _keep(self) -> None:
        """One pass of the loop: a failed one is said, and the next comes as usual."""
        try:
            async with self._pass:
                if not self.closed():
                    await self.refresh()
        except OUTAGE_ERRORS as exc:
            log.info("warm_refresh_deferred", error=str(exc))  # a later pass catches up
        except Exception:  # noqa: BLE001 - a warm process is an optimisation: its failure must not end the executor
            log.exception("warm_refresh_failed")

    async def refresh(self) -> None:
        """One pass: retire the dead, the idle and the displaced, then warm the threads most likely next."""
        horizon = datetime.now(UTC) - timedelta(seconds=self.config.idle_s)
        self._ended = {s: at for s, at in self._ended.items() if at > horizon}
        # A thread whose turn starts while this pass reads (or spawns) is not warmed by it: the candidates
        # leave out threads with a turn under way only as of their read, and a process started now would read
        # the conversation that turn is about to add to (it would be found moved on, and ended unused). The
        # turn's end warms the thread's next.
        self._turn_started.clear()
        found = await self.candidates(list(self._ended), self.config.presence_s, self.config.turns)
        signals = {t.session_id: max(at for at in (t.seen_at, self._ended.get(t.session_id)) if at is not None)
                   for t in found if t.seen_at is not None or t.session_id in self._ended}
        chosen = sorted((t for t in found if t.session_id in signals), key=lambda t: signals[t.session_id],
                        reverse=True)[: self.config.turns]
        wanted = {t.session_id for t in chosen}
        await self._retire_dead_and_idle()
        self._retired = {s: sig for s, sig in self._retired.items() if s in wanted}
        for template in chosen:
            if not await self._warm(template, signals[template.session_id], wanted):
                return

    async def _retire_dead_and_idle(self) -> None:
        for session_id, current in list(self.warm.items()):
            # a thread that is no longer a candidate keeps its warm process until it idles out or another
            # needs the room: its message may be the very turn that made it no candidate (pending, not yet
            # claimed), and that turn takes the process
            reason = ("died" if not current.alive else
                      "idle" if self.clock.now() - current.started > self.config.idle_s else None)
            if reason is not None:
                del self.warm[session_id]
                if reason == "idle":
                    self._retired[session_id] = current.signal
                await self._end(current, reason)

    async def _warm(self, template: Template, signal: datetime, wanted: set[uuid.UUID]) -> bool:
        """A chosen thread's warm process started, unless it has one, needs none or finds no room; False when
        the pass ends here (every slot holds a thread more likely next, or the pool is closing)."""
        session_id = template.session_id
        if session_id in self.warm or session_id in self._turn_started or self.closed():
            return True
        retired_for = self._retired.get(session_id)
        if retired_for is not None and signal <= retired_for:
            return True  # idle already for this signal: warmed again on a newer one (a message, a page)
        if len(self.warm) >= self.config.turns and not await self._make_room(wanted):
            return False  # every slot holds a thread more likely next than this one
        started = await self.starter.start(template)
        if started is None:
            return True
        if session_id in self._turn_started:  # a turn began while it started: it read the old conversation
            await self._end(started, "turn_started")
            return True
        started.signal = signal
        if self.closed():  # stopped while it started
            await self._end(started, "executor_stopping")
            return False
        self.warm[session_id] = started
        started.watcher = asyncio.create_task(self._watch(started), name=f"warm-{session_id}")
        return True

    async def _make_room(self, wanted: set[uuid.UUID]) -> bool:
        """The least likely warm process of a thread no longer chosen ended; False when there is none."""
        others = [w for s, w in self.warm.items() if s not in wanted]
        if not others:
            return False
        displaced = min(others, key=lambda w: w.signal or datetime.min.replace(tzinfo=UTC))
        del self.warm[displaced.session_id]
        await self._end(displaced, "displaced")
        return True

    def closed(self) -> bool:
        """Whether `close` began (a method: read again after each wait, not narrowed)."""
        return self._closing.is_set()

    async def _watch(self, warm: Warm) -> None:
        """A warm process that exits before its message (killed, crashed) is ended and replaced."""
        await warm.proc.wait()
        if self.warm.get(warm.session_id) is warm:
            del self.warm[warm.session_id]
            log.warning("warm_turn_died", thread=str(warm.session_id), rc=warm.proc.returncode)
            await self._end(warm, "died")
            self.timer.wake()

    def _end_soon(self, warm: Warm, reason: str) -> None:
        ending = asyncio.create_task(self._end(warm, reason))
        self._ending.add(ending)
        ending.add_done_callback(self._ending.discard)
        self.timer.wake()

    async def _end(self, warm: Warm, reason: str) -> None:
        try:
            await self.starter.end(warm, reason)
        except Exception:  # noqa: BLE001 - logged; the process group was signalled first
            log.exception("warm_end_failed", thread=str(warm.session_id))

    async def close(self) -> None:
        """The executor stops: every warm process ends (none is left for a restart to find)."""
        self._closing.set()
        async with self._pass:
            left = list(self.warm.values())
        self.warm.clear()
        for warm in left:
            if warm.watcher is not None:
                warm.watcher.cancel()
        await asyncio.gather(*(self._end(w, "executor_stopping") for w in left), *self._ending,
                             return_exceptions=True)
