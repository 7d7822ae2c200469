"""The supervisor: claims dispatched tasks, runs their `claude` processes, journals every line, turns
each exit into a status, honours stop requests, watches for silence, and reconciles after a crash."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg.rows import dict_row

from executor import fleet, lineage, process, projects, substrate, worktrees
from executor.journal_writer import Fenced, JournalWriter
from executor.sql import queries
from shared import aio, journal, lifeline, logs
from shared.database import OUTAGE_ERRORS, Database
from shared.listener import Subscription
from shared.models import NewEvent

log = logs.get(__name__)

# At start-up, how long a dead executor's leftover processes get to end on their own (its CLI was sent
# SIGTERM by its parent-death signal and takes about two seconds to end its Bash children) before SIGKILL.
ORPHAN_GRACE_S = 5.0

# How often the claim loop makes sure the session holding the singleton lock is still alive.


@dataclass(frozen=True)
class SupervisorConfig:
    max_workers: int = 4
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
    # the fleet: this executor's name (unique among live ones), labels and lease (executor/fleet.py)
    name: str = field(default_factory=fleet.default_name)
    labels: tuple[str, ...] = ()
    lease_s: float = fleet.DEFAULT_LEASE_S
    # every executor reads one CLI config directory: a thread's turns need not stay where the first ran
    shared_claude_config: bool = False


@dataclass
class Running:
    task_id: uuid.UUID
    session_id: uuid.UUID
    project_id: uuid.UUID | None
    role: str
    proc: asyncio.subprocess.Process
    started: float
    facts: substrate.TurnFacts = field(default_factory=substrate.TurnFacts)
    last_output: float = 0.0
    last_output_at: datetime | None = None
    output_dirty: bool = False
    stalled_since: float | None = None
    awaiting_user: bool = False
    stop_reason: str | None = None
    kill_timer: asyncio.TimerHandle | None = None
    killed: bool = False
    mcp_config: Path | None = None
    revoke_pending: bool = False  # the database was away when its process exited: revoked once the end is recorded
    # row updates an outage held back, applied in order once the database is back
    unsaved: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    saving: bool = False
    spawned_id: uuid.UUID | None = None  # its task.spawned event: the parent of its task.exited
    tool_calls: dict[str, uuid.UUID] = field(default_factory=dict)  # tool_use_id → the line that made the call



def _now() -> datetime:
    return datetime.now(UTC)


# Stops the harness sends for its own reasons are not the user's cancellation: the executor's shutdown
# (a deploy) cut the run off like a crash, and the runtime cap is a failure; the policy retries both.
HARNESS_STOPS = {"executor_shutdown": "crashed", "max_runtime": "failed"}
USER_STOP = "stop_requested"


def end_outcome(returncode: int, facts: substrate.TurnFacts, stop_reason: str | None,
                gate_denials: int = 0) -> substrate.Outcome:
    """A run's status from its exit, why the harness stopped it (if it did) and how many of its calls the
    harness refused at a gate (pure)."""
    if stop_reason is None or stop_reason not in HARNESS_STOPS:
        outcome = substrate.derive_status(returncode, facts, stop_requested=stop_reason is not None,
                                          gate_denials=gate_denials)
        return substrate.Outcome(outcome.status, stop_reason or outcome.reason)
    outcome = substrate.derive_status(returncode, facts, gate_denials=gate_denials)
    if outcome.status == "success":
        return outcome  # it finished before the stop took effect
    return substrate.Outcome(HARNESS_STOPS[stop_reason], stop_reason)


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
        self.running: dict[uuid.UUID, Running] = {}
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._children: set[asyncio.Task[None]] = set()
        self.ready = asyncio.Event()
        self._claimed: list[dict[str, Any]] = []
        # told when a spawn's credential dies (the harness MCP forgets the callers it confirmed)
        self.on_credential_revoked: Callable[[uuid.UUID], None] | None = None
        self.lease = fleet.Lease(db.dsn, fleet.FleetConfig(
            name=config.name, labels=config.labels, capacity=config.max_workers, lease_s=config.lease_s),
            on_reaped=writer.write)

    # ---- queries -------------------------------------------------------------------------------------

    async def _rows(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        async with self.db.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(queries[name], params or {})
            return await cur.fetchall() if cur.description else []

    async def _exec(self, name: str, params: dict[str, Any] | None = None) -> None:
        async with self.db.pool.connection() as conn:
            await conn.execute(queries[name], params or {})

    # ---- lifecycle -------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self, wake_on: Subscription | None = None) -> None:
        """Supervise until stop(); then stop children, journal their ends, and return. A database outage
        of any length only pauses claiming: running tasks go on, and the loop resumes when it returns."""
        availability = self.db.availability
        await availability.retry(self.lease.join, "lease")  # refuses a live executor of the same name
        self.writer.fence = self.lease
        side: list[asyncio.Task[None]] = []
        leasing = asyncio.create_task(self.lease.run(), name="lease")
        try:
            self._sweep_mcp_configs()
            await availability.retry(self.reconcile, "reconcile")
            side.append(asyncio.create_task(self._watchdog(), name="watchdog"))
            if wake_on is not None:
                side.append(asyncio.create_task(self._forward_wakeups(wake_on), name="wakeups"))
            side.append(asyncio.create_task(self._forward_fence(), name="fence"))
            self.ready.set()
            while not self._stopping.is_set():
                self._wake.clear()
                if leasing.done() and not self.lease.fenced.is_set():
                    leasing.result()  # the lease cannot be held (a namesake took the name): stop here
                if self.lease.fenced.is_set():
                    await leasing
                    await self._rejoin()
                    leasing = asyncio.create_task(self.lease.run(), name="lease")
                try:
                    await self._claim_stops()
                    await self._claim_tasks()
                except OUTAGE_ERRORS as exc:
                    await availability.pause(exc, "supervisor", self._stopping)
                    continue
                availability.succeeded()
                with contextlib.suppress(TimeoutError):
                    await aio.wait_for(self._wake.wait(), self.config.poll_interval_s)
        finally:
            await self._stop_children("executor_shutdown")
            leasing.cancel()
            for t in side:
                t.cancel()
            await asyncio.gather(leasing, *side, return_exceptions=True)
            await self.writer.drain()
            await self.lease.leave()

    async def _forward_fence(self) -> None:
        while True:
            await self.lease.fenced.wait()
            self._wake.set()
            await asyncio.sleep(self.config.poll_interval_s)

    async def _rejoin(self) -> None:
        """Taken over by a survivor (this process was paused or cut off past its lease): its tasks were
        crashed and retried elsewhere, so its processes must not go on. Kill them (and their Bash children)
        before claiming anything, then join again with a new epoch. Their ends are not written: fenced."""
        lost = list(self.running.values())
        for r in lost:
            r.stop_reason = r.stop_reason or "executor_fenced"
            r.killed = True
            process.signal_group(r.proc.pid, signal.SIGKILL)
        killed = await asyncio.to_thread(lambda: [
            pid for r in lost for pid in process.kill_all(process.find_by_env(substrate.TASK_ENV_VAR, str(r.task_id)))])
        if self._children:
            await asyncio.wait(self._children, timeout=self.config.drain_timeout_s + 5)
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
            await sub.get()
            self._wake.set()

    async def _stop_children(self, reason: str) -> None:
        for r in list(self.running.values()):
            await self._request_stop(r, reason)
        if self._children:
            await asyncio.wait(self._children, timeout=self.config.stop_grace_s + self.config.drain_timeout_s + 5)

    # ---- reconciliation ----------------------------------------------------------------------------

    async def reconcile(self) -> dict[str, Any]:
        """After a restart nothing stays "running": the dead executor's tasks become crashed, their
        surviving processes are killed, claimed queue rows go back to pending, their questions close."""
        orphans = await self._rows("orphaned_running_tasks", {"name": self.lease.name})
        events: list[NewEvent] = []
        crashed = []
        for row in orphans:
            survivors = await asyncio.to_thread(process.find_by_env, substrate.TASK_ENV_VAR, str(row["id"]))
            killed = await asyncio.to_thread(process.reap_orphans, survivors, ORPHAN_GRACE_S)
            # durable in the journal before the row says crashed: the settler acts on the row at once
            await self.writer.write([NewEvent("task.crashed", {"reason": "executor_restart", "status": "crashed",
                                                               "killed_pids": killed},
                                              task_id=row["id"], session_id=row["session_id"],
                                              project_id=row["project_id"])])
            await self._exec("crash_task", {"id": row["id"], "reason": "executor_restart"})
            crashed.append(str(row["id"]))
        (requeued,) = await self._rows("requeue_claimed", {"name": self.lease.name, "stale_s": self.config.lease_s})
        closed = await self._rows("cancel_orphaned_questions")
        for q in closed:
            events.append(NewEvent("question.cancelled", {"question_id": str(q["id"]), "reason": "executor_restart"},
                                   task_id=q["task_id"]))
        summary = {"crashed_tasks": crashed, "requeued": requeued,
                   "cancelled_questions": [str(q["id"]) for q in closed]}
        events.append(NewEvent("executor.started", {"reconciled": summary, "name": self.lease.name,
                                                    "epoch": self.lease.epoch, "labels": list(self.config.labels)}))
        await self.writer.write(events)
        log.info("executor_reconciled", **summary)
        # A task that died with the old executor ended like any other: its final status is all that is
        # written here; the settler (executor/settler.py) acts on the end (the policy, the thread).
        return summary

    # ---- claiming ------------------------------------------------------------------------------------

    async def _claim_tasks(self) -> None:
        # A claimed task whose start an outage cut short is still ours: start it before claiming more.
        await self._start_claimed()
        free = self.config.max_workers - len(self.running)
        if free <= 0 or self._stopping.is_set():
            return
        self._claimed += await self._rows("claim_pending_tasks", {
            "n": free, "name": self.lease.name, "epoch": self.lease.epoch, "labels": list(self.config.labels),
            "shared_config": self.config.shared_claude_config})
        await self._start_claimed()

    async def _start_claimed(self) -> None:
        while self._claimed:
            await self._start(self._claimed[0])  # an outage error leaves it first in line
            self._claimed.pop(0)

    async def _claim_stops(self) -> None:
        for row in await self._rows("claim_stop_requests", {"name": self.lease.name}):
            await self._handle_stop(row["id"], row["task_id"], row["reason"])

    async def _handle_stop(self, stop_id: uuid.UUID, task_id: uuid.UUID, reason: str | None) -> None:
        status, error = "done", None
        found = await self._rows("task_status", {"id": task_id})
        current = found[0]["status"] if found else None
        cancelled_pending = current == "pending" and bool(
            await self._rows("cancel_pending_task", {"id": task_id, "reason": "stop_requested"}))
        if current is None:
            status, error = "failed", f"no task {task_id}"
        else:
            await self.writer.put(NewEvent("task.stop_requested", {"stop_id": str(stop_id), "reason": reason},
                                           task_id=task_id))
            r = self.running.get(task_id)
            if r is not None:
                await self._request_stop(r, USER_STOP)
            elif cancelled_pending:
                await self.writer.put(NewEvent("task.exited", {"status": "cancelled", "reason": "stop_requested",
                                                               "spawned": False}, task_id=task_id))
            elif current == "running":
                status, error = "failed", "task is running but not under this executor"
            else:
                error = f"task already {current}"
        await self._exec("finish_stop_request", {"id": stop_id, "status": status, "error": error})

    # ---- spawning ------------------------------------------------------------------------------------

    async def _profile(self, role: str) -> dict[str, Any]:
        rows = await self._rows("role_profile", {"role": role})
        return rows[0] if rows else {"role": role, "system_prompt": "", "allowed_tools": [], "use_mcp": False}

    async def _finish_unspawned(self, row: dict[str, Any], status: str, reason: str) -> None:
        await self.writer.write([NewEvent("task.exited", {"status": status, "reason": reason, "spawned": False},
                                          task_id=row["id"], project_id=row["project_id"])])
        # Record what a project worker changed, then remove its worktree (the branch stays for review) —
        # before the final status, so the settler (woken by it) finds the changes for the handoff's artifacts.
        # An executor that dies here leaves it to the project loop's sweep.
        try:
            await worktrees.record_changes(self.db.pool, self.writer, row["id"],
                                           keep_worktree=self.config.keep_worktrees)
        except Exception:  # noqa: BLE001 - the task's end is recorded; its changes can be recorded later
            log.exception("record_changes_failed", task_id=str(row["id"]))
        await self._finish_task({"id": row["id"], "status": status, "reason": reason,
                                 "exit_code": None, "exit_signal": None, "last_output_at": None})

    async def _finish_task(self, params: dict[str, Any]) -> bool:
        """The final status, fenced by this run's claim: False when a survivor took the task over."""
        done = bool(await self._rows("finish_task", {**params, "name": self.lease.name, "epoch": self.lease.epoch}))
        if not done:
            log.warning("final_status_refused", task_id=str(params["id"]), status=params["status"],
                        epoch=self.lease.epoch)
        return done

    @property
    def _mcp_dir(self) -> Path:
        return self.config.run_dir / "mcp"

    async def _write_mcp_config(self, task_id: uuid.UUID, session_id: uuid.UUID) -> Path | None:
        """The per-spawn MCP config carrying a fresh credential; only its hash reaches the database."""
        if not self.config.mcp_url:
            return None
        token = secrets.token_urlsafe(32)
        await self._exec("grant_harness_credential", {"token_sha256": hashlib.sha256(token.encode()).digest(),
                                                      "task_id": task_id, "session_id": session_id})
        # the credential is the caller's identity: readable by this user only, from the first byte
        self._mcp_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self._mcp_dir, 0o700)  # an older or hand-made directory may be wider
        path = self._mcp_dir / f"mcp-{task_id}.json"
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(substrate.mcp_config(self.config.mcp_url, token, self.config.mcp_timeout_ms)))
        return path

    async def _revoke_mcp_config(self, r: Running) -> None:
        """The credential dies with its process, before the task's end is settled (a Bash grandchild that
        survives the CLI and read the config cannot call as the task meanwhile)."""
        assert r.mcp_config is not None
        r.mcp_config.unlink(missing_ok=True)
        if self.on_credential_revoked is not None:
            self.on_credential_revoked(r.task_id)
        try:
            await self._exec("revoke_harness_credential", {"task_id": r.task_id})
            r.revoke_pending = False
        except OUTAGE_ERRORS as exc:
            # the database is away: the harness already forgot the caller (above); the task's final status
            # refuses the credential until it is revoked, once the end is recorded
            r.revoke_pending = True
            self.db.availability.failed(exc, "credential_revoke")
        except Exception:  # noqa: BLE001 - the task's end must still be recorded; its status refuses it then
            log.exception("credential_revoke_failed", task_id=str(r.task_id))

    def _sweep_mcp_configs(self) -> None:
        """Configs left by processes of a previous executor (a crash): their credentials are dead anyway."""
        if self._mcp_dir.is_dir():
            for stale in self._mcp_dir.glob("mcp-*.json"):
                stale.unlink(missing_ok=True)

    async def _start(self, row: dict[str, Any]) -> None:
        task_id: uuid.UUID = row["id"]
        # a worker of a project runs in a git worktree of its own, never in the project's checkout
        try:
            isolated = await projects.prepare_worktree(self.db.pool, self.writer, row, self.config.worktree_root)
        except (worktrees.GitError, OSError) as exc:
            await self._finish_unspawned(row, "failed", f"could not make the worker's git worktree: {exc}")
            return
        workdir = isolated or Path(row["workdir"] or self.config.default_workdir)
        if not workdir.is_dir():
            await self._finish_unspawned(row, "skipped", f"working directory {workdir} does not exist")
            return
        profile = await self._profile(row["role"])
        parent_id = await lineage.spawn_parent(self.db.pool, row)
        # A task of a conversation that goes on (a thread's turn) reuses its session and resumes it after
        # the first turn; any other task is a conversation of its own.
        session_id = row["session_id"] or uuid.uuid4()
        # resumed only if the CLI stored it: a first turn that failed before that starts it again
        resume = bool(row["session_id"]) and await asyncio.to_thread(
            substrate.session_stored, self.substrate, str(session_id))
        mcp_path = await self._write_mcp_config(task_id, session_id) if profile["use_mcp"] else None
        spec = substrate.SpawnSpec(
            role=row["role"],
            prompt=row["brief"],
            session_uuid=str(session_id),
            resume=resume,
            allowed_tools=tuple(row["allowed_tools"] if row["allowed_tools"] is not None else profile["allowed_tools"]),
            system_prompt=profile["system_prompt"],
            mcp_config=mcp_path,
            json_schema=row.get("json_schema"),
        )
        cmd = substrate.build_command(self.substrate, spec)
        await self._exec("insert_session", {"id": session_id, "project_id": row["project_id"],
                                            "role": row["role"], "lifecycle": "running"})
        await self._exec("count_turn", {"id": session_id})
        await self._exec("pin_session", {"id": session_id, "name": self.lease.name})
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=workdir,
                env=substrate.build_env(self.substrate, str(task_id)),
                start_new_session=True,
                # if the executor dies, its workers die with it; SIGTERM, not SIGKILL: the CLI then ends its
                # Bash-tool children itself (they run in their own session, out of reach of a group signal)
                preexec_fn=lifeline.die_with_parent(signal.SIGTERM),
            )
        except OSError as exc:
            if mcp_path is not None:
                mcp_path.unlink(missing_ok=True)
            await self._finish_unspawned(row, "failed", f"could not start {cmd[0]}: {exc}")
            return
        started = time.monotonic()
        r = Running(task_id=task_id, session_id=session_id, project_id=row["project_id"], role=row["role"],
                    proc=proc, started=started, last_output=started, mcp_config=mcp_path)
        self.running[task_id] = r
        # the process runs from here on, database or not: the row learns its pid now or once it is back
        await self._save(r, "set_task_process", {"id": task_id, "pid": proc.pid, "session_id": session_id})
        # queued before any line of the task: the single writer keeps that order in the journal
        spawned = self._event(r, "task.spawned", {
            "pid": proc.pid, "role": row["role"], "argv": cmd, "workdir": str(workdir),
            "attempt": row["attempt"], "plan_ref": row["plan_ref"],
            "executor": self.lease.name, "executor_epoch": self.lease.epoch}, parent_id=parent_id)
        r.spawned_id = spawned.event_id
        await self.writer.put(spawned)
        child = asyncio.create_task(self._supervise(r, row), name=f"task-{task_id}")
        self._children.add(child)
        child.add_done_callback(self._children.discard)

    def _event(self, r: Running, event_type: str, payload: Any, created_at: datetime | None = None,
               payload_json: str | None = None, parent_id: uuid.UUID | None = None) -> NewEvent:
        return NewEvent(event_type, payload, task_id=r.task_id, session_id=r.session_id, project_id=r.project_id,
                        created_at=created_at, payload_json=payload_json, parent_id=parent_id)

    # ---- running ---------------------------------------------------------------------------------------

    async def _mark_output(self, r: Running) -> None:
        r.last_output = time.monotonic()
        r.last_output_at = _now()
        r.output_dirty = True
        if r.stalled_since is not None:  # rare: only the first output after a stall awaits anything
            stalled_for = r.last_output - r.stalled_since
            r.stalled_since = None
            await self.writer.put(self._event(r, "task.resumed", {"stalled_for_s": round(stalled_for, 3)}))
            await self._set_activity(r, "running")

    async def _read_stdout(self, r: Running) -> None:
        assert r.proc.stdout is not None
        task_id, session_id, project_id = r.task_id, r.session_id, r.project_id
        async for chunk in process.iter_line_chunks(r.proc.stdout):
            events = []
            read_at = _now()
            for raw, event_id in zip(chunk, journal.new_event_ids(len(chunk))):
                if not raw.strip():
                    continue
                line = substrate.classify(raw)
                r.facts.feed(line)
                parent = lineage.tool_parent(r.tool_calls, line.event_type, line.payload, event_id)
                # A line kept as printed is stored from its text: its parsed value is let go here rather
                # than held while queued (a flood's queued values cost more in garbage collection than in
                # parsing).
                events.append(NewEvent(line.event_type, line.payload if line.payload_json is None else None,
                                       task_id=task_id, session_id=session_id, project_id=project_id,
                                       created_at=read_at, payload_json=line.payload_json, parent_id=parent,
                                       event_id=event_id))
            if events:
                await self._mark_output(r)
                await self.writer.put_many(events)

    async def _read_stderr(self, r: Running) -> None:
        assert r.proc.stderr is not None
        async for raw in process.iter_lines(r.proc.stderr):
            if raw.strip():
                await self.writer.put(self._event(r, "task.stderr", {"line": raw.decode("utf-8", "replace")}))

    async def _supervise(self, r: Running, row: dict[str, Any]) -> None:
        readers = [asyncio.create_task(self._read_stdout(r)), asyncio.create_task(self._read_stderr(r))]
        try:
            rc = await r.proc.wait()
            if r.mcp_config is not None:
                await self._revoke_mcp_config(r)
            done, pending = await asyncio.wait(readers, timeout=self.config.drain_timeout_s)
            for t in pending:
                t.cancel()
            for t in done:
                if t.exception() is not None:
                    log.error("reader_failed", task_id=str(r.task_id), error=repr(t.exception()))
            await self._finish(r, row, rc, drained=not pending)
        except Fenced:
            log.warning("run_fenced", task_id=str(r.task_id))  # taken over: its end is the survivor's to write
        except Exception:
            log.exception("supervise_failed", task_id=str(r.task_id))
            raise
        finally:
            self.running.pop(r.task_id, None)
            self._wake.set()

    async def _finish(self, r: Running, row: dict[str, Any], rc: int, *, drained: bool) -> None:
        if r.kill_timer is not None:
            r.kill_timer.cancel()
        # After a SIGKILL (ours or anyone's), or any death by signal, the CLI could not clean up: its
        # Bash children survive in their own session. A clean or SIGTERM exit kills them itself.
        swept: list[int] = []
        if rc < 0 or r.killed:
            swept = await asyncio.to_thread(
                lambda: process.kill_all(process.find_by_env(substrate.TASK_ENV_VAR, str(r.task_id)))
            )
        # the harness's own gate refusals (a gate that failed or timed out is missing from permission_denials)
        [gated] = await self.db.availability.retry(
            lambda: self._rows("task_gate_denials", {"id": r.task_id}), "gate_denials")
        outcome = end_outcome(rc, r.facts, r.stop_reason, gated["denied"])
        reason = outcome.reason
        payload: dict[str, object] = {
            "status": outcome.status,
            "reason": reason,
            "exit_code": rc if rc >= 0 else None,
            "signal": substrate.signal_name(-rc) if rc < 0 else None,
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
        await self.writer.write([self._event(r, "task.exited", payload, parent_id=r.spawned_id)])
        # Record what a project worker changed, then remove its worktree (the branch stays for review) —
        # before the final status, so the settler (woken by it) finds the changes for the handoff's artifacts.
        # An executor that dies here leaves it to the project loop's sweep.
        try:
            await worktrees.record_changes(self.db.pool, self.writer, r.task_id,
                                           keep_worktree=self.config.keep_worktrees)
        except Exception:  # noqa: BLE001 - the task's end is recorded; its changes can be recorded later
            log.exception("record_changes_failed", task_id=str(r.task_id))
        await self._finish_task({
            "id": r.task_id, "status": outcome.status, "reason": reason,
            "exit_code": rc if rc >= 0 else None, "exit_signal": -rc if rc < 0 else None,
            "last_output_at": r.last_output_at})
        await self._exec("update_session", {
            "id": r.session_id, "lifecycle": "idle" if row["session_id"] else "ended",
            "substrate_session_id": r.facts.substrate_session_id})
        if r.mcp_config is not None:
            r.mcp_config.unlink(missing_ok=True)
            if r.revoke_pending:
                await self._revoke_mcp_config(r)
        # the settler acts on the end from here (woken by the status change), reading the store, not r.facts
        log.info("task_exited", task_id=str(r.task_id), status=outcome.status, reason=reason, rc=rc)

    # ---- stopping ------------------------------------------------------------------------------------

    async def _request_stop(self, r: Running, reason: str) -> None:
        if r.stop_reason is not None or r.proc.returncode is not None:
            return
        r.stop_reason = reason
        try:
            await self._exec("mark_stop_requested", {"id": r.task_id})
        except OUTAGE_ERRORS as exc:
            # the stop must happen whether or not the row can say so (the journal will)
            self.db.availability.failed(exc, "stop")
        sent = process.signal_group(r.proc.pid, signal.SIGTERM)
        await self.writer.put(self._event(r, "task.signal_sent", {"signal": "SIGTERM", "reason": reason,
                                                                  "delivered": sent}))
        loop = asyncio.get_running_loop()
        r.kill_timer = loop.call_later(self.config.stop_grace_s, lambda: asyncio.create_task(self._kill(r)))

    async def _kill(self, r: Running) -> None:
        if r.proc.returncode is not None:
            return
        sent = process.signal_group(r.proc.pid, signal.SIGKILL)
        r.killed = True
        await self.writer.put(self._event(r, "task.signal_sent", {"signal": "SIGKILL", "reason": "grace_expired",
                                                                  "delivered": sent}))

    # ---- watchdog ------------------------------------------------------------------------------------

    async def _set_activity(self, r: Running, activity: str) -> None:
        await self._save(r, "set_task_activity", {"id": r.task_id, "activity": activity})

    async def _save(self, r: Running, name: str, params: dict[str, Any]) -> None:
        """A running task's row update that must not stop the task when the database is away: kept, in
        order, and applied by the watchdog once it is back (the journal has the events meanwhile)."""
        r.unsaved.append((name, params))
        await self._apply_unsaved(r)

    async def _apply_unsaved(self, r: Running) -> None:
        if r.saving:  # the reader and the watchdog may both get here: one applies, in order
            return
        r.saving = True
        try:
            while r.unsaved:
                try:
                    await self._exec(*r.unsaved[0])
                except OUTAGE_ERRORS as exc:
                    self.db.availability.failed(exc, "task_row")
                    return
                r.unsaved.pop(0)
        finally:
            r.saving = False

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(self.config.watchdog_interval_s)
            try:
                await self._watch_once()
            except OUTAGE_ERRORS as exc:
                # silence is still watched from memory; the rows catch up when the database is back
                await self.db.availability.pause(exc, "watchdog")
            except Exception:  # noqa: BLE001 - the watchdog outlives a failed tick
                log.exception("watchdog_tick_failed")

    async def _watch_once(self) -> None:
        now = time.monotonic()
        for r in [r for r in self.running.values() if r.unsaved]:
            await self._apply_unsaved(r)
        dirty = [r for r in self.running.values() if r.output_dirty and r.last_output_at is not None]
        if dirty:
            for r in dirty:
                r.output_dirty = False
            await self._exec("touch_tasks_output", {
                "ids": [r.task_id for r in dirty], "ats": [r.last_output_at for r in dirty]})
        live = [r for r in self.running.values() if r.proc.returncode is None]
        if not live:
            return
        waiting = {row["task_id"] for row in await self._rows("tasks_with_pending_questions",
                                                              {"ids": [r.task_id for r in live]})}
        for r in live:
            if self.config.max_runtime_s is not None and now - r.started > self.config.max_runtime_s:
                await self._request_stop(r, "max_runtime")
            if r.stalled_since is not None:
                continue
            silent = now - r.last_output
            if r.task_id in waiting:
                # blocked on the user is not a stall; its silence starts counting when the answer lands
                if not r.awaiting_user:
                    r.awaiting_user = True
                    await self._set_activity(r, "awaiting_user")
                r.last_output = now
                continue
            if r.awaiting_user:
                r.awaiting_user = False
                await self._set_activity(r, "running")
            if silent >= self.config.stall_timeout_s:
                r.stalled_since = now
                await self.writer.put(self._event(r, "task.stalled", {
                    "silent_s": round(silent, 3), "threshold_s": self.config.stall_timeout_s}))
                await self._set_activity(r, "stalled")
