"""One run of one task, from spawn to reap: its `claude` process, every line it prints journaled, its stop
(SIGTERM, the grace, SIGKILL), its exit turned into a status, its credential revoked with it."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from executor.journal.writer import Fenced, JournalWriter
from executor.run import check, lineage, process, stream, substrate
from executor.run.credentials import Credentials
from executor.run.fleet import Lease
from executor.run.isolation import Isolation
from executor.run.outcome import PARKED_LIMIT, end_outcome
from executor.run.plan import Planner, Unspawned
from executor.run.running import Running, feed_prompt, read_stderr, read_stdout
from executor.run.spawn import spawner
from executor.run.spawn.warm_pool import WarmConfig
from executor.run.spawn.way import Plan, Started
from executor.run.task_rows import ClaimedTask, TaskEnd
from executor.run.task_store import TaskStore
from executor.sandbox import bwrap as sandbox
from shared import logs
from shared.database import OUTAGE_ERRORS, Availability
from shared.models import NewEvent

log = logs.get(__name__)

# how often a run's cgroup is looked at for a limit hit: a fork refused at pids.max or an OOM kill is no event
# the loop can wait on (v1's counters have no file notification)
LIMIT_CHECK_S = 0.25


def _now() -> datetime:
    return datetime.now(UTC)


def _alive(r: Running) -> bool:
    """Whether its process lives (a function: read again after each wait, not narrowed)."""
    return r.proc.returncode is None


@dataclass(frozen=True)
class RunConfig:
    # SIGTERM first (the CLI cleans up its children), SIGKILL after this grace
    stop_grace_s: float
    # after exit, how long readers may drain the pipes (a surviving grandchild can hold them open)
    drain_timeout_s: float
    default_workdir: Path
    run_dir: Path
    worktree_root: Path
    mcp_url: str | None
    mcp_timeout_ms: int | None
    # every spawn sandboxed (None: the operator's explicit PETAL_SANDBOX=off)
    sandbox: sandbox.SandboxPolicy | None = None
    # threads' next turns started ahead of their messages (executor/run/spawn/warm_pool.py)
    warm: WarmConfig = field(default_factory=WarmConfig)
    # a thread's next turn's sandbox started before its claim (executor/run/spawn/ahead_pool.py), and how many
    # spares wait
    ahead: bool = True
    # how long a project's check command may run after one of its workers ended (executor/run/check.py)
    check_timeout_s: float = 600.0
    ahead_spares: int = 1


class TaskRunner:
    """Starts runs and sees each through to its reaping; `runs` are those whose process lives (or whose
    end is being recorded)."""

    def __init__(self, store: TaskStore, writer: JournalWriter, substrate_config: substrate.SubstrateConfig,
                 config: RunConfig, lease: Lease, availability: Availability, on_reaped: Callable[[], None]):
        self.store = store
        self.writer = writer
        self.config = config
        self.lease = lease
        self.availability = availability
        self.on_reaped = on_reaped  # a run ended: room for another
        self.runs: dict[uuid.UUID, Running] = {}
        self.children: set[asyncio.Task[None]] = set()
        self.credentials = Credentials(store, config.run_dir, config.mcp_url, config.mcp_timeout_ms, availability)
        # every spawn sandboxed, unless the operator's explicit PETAL_SANDBOX=off
        self.isolation = (Isolation(config.sandbox, substrate_config, config.mcp_url, store)
                          if config.sandbox is not None else None)
        self.planner = Planner(store, writer, substrate_config, config.default_workdir, config.worktree_root)
        self.spawner = spawner.build(
            store, writer, substrate_config, self.credentials, self.isolation, executor=lease.name,
            default_workdir=config.default_workdir, stop_grace_s=config.stop_grace_s, warm=config.warm,
            ahead=config.ahead, spares=config.ahead_spares)

    async def wait(self, timeout: float) -> None:
        """Until every run is reaped, or the timeout."""
        if self.children:
            await asyncio.wait(self.children, timeout=timeout)

    # ---- starting ------------------------------------------------------------------------------------

    async def _finish_unspawned(self, task: ClaimedTask, status: str, reason: str) -> None:
        await self.writer.write([NewEvent("task.exited", {"status": status, "reason": reason, "spawned": False},
                                          task_id=task.id, project_id=task.project_id)])
        await self._finish_task(task.id, TaskEnd(status, reason, None, None, None))

    async def _finish_task(self, task_id: uuid.UUID, end: TaskEnd) -> bool:
        """The final status, fenced by this run's claim: False when a survivor took the task over."""
        done = await self.store.finish(task_id, end, name=self.lease.name, epoch=self.lease.epoch)
        if not done:
            log.warning("final_status_refused", task_id=str(task_id), status=end.status, epoch=self.lease.epoch)
        return done

    async def start(self, task: ClaimedTask) -> None:
        """Spawn a claimed task's process (or take one started before it) and supervise it until it is reaped.
        An outage error before the process exists leaves the task claimed, to start again; from the spawn on,
        the run goes on."""
        # The event its task.spawned hangs under is needed only after the spawn: asked for beside it.
        parent_lookup = asyncio.ensure_future(lineage.spawn_parent(
            self.store.pool, task.id, task.parent_task_id, extractor=task.json_schema is not None))
        parent_lookup.add_done_callback(lambda f: f.cancelled() or f.exception())  # its failure is read or moot
        started: Started | str | None = None
        try:
            plan = await self.planner.plan(task)
            if isinstance(plan, Unspawned):
                await self._finish_unspawned(task, plan.status, plan.reason)
                return
            started = await self.spawner.acquire(task, plan, beside=lambda: self.store.open_session(
                plan.session_id, project_id=task.project_id, role=task.role, executor=self.lease.name))
            if isinstance(started, str):
                await self._finish_unspawned(task, "failed", started)
                return
        finally:
            if not isinstance(started, Started):
                parent_lookup.cancel()  # no process, no task.spawned to hang under anything
        await self._run(task, plan, started, parent_lookup)

    async def _run(self, task: ClaimedTask, plan: Plan, started: Started,
                   parent_lookup: asyncio.Future[uuid.UUID | None]) -> None:
        """The started process as the task's run: its prompt fed, its task.spawned journaled, its row told, and
        its supervision begun."""
        task_id, session_id, proc, spec = task.id, plan.session_id, started.proc, started.spec
        now = time.monotonic()
        r = Running(task_id=task_id, session_id=session_id, project_id=task.project_id, role=task.role,
                    proc=proc, started=now, last_output=now, mcp_config=spec.mcp_config, gateway=started.gateway,
                    workdir=plan.workdir, cli_session=spec.session_uuid, substrate=plan.substrate,
                    spawn_id=started.spawn_id, chat=task.chat)
        self.runs[task_id] = r
        feeding = asyncio.create_task(feed_prompt(proc, substrate.stdin_input(spec)))
        self.children.add(feeding)
        feeding.add_done_callback(self.children.discard)
        parent_id = await self._spawn_parent(parent_lookup, task_id)
        # queued before any line of the task: the single writer keeps that order in the journal; a process
        # started before its task says how (executor/run/spawn/), and how long it waited
        facts: dict[str, Any] = {
            "pid": proc.pid, "role": task.role, "argv": started.cmd, "workdir": str(plan.workdir),
            "sandbox": "bwrap" if started.gateway is not None else "off",
            "attempt": task.attempt, "plan_ref": task.plan_ref,
            "executor": self.lease.name, "executor_epoch": self.lease.epoch, **started.spawned_facts(now)}
        spawned = r.event("task.spawned", facts, parent_id=parent_id)
        r.spawned_id = spawned.event_id
        await self.writer.put(spawned)
        # the process runs from here on, database or not: the row learns its pid now or once it is back (after
        # task.spawned is queued, so that its round trip is not on the way to the turn's first line)
        await self.save(r, lambda: self.store.set_process(task_id, proc.pid, session_id))
        if task.session_id is not None:  # a thread's turn: the command that continues it in a terminal
            command = substrate.resume_command(plan.substrate, plan.workdir, spec.session_uuid)
            await self.save(r, lambda: self.store.mark_session_cli(session_id, spec.session_uuid, plan.workdir,
                                                                   command))
        child = asyncio.create_task(self._supervise(r, task), name=f"task-{task_id}")
        self.children.add(child)
        child.add_done_callback(self.children.discard)

    @staticmethod
    async def _spawn_parent(lookup: asyncio.Future[uuid.UUID | None], task_id: uuid.UUID) -> uuid.UUID | None:
        """The looked-up parent of a run's task.spawned; the process runs already, so a failed lookup costs
        the tree one link, never the run."""
        try:
            return await lookup
        except Exception:  # noqa: BLE001 - see above
            log.exception("spawn_parent_failed", task_id=str(task_id))
            return None

    # ---- running ---------------------------------------------------------------------------------------

    async def _mark_output(self, r: Running) -> None:
        r.last_output = time.monotonic()
        r.last_output_at = _now()
        r.output_dirty = True
        if r.stalled_since is not None:  # rare: only the first output after a stall awaits anything
            stalled_for = r.last_output - r.stalled_since
            r.stalled_since = None
            await self.writer.put(r.event("task.resumed", {"stalled_for_s": round(stalled_for, 3)}))
            await self.set_activity(r, "running")

    async def _supervise(self, r: Running, task: ClaimedTask) -> None:
        readers = [asyncio.create_task(read_stdout(r, self.writer, self._mark_output)),
                   asyncio.create_task(read_stderr(r, self.writer))]
        try:
            rc = await self._until_exit(r)
            if r.gateway is not None and self.isolation is not None:
                await r.gateway.close()
                assert r.workdir is not None
                # off the loop: it walks the conversation's side directory, which the spawn filled as it liked
                await asyncio.to_thread(self.isolation.keep_session, r.workdir, r.cli_session or str(r.session_id),
                                        r.spawn_key, substrate_config=r.substrate)
            if r.mcp_config is not None:
                r.revoke_pending = await self.credentials.revoke(r.task_id, r.mcp_config)
            done, pending = await asyncio.wait(readers, timeout=self.config.drain_timeout_s)
            for t in pending:
                t.cancel()
            for t in done:
                if t.exception() is not None:
                    log.error("reader_failed", task_id=str(r.task_id), error=repr(t.exception()))
            await self._finish(r, task, rc, drained=not pending)
        except Fenced:
            log.warning("run_fenced", task_id=str(r.task_id))  # taken over: its end is the survivor's to write
        except Exception:
            log.exception("supervise_failed", task_id=str(r.task_id))
            raise
        finally:
            self.runs.pop(r.task_id, None)
            self.on_reaped()

    async def _until_exit(self, r: Running) -> int:
        """The process's exit status; a stop asked meanwhile is carried out here, beside the wait."""
        async with asyncio.TaskGroup() as tg:
            stopping = tg.create_task(self._stop_when_asked(r), name=f"stop-{r.task_id}")
            watching = (tg.create_task(self._end_at_limit(r), name=f"limits-{r.task_id}")
                        if self.isolation is not None and self.isolation.spawn_cgroups.get(r.spawn_key) else None)
            rc = await r.proc.wait()
            if not r.stop_asked.is_set():
                stopping.cancel()
            if watching is not None:
                watching.cancel()
            # else: it sees the exit at its next step and returns (its journal lines are not cut short)
        return rc

    async def _end_at_limit(self, r: Running) -> None:
        """A spawn that hit its pids or memory limit ended at once, all of it: a fork bomb would spin at its limit,
        and the CLI would go on without the process the kernel's OOM killer chose. Its task says which limit."""
        assert self.isolation is not None
        hit = None
        while hit is None:
            await asyncio.sleep(LIMIT_CHECK_S)
            hit = self.isolation.limit_hit(r.spawn_key)
        r.stop_reason, r.killed = hit, True
        await asyncio.to_thread(self.isolation.kill_spawn, r.spawn_key)
        sent = process.signal_group(r.proc.pid, signal.SIGKILL)
        await self.writer.put(r.event("task.signal_sent", {"signal": "SIGKILL", "reason": hit,
                                                           "delivered": sent}))

    async def _check(self, r: Running) -> None:
        """A project worker's check, run on its worktree before its end is final (its end, settled, may send it
        to a fix round); journaled as code saw it."""
        command = await self.availability.retry(lambda: self.store.check_command(r.task_id), "check_command")
        if command is None or r.workdir is None:
            return
        await self._mark_output(r)  # the watchdog's silence counts from the check's start, and its output
        checked = await check.check_worktree(self.isolation, r.project_id, r.workdir, command,
                                             self.config.check_timeout_s, on_output=lambda: self._mark_output(r))
        await self.writer.write([replace(r.event("task.check", checked), tier="derived")])

    def _offer_warm(self, task: ClaimedTask, reason: str | None) -> None:
        """A thread's turn ended: its conversation is stored, so its next turn can start now (warm turns); not
        for one ended to free what it held while parked on the user."""
        if task.session_id is not None and task.json_schema is None and reason != PARKED_LIMIT:
            self.spawner.warm.turn_ended(task.session_id)

    async def _finish(self, r: Running, task: ClaimedTask, rc: int, *, drained: bool) -> None:
        if self.isolation is not None and r.spawn_key in self.isolation.spawn_cgroups:
            # the kernel may have ended it before the watch looked (cgroup v2's memory.oom.group kills it all)
            hit = await asyncio.to_thread(self.isolation.limit_hit, r.spawn_key)
            if hit is not None:
                r.stop_reason = hit
            await asyncio.to_thread(self.isolation.drop_cgroup, r.spawn_key)
        # After a SIGKILL (ours or anyone's), or any death by signal, the CLI could not clean up: its
        # Bash children survive in their own session. A clean or SIGTERM exit kills them itself.
        swept: list[int] = []
        if rc < 0 or r.killed:
            swept = await asyncio.to_thread(
                lambda: process.kill_all(process.find_by_env(substrate.TASK_ENV_VAR, str(r.spawn_key)))
            )
        # the harness's own gate refusals (a gate that failed or timed out is missing from permission_denials)
        gated = await self.availability.retry(lambda: self.store.gate_denials(r.task_id), "gate_denials")
        outcome = end_outcome(rc, r.facts, r.stop_reason, gated)
        reason = outcome.reason
        payload: dict[str, object] = {
            "status": outcome.status,
            "reason": reason,
            "exit_code": rc if rc >= 0 else None,
            "signal": stream.signal_name(-rc) if rc < 0 else None,
            "duration_s": round(time.monotonic() - r.started, 3),
            "lines": r.facts.lines,
            "unparsed": r.facts.unparsed,
            "result": r.facts.result_summary(),
            "substrate_session_id": r.facts.substrate_session_id,
        }
        if r.facts.permission_denials:
            payload["permission_denials"] = r.facts.permission_denials
        if swept:
            payload["swept_pids"] = swept
        if not drained:
            payload["pipes_left_open"] = True
        # durable in the journal before the task row says so: the journal is the record
        await self.writer.write([r.event("task.exited", payload, parent_id=r.spawned_id)])
        if outcome.status == "success" and r.workdir is not None:
            await self._check(r)
        await self._finish_task(r.task_id, TaskEnd(
            outcome.status, reason, rc if rc >= 0 else None, -rc if rc < 0 else None, r.last_output_at))
        await self.store.end_session(r.session_id, "idle" if task.session_id else "ended",
                                     r.facts.substrate_session_id)
        self._offer_warm(task, reason)
        if r.mcp_config is not None:
            r.mcp_config.unlink(missing_ok=True)
            if r.revoke_pending:
                r.revoke_pending = await self.credentials.revoke(r.task_id, r.mcp_config)
        # the settler acts on the end from here (woken by the status change), reading the store, not r.facts:
        # it records a project worker's changes and removes its worktree first
        log.info("task_exited", task_id=str(r.task_id), status=outcome.status, reason=reason, rc=rc)

    # ---- stopping ------------------------------------------------------------------------------------

    async def request_stop(self, r: Running, reason: str) -> None:
        """Ask a run to stop (the first reason given is the one kept); the run's own coroutine sends the
        signals. Returns once the row says a stop was asked (or the database is found away)."""
        if r.stop_reason is not None or r.proc.returncode is not None:
            return
        r.stop_reason = reason
        try:
            await self.store.mark_stop_requested(r.task_id)
        except OUTAGE_ERRORS as exc:
            # the stop must happen whether or not the row can say so (the journal will)
            self.availability.failed(exc, "stop")
        r.stop_asked.set()

    async def _stop_when_asked(self, r: Running) -> None:
        """SIGTERM, wait the grace, SIGKILL, wait: each step only while the process lives."""
        await r.stop_asked.wait()
        if not _alive(r):
            return
        if r.gateway is not None and self.isolation is not None:
            sent = process.signal_inside(r.proc.pid, signal.SIGTERM, self.isolation.policy.bwrap)
        else:
            sent = process.signal_group(r.proc.pid, signal.SIGTERM)
        await self.writer.put(r.event("task.signal_sent", {"signal": "SIGTERM", "reason": r.stop_reason,
                                                           "delivered": sent}))
        try:
            await asyncio.wait_for(r.proc.wait(), self.config.stop_grace_s)
            return
        except TimeoutError:
            pass
        if not _alive(r):  # it ended as the grace ran out
            return
        sent = process.signal_group(r.proc.pid, signal.SIGKILL)
        r.killed = True
        await self.writer.put(r.event("task.signal_sent", {"signal": "SIGKILL", "reason": "grace_expired",
                                                           "delivered": sent}))
        await r.proc.wait()

    def kill_fenced(self, r: Running) -> None:
        """Taken over: the run must not go on for a moment longer (no grace)."""
        r.stop_reason = r.stop_reason or "executor_fenced"
        r.killed = True
        process.signal_group(r.proc.pid, signal.SIGKILL)

    # ---- the row, through outages --------------------------------------------------------------------

    async def set_activity(self, r: Running, activity: str) -> None:
        await self.save(r, lambda: self.store.save_activity(r.task_id, activity))

    async def save(self, r: Running, write: Callable[[], Awaitable[None]]) -> None:
        """A running task's row update that must not stop the task when the database is away: kept, in
        order, and applied by the watchdog once it is back (the journal has the events meanwhile)."""
        r.unsaved.append(write)
        await self.apply_unsaved(r)

    async def apply_unsaved(self, r: Running) -> None:
        if r.saving:  # the reader and the watchdog may both get here: one applies, in order
            return
        r.saving = True
        try:
            while r.unsaved:
                try:
                    await r.unsaved[0]()
                except OUTAGE_ERRORS as exc:
                    self.availability.failed(exc, "task_row")
                    return
                r.unsaved.pop(0)
        finally:
            r.saving = False
