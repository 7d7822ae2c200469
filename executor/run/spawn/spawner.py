"""One interface to a task's process, whichever way it is got: `Spawner.acquire(task, plan)` gives a `Started`.

A process started before its task (a warm one, a sandbox started ahead) is taken through a `Way`: `take` it from
its pool, ask `misfit` whether it fits the task's spawn as planned (it is given back, with the reason, when it does
not), then `hand_over` once its credential is the task's; `release` gives one back, which happens whatever cuts
the start short between the take and the hand-over. Else the process is started now (`cold.Cold`)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from executor.journal.writer import JournalWriter
from executor.run import substrate
from executor.run.credentials import Credentials
from executor.run.isolation import Isolation
from executor.run.spawn.ahead import AheadStarter, AheadWay
from executor.run.spawn.ahead_pool import AheadPool
from executor.run.spawn.cold import Cold
from executor.run.spawn.launch import Launcher
from executor.run.spawn.warm import WarmStarter, WarmWay
from executor.run.spawn.warm_pool import WarmConfig, WarmPool
from executor.run.spawn.way import Beside, Plan, R, Started, Way
from executor.run.task_rows import ClaimedTask
from executor.run.task_store import TaskStore
from shared import aio, logs

log = logs.get(__name__)


class Spawner:
    def __init__(self, own: substrate.SubstrateConfig, credentials: Credentials, cold: Cold,
                 warm: Way[Any], ahead: Way[Any], warm_pool: WarmPool, ahead_pool: AheadPool):
        self.own = own  # the executor's own CLI config: only a spawn in it may take a process started before it
        self.credentials = credentials
        self.cold = cold
        self.ways: tuple[Way[Any], ...] = (warm, ahead)  # tried in this order
        self.warm = warm_pool  # the pools: their loops and their close are the supervisor's
        self.ahead = ahead_pool

    def turn_coming(self, session_id: uuid.UUID, role: str, pinned_to: str | None) -> None:
        """The threads loop is about to queue a turn of this thread: its sandbox is started now, unless a warm
        process waits for the turn already."""
        if session_id not in self.warm.warm:
            self.ahead.turn_coming(session_id, role, pinned_to)

    async def acquire(self, task: ClaimedTask, plan: Plan, beside: Beside) -> Started | str:
        """The task's process, its credential bound to the task and `beside` done meanwhile: its thread's warm
        one, else its sandbox started ahead, else one started now; or why none could be started."""
        # a thread's turn resuming its conversation in the executor's own CLI config: an adopted one's spawns
        if task.json_schema is None and plan.spec.resume and plan.substrate is self.own:
            for way in self.ways:
                started = await self._take(way, task, plan, beside)
                if started is not None:
                    return started
        return await self.cold.acquire(task, plan, beside)

    async def _take(self, way: Way[R], task: ClaimedTask, plan: Plan, beside: Beside) -> Started | None:
        """The way's process for the task, when it fits; given back when it does not, or whatever cuts this
        short (none taken is left behind)."""
        ready = await way.take(task)
        if ready is None:
            return None
        try:
            reason = await way.misfit(ready, task, plan)
        except BaseException:
            way.release(ready, "start_cut_short")
            raise
        if reason is not None:
            log.info(way.unused, thread=str(task.session_id), reason=reason)
            way.release(ready, reason)
            return None
        try:
            # its config's credential becomes this task's now (the harness refused it until here)
            digest = ready.digest
            await asyncio.gather(
                self.credentials.bind(digest, task.id, plan.session_id) if digest else aio.resolved(None), beside())
            return way.hand_over(ready, plan)
        except BaseException:
            way.release(ready, "start_failed")
            raise


def build(store: TaskStore, writer: JournalWriter, own: substrate.SubstrateConfig, credentials: Credentials,
          isolation: Isolation | None, *, executor: str, default_workdir: Path, stop_grace_s: float,
          warm: WarmConfig, ahead: bool, spares: int) -> Spawner:
    """The spawner of the executor named `executor`, its pools kept by starters on one launcher."""
    launcher = Launcher(isolation, stop_grace_s)
    warm_pool = WarmPool(warm, WarmStarter(launcher, credentials, store.role_profile, writer, own, default_workdir),
                         lambda offered, presence_s, n: store.warm_candidates(offered, presence_s, n, name=executor))
    ahead_pool = AheadPool(AheadStarter(launcher, isolation, credentials, store.role_profile, own, default_workdir),
                           enabled=ahead and isolation is not None, pinned_here=lambda name: name == executor,
                           spares=spares)
    return Spawner(own, credentials, Cold(launcher, credentials), WarmWay(warm_pool, own),
                   AheadWay(ahead_pool, own, mcp_served=bool(credentials.mcp_url)), warm_pool, ahead_pool)
