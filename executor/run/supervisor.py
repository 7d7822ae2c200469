"""The supervisor's claim loop: claims dispatched tasks and stop requests, starts runs (executor/run/task_run.py),
rejoins when fenced, and wakes on notifications. The watchdog (executor/run/watchdog.py) and reconciliation
(executor/run/reconcile.py) run beside it; every row goes through executor/run/task_store.py.

Slots (docs/supervisor.md, "Slots: what runs and what waits"):
- `max_workers` bounds what runs. A process parked on the user (its task has a pending question of its own that
  its tool call waits on: ask_user_question, a permission approval) holds no slot; `max_parked` bounds what waits.
  Past that bound the oldest parked process whose question can outlive it (asked in a thread, or by a thread's
  worker) is ended (stop reason `parked_limit`): its question stays pending, marked late, and its answer goes to
  the thread as a message that resumes the conversation in a new turn (executor/settle/approvals.py).
- An answered question's process resumes at once, even when every slot is taken meanwhile: it may run over
  `max_workers` for the rest of its turn (never starved nor killed), and nothing new is claimed until the running
  ones are back under the bound.
- Chat comes first: a thread turn a user's message started (`tasks.chat`) is claimed first, then the rest of the
  user's work (workers, turns on harness reports), then unattended work (a routine run's turns, retries), which
  never takes the last free slot (with `max_workers` of 1 there is no slot to keep).
- A task that could be claimed here but waits for a slot says so: its activity is `waiting_for_slot` (set each
  pass while the slots are full, or only the kept one is free; the claim sets `running`)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor.journal.writer import JournalWriter
from executor.run import fleet, process, substrate
from executor.run.parking import Parking
from executor.run.reconcile import reconcile
from executor.run.side_tasks import SideTasks, first_error
from executor.run.running import Running
from executor.run.spawn.warm_pool import WarmConfig
from executor.run.outcome import EXECUTOR_SHUTDOWN, USER_STOP
from executor.run.task_run import RunConfig, TaskRunner
from executor.run.task_rows import ClaimedTask
from executor.run.task_store import TaskStore
from executor.run.watchdog import Limits, Watchdog
from executor.sandbox.bwrap import SandboxPolicy
from shared import aio, logs
from shared.database import OUTAGE_ERRORS, Database
from shared.listener import Subscription
from shared.models import NewEvent

log = logs.get(__name__)

# the channel of a new task: its wake-up needs only a claim
TASK_PENDING = "task_pending"
# how long a stopping run waits for the journal writer to write what it queued (an outage holds it longer)
STOP_DRAIN_S = 10.0


# a parked CLI (node, its MCP client and the conversation) holds about this much memory while it waits
PARKED_CLI_BYTES = 200 * 1024 * 1024


def default_max_parked(available_bytes: int | None = None) -> int:
    """How many processes may wait on the user at once: a quarter of the memory available now, at about 200 MiB
    per parked CLI, between 4 and 32."""
    if available_bytes is None:
        import psutil

        available_bytes = psutil.virtual_memory().available
    return min(32, max(4, available_bytes // 4 // PARKED_CLI_BYTES))


@dataclass(frozen=True)
class SupervisorConfig:
    # what runs at once (CPU, the account's rate); a process parked on the user holds no slot
    max_workers: int = 4
    # what waits on the user at once; past it the oldest parked process is ended, its question left answerable
    max_parked: int = 16
    # a thread's turn parked on its own question longer than this is ended, its question left answerable (None:
    # only past max_parked): waiting then holds no memory, and the answer resumes the conversation in a new turn
    park_after_s: float | None = 120.0
    # tests only: parked processes hold their slots, as before (the negative control of the slot rule)
    parked_hold_slots: bool = False
    # silence longer than this marks a running task stalled (a separate limit from max_runtime_s)
    stall_timeout_s: float = 180.0
    # SIGTERM first (the CLI cleans up its children), SIGKILL after this grace
    stop_grace_s: float = 10.0
    max_runtime_s: float | None = None
    # backstop for notifications lost while the LISTEN connection was down
    poll_interval_s: float = 1.0
    watchdog_interval_s: float = 1.0
    # after exit, how long readers may drain the pipes (a surviving grandchild can hold them open)
    drain_timeout_s: float = 5.0
    default_workdir: Path = Path(".")
    run_dir: Path = Path("./var/run")
    mcp_url: str | None = None
    # the per-spawn MCP server timeout: a human may take a while to answer ask_user_question
    mcp_timeout_ms: int | None = 600_000
    # where workers of a project get their git worktrees (None: beside run_dir), and whether they stay
    worktree_dir: Path | None = None
    keep_worktrees: bool = False

    @property
    def worktree_root(self) -> Path:
        return (self.worktree_dir or self.run_dir.parent / "worktrees").resolve()
    # the fleet: this executor's name (unique among live ones), labels and lease (executor/run/fleet.py)
    name: str = field(default_factory=fleet.default_name)
    labels: tuple[str, ...] = ()
    lease_s: float = fleet.DEFAULT_LEASE_S
    # every executor reads one CLI config directory: a thread's turns need not stay where the first ran
    shared_claude_config: bool = False
    # every spawn's sandbox (None: unsandboxed, the operator's explicit PETAL_SANDBOX=off)
    sandbox: SandboxPolicy | None = None
    # threads' next turns started ahead of their messages (executor/run/spawn/warm_pool.py): how many, and for how long
    warm: WarmConfig = field(default_factory=WarmConfig)
    # a thread's next turn's sandbox started before its claim (executor/run/spawn/ahead_pool.py): a spare kept for
    # it, or its own started when the threads loop sees its message
    ahead: bool = True
    ahead_spares: int = 1

    def run_config(self) -> RunConfig:
        return RunConfig(stop_grace_s=self.stop_grace_s, drain_timeout_s=self.drain_timeout_s,
                         default_workdir=self.default_workdir, run_dir=self.run_dir,
                         worktree_root=self.worktree_root,
                         mcp_url=self.mcp_url, mcp_timeout_ms=self.mcp_timeout_ms, sandbox=self.sandbox,
                         warm=self.warm, ahead=self.ahead, ahead_spares=self.ahead_spares)


class Supervisor:
    def __init__(
        self,
        db: Database,
        writer: JournalWriter,
        substrate_config: substrate.SubstrateConfig,
        config: SupervisorConfig,
    ):
        self.db = db
        self.writer = writer
        self.substrate = substrate_config
        self.config = config
        self.store = TaskStore(db.pool)
        self._wake = asyncio.Event()
        self._stops_due = True  # whether the next pass also claims stop requests
        self._stopping = asyncio.Event()
        self._closing = asyncio.Event()  # the run is ending: a side task that returns now was stopped
        self._lease_lapsed = asyncio.Event()  # the lease's renewals stopped (fenced): the claim loop rejoins
        self._rejoined = asyncio.Event()  # and then renewals start again
        self.ready = asyncio.Event()
        # a running task this executor holds outside the runner (a terminal session, executor/terminals/): True
        # when it was one; Stop then interrupts its turn (as Esc does) rather than ending its process
        self.interrupt: Callable[[uuid.UUID], bool] | None = None
        self._claimed: list[ClaimedTask] = []
        self.lease = fleet.Lease(db.dsn, fleet.FleetConfig(
            name=config.name, labels=config.labels, capacity=config.max_workers, lease_s=config.lease_s,
            sandbox="off" if config.sandbox is None else "bwrap", workdir=str(config.default_workdir)),
            on_reaped=writer.write)
        self.runner = TaskRunner(self.store, writer, substrate_config, config.run_config(), self.lease,
                                 db.availability, on_reaped=self._wake.set)
        self.parking = Parking(self.store, self.runner, lambda: self.runner.runs, config.max_parked,
                               config.park_after_s)
        self.watchdog = Watchdog(self.store, writer, self.runner, lambda: self.runner.runs.values(),
                                 Limits(config.stall_timeout_s, config.max_runtime_s),
                                 config.watchdog_interval_s, db.availability)

    @property
    def running(self) -> dict[uuid.UUID, Running]:
        return self.runner.runs

    @property
    def on_credential_revoked(self) -> Callable[[uuid.UUID], None] | None:
        """Told when a spawn's credential dies (the harness MCP forgets the callers it confirmed)."""
        return self.runner.credentials.on_revoked

    @on_credential_revoked.setter
    def on_credential_revoked(self, callback: Callable[[uuid.UUID], None] | None) -> None:
        self.runner.credentials.on_revoked = callback

    # ---- lifecycle -------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def wake(self) -> None:
        self._stops_due = True
        self._wake.set()

    async def run(self, wake_on: Subscription | None = None) -> None:
        """Supervise until stop(); then stop children, journal their ends, and return. A database outage
        of any length only pauses claiming: running tasks go on, and the loop resumes when it returns.
        The side tasks (the lease, the watchdog, the wake-ups, the warm turns, the spares) run in a task
        group: one that fails, or ends on its own, is logged and ends the run the same way, its error raised."""
        availability = self.db.availability
        if self.lease.epoch is None:  # the executor joins before its loops start (executor/main.py)
            await availability.retry(self.lease.join, "lease")  # refuses a live executor of the same name
        self.writer.fence = self.lease
        try:
            async with asyncio.TaskGroup() as group:
                side = SideTasks(group, self._closing)
                side.start("lease", self._keep_lease())
                try:
                    self.runner.credentials.sweep()
                    await availability.retry(self.reconcile, "reconcile")
                    side.start("watchdog", self.watchdog.run())
                    if wake_on is not None:
                        side.start("wakeups", self._forward_wakeups(wake_on))
                    # the warm turns' loop returns at once when none are configured
                    side.start("warm-turns", self.runner.spawner.warm.run(), may_end=True)
                    side.start("sandbox-spares", self.runner.spawner.ahead.run())
                    if self.config.park_after_s is not None:
                        side.start("parking", self.parking.timer(availability).run())
                    self.ready.set()
                    await self._supervise()
                finally:
                    self._closing.set()
                    await self._shut_down()
                    await side.cancel()
        except BaseExceptionGroup as failed:
            raise first_error(failed) from None  # as a loop of the executor raises it (executor/main.py)
        finally:
            # what this run queued, written before it leaves its lease; during an outage the writer holds it (its stop
            # spills it to disk), not waited for past the bound
            with contextlib.suppress(TimeoutError):
                await aio.wait_for(self.writer.drain(), STOP_DRAIN_S)
            await self.lease.leave()

    async def _supervise(self) -> None:
        """The claim loop: stop requests and tasks, on a wake-up or the poll, until stop()."""
        availability = self.db.availability
        while not self._stopping.is_set():
            self._wake.clear()
            if self.lease.fenced.is_set():
                await self._lease_lapsed.wait()  # its renewals have stopped: no renewal races the rejoin
                self._lease_lapsed.clear()
                await self._rejoin()
                self._rejoined.set()
            # a new task's wake-up claims only tasks (a spawn waits on it); anything else also stops
            stops_due, self._stops_due = self._stops_due, False
            try:
                if stops_due:
                    await self._claim_stops()
                await self._claim_tasks()
            except OUTAGE_ERRORS as exc:
                self._stops_due = True
                await availability.pause(exc, "supervisor", self._stopping)
                continue
            availability.succeeded()
            try:
                await aio.wait_for(self._wake.wait(), self.config.poll_interval_s)
            except TimeoutError:
                self._stops_due = True  # the poll: whatever a lost notification would have said

    async def _shut_down(self) -> None:
        await self.runner.spawner.warm.close()  # before the runs: none is left behind, nor started meanwhile
        await self.runner.spawner.ahead.close()
        await self._stop_children(EXECUTOR_SHUTDOWN)
        if self.runner.isolation is not None:
            self.runner.isolation.close()

    async def _keep_lease(self) -> None:
        """Renew the lease; once fenced, wake the claim loop (it kills this run's processes and joins again)
        and renew again after it has. A lease that cannot be held (a namesake took the name) raises."""
        while True:
            await self.lease.run()  # returns once fenced
            self._lease_lapsed.set()
            self._wake.set()
            await self._rejoined.wait()
            self._rejoined.clear()

    async def reconcile(self) -> dict[str, Any]:
        """After a restart nothing stays "running" (executor/run/reconcile.py)."""
        return await reconcile(self.store, self.writer, self.lease, self.config.labels, self.config.lease_s)

    async def _rejoin(self) -> None:
        """Taken over by a survivor (this process was paused or cut off past its lease): its tasks were
        crashed and retried elsewhere, so its processes must not go on. Kill them (and their Bash children)
        before claiming anything, then join again with a new epoch. Their ends are not written: fenced."""
        lost = list(self.running.values())
        for r in lost:
            self.runner.kill_fenced(r)
        killed = await asyncio.to_thread(lambda: [
            pid for r in lost for pid in process.kill_all(process.find_by_env(substrate.TASK_ENV_VAR, str(r.spawn_key)))])
        await self.runner.wait(self.config.drain_timeout_s + 5)
        await self.writer.drain()  # what the fenced run still queued is dropped, not carried into the new one
        old_epoch = self.lease.epoch
        await self.lease.join()
        log.error("executor_rejoined", name=self.lease.name, old_epoch=old_epoch, epoch=self.lease.epoch,
                  killed_tasks=[str(r.task_id) for r in lost])
        await self.writer.write([NewEvent("executor.fenced", {
            "name": self.lease.name, "old_epoch": old_epoch, "epoch": self.lease.epoch,
            "killed_tasks": [str(r.task_id) for r in lost], "killed_pids": killed})])
        await self.reconcile()

    async def _forward_wakeups(self, sub: Subscription) -> None:
        while True:
            note = await sub.get()
            if note.channel != TASK_PENDING:
                self._stops_due = True
            self._wake.set()

    async def _stop_children(self, reason: str) -> None:
        for r in list(self.running.values()):
            await self.runner.request_stop(r, reason)
        await self.runner.wait(self.config.stop_grace_s + self.config.drain_timeout_s + 5)
        # a run still finishing past the bound (an outage holds its end's writes) is ended here, not left to run on
        # through the rest of the stop: the next start's reconcile crashes its task
        if cut := [t for t in self.runner.children if not t.done()]:
            log.warning("runs_cut_short_at_stop", runs=len(cut))
            await aio.cancel_and_wait(*cut)

    # ---- claiming ------------------------------------------------------------------------------------

    async def _claim_tasks(self) -> None:
        # A claimed task whose start an outage cut short is still ours: start it before claiming more.
        await self._start_claimed()
        if self._stopping.is_set():
            return
        free = self.config.max_workers - len(await self._active())
        # the last free slot is kept for chat (none to keep with a single slot)
        keep = 1 if self.config.max_workers > 1 else 0
        claimed: list[ClaimedTask] = []
        if free > 0:
            claimed = await self.store.claim_tasks(
                free, n_unattended=max(0, free - keep), name=self.lease.name, epoch=self.lease.epoch,
                labels=list(self.config.labels), shared_config=self.config.shared_claude_config)
            self._claimed += claimed
        left = free - len(claimed)
        if left - keep <= 0:  # what is claimable here now waits (chat too when no slot is left)
            await self.store.mark_waiting_for_slot(chat_too=left <= 0, name=self.lease.name,
                                                   labels=list(self.config.labels),
                                                   shared_config=self.config.shared_claude_config)
        await self._start_claimed()

    async def _active(self) -> list[Running]:
        """The runs that hold a slot: all but those parked on the user. Parked ones are looked up only when it
        matters (the slots nearly full, or more runs than may park), and past `max_parked` the oldest are ended."""
        runs = list(self.running.values())
        if not runs or self.config.parked_hold_slots or (
                len(runs) + 1 < self.config.max_workers and len(runs) <= self.config.max_parked):
            return runs
        parked = await self.store.parked_tasks([r.task_id for r in runs])
        await self.parking.end_past_bound(parked)
        held = {p.task_id for p in parked}
        return [r for r in runs if r.task_id not in held]


    async def _start_claimed(self) -> None:
        """Start what was claimed, side by side: each start waits mostly on its own round trips and its
        sandbox, so a burst (a plan's workers, a minute's routines) is not spawned one after another. A start
        an outage cut short stays claimed, in its place, and the first such error is raised."""
        batch, self._claimed = self._claimed, []
        results = await asyncio.gather(*(self.runner.start(t) for t in batch), return_exceptions=True)
        self._claimed = [t for t, r in zip(batch, results, strict=True) if isinstance(r, BaseException)]
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _claim_stops(self) -> None:
        for stop in await self.store.claim_stops(self.lease.name):
            await self._handle_stop(stop.id, stop.task_id, stop.reason)

    async def _handle_stop(self, stop_id: uuid.UUID, task_id: uuid.UUID, reason: str | None) -> None:
        status, error = "done", None
        current = await self.store.task_status(task_id)
        cancelled_pending = current == "pending" and await self.store.cancel_pending(task_id, "stop_requested")
        if current is None:
            status, error = "failed", f"no task {task_id}"
        else:
            await self.writer.put(NewEvent("task.stop_requested", {"stop_id": str(stop_id), "reason": reason},
                                           task_id=task_id))
            r = self.running.get(task_id)
            if r is not None:
                await self.runner.request_stop(r, USER_STOP)
            elif current == "running" and self.interrupt is not None and self.interrupt(task_id):
                pass  # its turn is interrupted; the session goes on
            elif cancelled_pending:
                await self.writer.put(NewEvent("task.exited", {"status": "cancelled", "reason": "stop_requested",
                                                               "spawned": False}, task_id=task_id))
            elif current == "running":
                status, error = "failed", "task is running but not under this executor"
            else:
                error = f"task already {current}"
        await self.store.finish_stop(stop_id, status, error)
