"""One run of one task, from spawn to reap: its `claude` process, every line it prints journaled, its stop
(SIGTERM, the grace, SIGKILL), its exit turned into a status, its credential revoked with it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from executor.journal.writer import Fenced, JournalWriter
from executor.projects import service as projects
from executor.projects import worktrees
from executor.run import lineage, process, stream, substrate, user_input
from executor.run.ahead import Ahead, AheadPool, SpareStale
from executor.run.credentials import Credentials
from executor.run.fleet import Lease
from executor.run.isolation import Isolation
from executor.run.task_store import ClaimedTask, TaskEnd, TaskStore
from executor.run.warm import Template, Warm, WarmConfig, WarmPool
from executor.sandbox import bwrap as sandbox
from executor.sandbox import limits
from executor.sandbox.gateway import Gateway
from shared import aio, journal, lifeline, logs
from shared.database import OUTAGE_ERRORS, Availability
from shared.models import NewEvent

log = logs.get(__name__)

# Stops the harness sends for its own reasons are not the user's cancellation: the executor's shutdown
# (a deploy) cut the run off like a crash, and the runtime cap is a failure; the policy retries both.
EXECUTOR_SHUTDOWN = "executor_shutdown"  # the reason the executor gives the runs its own stop cuts off
HARNESS_STOPS = {EXECUTOR_SHUTDOWN: "crashed", "max_runtime": "failed"}
# a spawn that hit its pids or memory limit (executor/sandbox/limits.py) crashed, even when its CLI outlived the
# process the limit ended and finished: what it did was cut short
LIMIT_STOPS = (limits.PIDS_LIMIT, limits.MEMORY_LIMIT)
USER_STOP = "stop_requested"
# a process parked on the user past the supervisor's bound (PETAL_MAX_PARKED): ended, its question left answerable
# (the answer resumes the conversation in a new turn); not the turn's failure
PARKED_LIMIT = "parked_limit"
# a routine run's process is not started with less than this left of the run's USD (it could not finish a call)
MIN_GRANT_USD = 0.01
# how often a run's cgroup is looked at for a limit hit: a fork refused at pids.max or an OOM kill is no event
# the loop can wait on (v1's counters have no file notification)
LIMIT_CHECK_S = 0.25


def end_outcome(returncode: int, facts: stream.TurnFacts, stop_reason: str | None,
                gate_denials: int = 0) -> stream.Outcome:
    """A run's status from its exit, why the harness stopped it (if it did) and how many of its calls the
    harness refused at a gate (pure)."""
    if stop_reason in LIMIT_STOPS:
        return stream.Outcome("crashed", stop_reason)
    if stop_reason is None or stop_reason not in HARNESS_STOPS:
        outcome = stream.derive_status(returncode, facts, stop_requested=stop_reason is not None,
                                          gate_denials=gate_denials)
        return stream.Outcome(outcome.status, stop_reason or outcome.reason)
    outcome = stream.derive_status(returncode, facts, gate_denials=gate_denials)
    if outcome.status == "success":
        return outcome  # it finished before the stop took effect
    return stream.Outcome(HARNESS_STOPS[stop_reason], stop_reason)


def _now() -> datetime:
    return datetime.now(UTC)


def _alive(r: Running) -> bool:
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
    # threads' next turns started ahead of their messages (executor/run/warm.py)
    warm: WarmConfig = field(default_factory=WarmConfig)
    # a thread's next turn's sandbox started before its claim (executor/run/ahead.py), and how many spares wait
    ahead: bool = True
    ahead_spares: int = 1


@dataclass
class Running:
    task_id: uuid.UUID
    session_id: uuid.UUID
    project_id: uuid.UUID | None
    role: str
    proc: asyncio.subprocess.Process
    started: float
    facts: stream.TurnFacts = field(default_factory=stream.TurnFacts)
    last_output: float = 0.0
    last_output_at: datetime | None = None
    output_dirty: bool = False
    stalled_since: float | None = None
    awaiting_user: bool = False
    chat: bool = False  # a thread turn a user's message started (executor/run/supervisor.py: its slots)
    stop_reason: str | None = None
    stop_asked: asyncio.Event = field(default_factory=asyncio.Event)  # the run's own coroutine carries it out
    killed: bool = False
    mcp_config: Path | None = None
    gateway: Gateway | None = None  # the sandbox's ways out, closed when the process has exited
    workdir: Path | None = None
    # the CLI conversation it speaks in and the CLI config it runs with (an adopted thread's own)
    cli_session: str | None = None
    substrate: substrate.SubstrateConfig | None = None
    revoke_pending: bool = False  # the database was away when its process exited: revoked once the end is recorded
    # row updates an outage held back, applied in order once the database is back
    unsaved: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    saving: bool = False
    spawned_id: uuid.UUID | None = None  # its task.spawned event: the parent of its task.exited
    tool_calls: dict[str, uuid.UUID] = field(default_factory=dict)  # tool_use_id → the line that made the call
    # the process's PETAL_TASK_ID and sandbox key: the task's id, or the warm process's own it was started with
    spawn_id: uuid.UUID | None = None

    @property
    def spawn_key(self) -> uuid.UUID:
        return self.spawn_id or self.task_id


class Conversation(NamedTuple):
    resume: bool
    substrate: substrate.SubstrateConfig
    cli_session: str | None = None
    fork_from: str | None = None
    workdir: Path | None = None


class TaskRunner:
    """Starts runs and sees each through to its reaping; `runs` are those whose process lives (or whose
    end is being recorded)."""

    def __init__(self, store: TaskStore, writer: JournalWriter, substrate_config: substrate.SubstrateConfig,
                 config: RunConfig, lease: Lease, availability: Availability, on_reaped: Callable[[], None]):
        self.store = store
        self.writer = writer
        self.substrate = substrate_config
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
        self.warm = WarmPool(config.warm, self, lambda offered, presence_s, n: self.store.warm_candidates(
            offered, presence_s, n, name=lease.name))
        self.ahead = AheadPool(self, enabled=config.ahead and self.isolation is not None,
                               pinned_here=lambda name: name == lease.name, spares=config.ahead_spares)

    async def wait(self, timeout: float) -> None:
        """Until every run is reaped, or the timeout."""
        if self.children:
            await asyncio.wait(self.children, timeout=timeout)

    # ---- spawning ------------------------------------------------------------------------------------

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

    async def _conversation(self, task: ClaimedTask) -> Conversation:
        """The CLI conversation a task speaks in: a thread's own, or the one an adopted thread continues (in
        its own directory and config directory; forked on the first turn when a live process held it)."""
        if task.session_id is None:
            return Conversation(False, self.substrate)
        cli = await self.store.session_cli(task.session_id)
        sub, workdir, cli_session, fork_from = self.substrate, None, str(task.session_id), None
        if cli is not None and cli["adopted_session_id"]:
            if cli["cli_config_dir"]:
                sub = replace(self.substrate, config_dir=Path(cli["cli_config_dir"]))
            workdir = Path(cli["cli_workdir"]) if cli["cli_workdir"] else None
            cli_session = cli["cli_session_id"] or cli_session
            fork_from = cli["cli_fork_from"]
        # a thread's turn resumes its conversation only if the CLI stored it: a first turn that failed before
        # that starts it again (a fork: forks it again)
        resume = await asyncio.to_thread(substrate.session_stored, sub, cli_session)
        return Conversation(resume, sub, cli_session, None if resume else fork_from, workdir)

    async def start(self, task: ClaimedTask) -> None:
        """Spawn a claimed task's process (or take its thread's warm one) and supervise it until it is reaped.
        An outage error before the process exists leaves the task claimed, to start again; from the spawn on,
        the run goes on."""
        task_id = task.id
        # What the spawn needs is asked for at once, not one round trip after another: each is on the way to
        # the process's first line. The event its task.spawned hangs under is needed only after the spawn.
        parent_lookup = asyncio.ensure_future(lineage.spawn_parent(
            self.store.pool, task.id, task.parent_task_id, extractor=task.json_schema is not None))
        parent_lookup.add_done_callback(lambda f: f.cancelled() or f.exception())  # its failure is read or moot
        proc = None
        gateway: Gateway | None = None
        warmed: Warm | None = None
        ahead: Ahead | None = None
        try:
            isolated, profile, conv = await asyncio.gather(
                self._worktree(task), self.store.role_profile(task.role), self._conversation(task))
            if isinstance(isolated, str):
                await self._finish_unspawned(task, "failed", isolated)
                return
            workdir = isolated or conv.workdir or Path(task.workdir or self.config.default_workdir)
            if not workdir.is_dir():
                await self._finish_unspawned(task, "skipped", f"working directory {workdir} does not exist")
                return
            # A task of a conversation that goes on (a thread's turn) reuses its session; any other task is
            # a conversation of its own.
            session_id = task.session_id or uuid.uuid4()
            allowed = tuple(task.allowed_tools if task.allowed_tools is not None else profile.allowed_tools)
            budget: tuple[str, ...] = ()
            if task.max_budget_usd:  # a routine run's: what is left of the run's USD, not a full run's each
                grant = await self.store.grant_budget(task.id)
                usd = task.max_budget_usd if grant is None else grant["granted"]
                if grant is not None and usd < MIN_GRANT_USD:
                    await self._finish_unspawned(task, "skipped", f"budget: the run spent {grant['spent']:.2f} of "
                                                 f"its {grant['cap']:.2f} USD")
                    return
                budget = ("--max-budget-usd", f"{usd:.4f}")
            content = await self._attachments(task, isolated)
            if isinstance(content, str):
                await self._finish_unspawned(task, "failed", content)
                return
            # a warm process runs in the executor's own CLI config: an adopted conversation (its own) spawns
            warmed = (await self._take_warm(task, workdir, conv.resume, allowed, profile.system_prompt, budget)
                      if conv.substrate is self.substrate else None)
            # else its sandbox, when the threads loop had it started on seeing the message
            ahead = await self._take_ahead(task, workdir, conv, profile.use_mcp) if warmed is None else None
            started_ahead = warmed or ahead
            if started_ahead is not None:
                # its config's credential becomes this task's now (the harness refused it until here)
                mcp_path = started_ahead.mcp_config
                digest = started_ahead.digest
                await asyncio.gather(
                    self.credentials.bind(digest, task_id, session_id) if digest else aio.resolved(None),
                    self.store.open_session(session_id, project_id=task.project_id, role=task.role,
                                            executor=self.lease.name))
            else:
                mcp_path, _ = await asyncio.gather(
                    self.credentials.grant(task_id, session_id) if profile.use_mcp else aio.resolved(None),
                    self.store.open_session(session_id, project_id=task.project_id, role=task.role,
                                            executor=self.lease.name))
            spec = substrate.SpawnSpec(
                role=task.role,
                prompt=task.brief,
                content=content,
                session_uuid=conv.cli_session or str(session_id),
                resume=conv.resume,
                fork_from=conv.fork_from,
                allowed_tools=allowed,
                system_prompt=profile.system_prompt,
                mcp_config=mcp_path,
                json_schema=task.json_schema,
                extra_args=budget,
                stream_input=warmed is not None,
            )
            if warmed is not None:
                proc, cmd, gateway = warmed.proc, warmed.cmd, warmed.gateway
            elif ahead is not None:
                cmd = substrate.build_command(conv.substrate, spec)
                ahead.give(cmd)  # its launcher starts the CLI at once
                proc, gateway = ahead.proc, ahead.gateway
            else:
                cmd = substrate.build_command(conv.substrate, spec)
                try:
                    proc, gateway = await self._launch(task_id, task.project_id, workdir, spec, cmd, conv.substrate)
                except OSError as exc:
                    await self._finish_unspawned(task, "failed", f"could not start {cmd[0]}: {exc}")
                    return
        except BaseException:
            if warmed is not None and proc is None:
                self.warm.give_back(warmed, "start_failed")
            if ahead is not None and proc is None:
                self.ahead.give_back(ahead, "start_failed")
            raise
        finally:
            if proc is None:
                parent_lookup.cancel()  # no process, no task.spawned to hang under anything
        started = time.monotonic()
        r = Running(task_id=task_id, session_id=session_id, project_id=task.project_id, role=task.role,
                    proc=proc, started=started, last_output=started, mcp_config=mcp_path, gateway=gateway,
                    workdir=workdir, cli_session=spec.session_uuid, substrate=conv.substrate,
                    spawn_id=started_ahead.spawn_id if started_ahead is not None else None, chat=task.chat)
        self.runs[task_id] = r
        feeding = asyncio.create_task(self._feed_prompt(proc, substrate.stdin_input(spec)))
        self.children.add(feeding)
        feeding.add_done_callback(self.children.discard)
        parent_id = await self._spawn_parent(parent_lookup, task_id)
        # queued before any line of the task: the single writer keeps that order in the journal
        facts: dict[str, Any] = {
            "pid": proc.pid, "role": task.role, "argv": cmd, "workdir": str(workdir),
            "sandbox": "bwrap" if gateway is not None else "off",
            "attempt": task.attempt, "plan_ref": task.plan_ref,
            "executor": self.lease.name, "executor_epoch": self.lease.epoch}
        if warmed is not None:
            # started ahead of its message (executor/run/warm.py): its PETAL_TASK_ID is the warm spawn's id
            facts["warm"] = {"spawn_id": str(warmed.spawn_id), "waited_s": round(started - warmed.started, 3)}
        elif ahead is not None:
            # its sandbox started as a spare or when its message was seen (executor/run/ahead.py); the CLI only now
            facts["ahead"] = {"spawn_id": str(ahead.spawn_id), "waited_s": round(started - ahead.started, 3),
                              "spare": ahead.spare}
        spawned = self._event(r, "task.spawned", facts, parent_id=parent_id)
        r.spawned_id = spawned.event_id
        await self.writer.put(spawned)
        # the process runs from here on, database or not: the row learns its pid now or once it is back (after
        # task.spawned is queued, so that its round trip is not on the way to the turn's first line)
        await self.save(r, lambda: self.store.set_process(task_id, proc.pid, session_id))
        if task.session_id is not None:  # a thread's turn: the command that continues it in a terminal
            command = substrate.resume_command(conv.substrate, workdir, spec.session_uuid)
            await self.save(r, lambda: self.store.mark_session_cli(session_id, spec.session_uuid, workdir, command))
        child = asyncio.create_task(self._supervise(r, task), name=f"task-{task_id}")
        self.children.add(child)
        child.add_done_callback(self.children.discard)

    async def _launch(self, spawn_id: uuid.UUID, project_id: uuid.UUID | None, workdir: Path,
                      spec: substrate.SpawnSpec, cmd: list[str], sub: substrate.SubstrateConfig,
                      argv_fd: int | None = None) -> tuple[asyncio.subprocess.Process, Gateway | None]:
        """Start the CLI (inside its sandbox, unless the operator turned that off) with the CLI config `sub` (an
        adopted conversation's own); OSError if it cannot be, with nothing of it left behind (its gateway, its
        MCP config and the credential the config holds). With `argv_fd` the sandbox starts ahead of the CLI,
        whose command line it reads from that descriptor (`cmd` names only its program)."""
        env = substrate.build_env(sub, str(spawn_id))
        gateway: Gateway | None = None
        try:
            argv = cmd
            if self.isolation is not None:
                gateway = await self.isolation.open_gateway(spawn_id, project_id)
                # a spare's spec names no conversation: it is linked in when a thread takes it
                argv, env = self.isolation.wrap(gateway, workdir, spec.mcp_config, cmd, env, spawn_id,
                                                spec.session_uuid or None,
                                                substrate_config=sub, fork_from=spec.fork_from, argv_fd=argv_fd)
            # if the executor dies, its workers die with it; SIGTERM, not SIGKILL: the CLI then ends its
            # Bash-tool children itself (they run in their own session, out of reach of a group signal)
            argv, preexec = lifeline.spawn_dying_with_parent(argv, signal.SIGTERM, path=env.get("PATH"))
            proc = await asyncio.create_subprocess_exec(
                *argv,
                # the prompt goes on stdin, never in argv (another process's /proc/<pid>/cmdline)
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=workdir,
                env=env,
                start_new_session=True,
                preexec_fn=preexec,
                pass_fds=(argv_fd,) if argv_fd is not None else (),
            )
        except OSError:
            if gateway is not None and self.isolation is not None:
                await gateway.close()
                self.isolation.forget_spawn(spawn_id)
            if spec.mcp_config is not None:
                spec.mcp_config.unlink(missing_ok=True)
            raise
        return proc, gateway

    # ---- warm turns (executor/run/warm.py) -------------------------------------------------------------

    async def _take_warm(self, task: ClaimedTask, workdir: Path, resume: bool, allowed: tuple[str, ...],
                         system_prompt: str, extra_args: tuple[str, ...] = ()) -> Warm | None:
        """The thread's warm process, when it was started exactly as this turn would be spawned and its
        conversation has not moved on since (it read it at its start); else None (and it is ended)."""
        if task.json_schema is not None or not resume:
            return None
        warmed = self.warm.take(task.session_id)
        if warmed is None:
            return None
        expected = substrate.build_command(self.substrate, substrate.SpawnSpec(
            role=task.role, prompt="", session_uuid=str(task.session_id), resume=True, allowed_tools=allowed,
            system_prompt=system_prompt, mcp_config=warmed.mcp_config, stream_input=True, extra_args=extra_args))
        unchanged = await asyncio.to_thread(substrate.conversation_unchanged, self.substrate, str(task.session_id),
                                            warmed.transcript)
        reason = ("spawn_differs" if expected != warmed.cmd or workdir != warmed.workdir
                  or task.project_id != warmed.project_id else
                  "conversation_moved_on" if not unchanged else None)
        if reason is not None:
            log.info("warm_turn_unused", thread=str(task.session_id), reason=reason)
            self.warm.give_back(warmed, reason)
            return None
        return warmed

    async def spawn_warm(self, template: Template) -> Warm | None:
        """A thread's next turn's process, started now and left waiting on stdin (None if it cannot be)."""
        session = str(template.session_id)
        transcript = await asyncio.to_thread(substrate.session_state, self.substrate, session)
        workdir = Path(template.workdir or self.config.default_workdir)
        if transcript is None or not workdir.is_dir():
            return None  # no conversation to resume yet (a first turn spawns cold), or nowhere to run
        profile = await self.store.role_profile(template.role)
        spawn_id = uuid.uuid4()
        written = self.credentials.write(f"mcp-warm-{spawn_id}.json") if profile.use_mcp else None
        mcp_path, digest = written if written is not None else (None, None)
        spec = substrate.SpawnSpec(
            role=template.role, prompt="", session_uuid=session, resume=True,
            allowed_tools=tuple(template.allowed_tools if template.allowed_tools is not None
                                else profile.allowed_tools),
            system_prompt=profile.system_prompt, mcp_config=mcp_path, stream_input=True)
        cmd = substrate.build_command(self.substrate, spec)
        try:
            proc, gateway = await self._launch(spawn_id, template.project_id, workdir, spec, cmd, self.substrate)
        except OSError as exc:
            log.warning("warm_turn_not_started", thread=session, error=str(exc))
            return None
        log.info("warm_turn_started", thread=session, pid=proc.pid, spawn_id=str(spawn_id))
        await self.writer.put(NewEvent("warm.started", {"pid": proc.pid, "spawn_id": str(spawn_id)},
                                       session_id=template.session_id, project_id=template.project_id))
        return Warm(session_id=template.session_id, spawn_id=spawn_id, proc=proc, spec=spec, cmd=cmd,
                    workdir=workdir, project_id=template.project_id, mcp_config=mcp_path, digest=digest,
                    gateway=gateway, transcript=transcript)

    async def end_warm(self, w: Warm, reason: str) -> None:
        """A warm process no turn will take: its process group ended (SIGTERM, the grace, SIGKILL), its
        config (and the credential in it, never bound to a task) deleted, its sandbox closed."""
        rss = await asyncio.to_thread(process.tree_rss, w.proc.pid) if w.alive else None
        if w.alive:
            if w.gateway is not None and self.isolation is not None:
                process.signal_inside(w.proc.pid, signal.SIGTERM, self.isolation.policy.bwrap)
            else:
                process.signal_group(w.proc.pid, signal.SIGTERM)
            await self._ended_or_killed(w.proc)
        await self._release(w.mcp_config, w.gateway, w.spawn_id)
        log.info("warm_turn_retired", thread=str(w.session_id), reason=reason, rss_bytes=rss)
        await self.writer.put(NewEvent("warm.retired", {
            "pid": w.proc.pid, "spawn_id": str(w.spawn_id), "reason": reason, "rss_bytes": rss,
            "age_s": round(time.monotonic() - w.started, 3), "exit_code": w.proc.returncode},
            session_id=w.session_id, project_id=w.project_id))

    # ---- sandboxes started ahead (executor/run/ahead.py) ----------------------------------------------

    def turn_coming(self, session_id: uuid.UUID, role: str, pinned_to: str | None) -> None:
        """The threads loop is about to queue a turn of this thread: its sandbox is started now, unless a warm
        process waits for the turn already."""
        if session_id not in self.warm.warm:
            self.ahead.turn_coming(session_id, role, pinned_to)

    async def start_ahead(self, session_id: uuid.UUID | None, role: str) -> Ahead | None:
        """A thread's next turn's sandbox (`session_id` None: a spare, for no thread yet), started now with its
        launcher waiting for the command (None when the turn will not spawn as a plain cold spawn here:
        unsandboxed, no stored conversation, an adopted one)."""
        if self.isolation is None:
            return None
        # each wait here is on the way to the sandbox's start, which must come before the turn's claim to pay
        profile, transcript = await asyncio.gather(
            self.store.role_profile(role),
            asyncio.to_thread(substrate.session_state, self.substrate, str(session_id)) if session_id is not None
            else aio.resolved(None))
        if transcript is None and session_id is not None:
            return None  # a first turn: it starts its conversation (cold)
        workdir = self.config.default_workdir
        spawn_id = uuid.uuid4()
        # a spare's config files as before its mounts are made: one replaced later is found when a thread comes
        config_state = self.isolation.config_state() if session_id is None else ()
        written = self.credentials.write(f"mcp-ahead-{spawn_id}.json") if profile.use_mcp else None
        mcp_path, digest = written if written is not None else (None, None)
        spec = substrate.SpawnSpec(role=role, prompt="", session_uuid=str(session_id) if session_id else "",
                                   resume=True, mcp_config=mcp_path)
        program = substrate.build_command(self.substrate, spec)[0]
        read_end, write_end = os.pipe()
        launched: tuple[asyncio.subprocess.Process, Gateway | None] | None = None
        try:
            try:
                launched = await self._launch(spawn_id, None, workdir, spec, [program], self.substrate,
                                              argv_fd=read_end)
            finally:
                os.close(read_end)
            proc, gateway = launched
            assert gateway is not None  # sandboxed
            command, _ = await asyncio.get_running_loop().connect_write_pipe(
                asyncio.Protocol, os.fdopen(write_end, "wb", buffering=0))
        except BaseException as exc:
            # nothing of it is left: its process (an end of file for its launcher, then a kill), its gateway,
            # its config (_launch removes what it made itself when the start fails)
            with contextlib.suppress(OSError):
                os.close(write_end)
            if launched is not None:
                process.signal_group(launched[0].pid, signal.SIGKILL)
                await asyncio.shield(self._reap_unstarted(launched[0], launched[1], spawn_id))
            if mcp_path is not None:
                mcp_path.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                log.warning("ahead_not_started", thread=str(session_id), error=str(exc))
                return None
            raise
        return Ahead(session_id=session_id, role=role, spawn_id=spawn_id, proc=proc, command=command,
                     program=program, workdir=workdir, mcp_config=mcp_path, digest=digest, gateway=gateway,
                     transcript=transcript, spare=session_id is None, config_state=config_state)

    async def link_spare(self, spare: Ahead, session_id: uuid.UUID) -> Ahead | None:
        """A spare sandbox as the thread's: its conversation linked in (None when it cannot go into a spare).
        Its state is read before the link: a conversation replaced in between is found moved on when taken.
        SpareStale: a config file it shows was replaced since it started."""
        isolation = self.isolation
        assert isolation is not None  # spares are sandboxes
        session = str(session_id)

        def link() -> tuple[int, int] | None:
            if isolation.config_state() != spare.config_state:
                raise SpareStale(f"a CLI config file was replaced since spare {spare.spawn_id} started")
            state = substrate.session_state(self.substrate, session)
            return state if state is not None and isolation.link_conversation(
                spare.workdir, session, spare.spawn_id) else None

        transcript = await asyncio.to_thread(link)
        return None if transcript is None else replace(spare, session_id=session_id, transcript=transcript)

    async def _reap_unstarted(self, proc: asyncio.subprocess.Process, gateway: Gateway | None,
                              spawn_id: uuid.UUID) -> None:
        await proc.wait()
        await self._release(None, gateway, spawn_id)

    async def _ended_or_killed(self, proc: asyncio.subprocess.Process) -> None:
        """Until a process told to end has, or the grace is over and its group is killed."""
        try:
            await asyncio.wait_for(proc.wait(), self.config.stop_grace_s)
        except TimeoutError:
            process.signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()

    async def _release(self, mcp_config: Path | None, gateway: Gateway | None, spawn_id: uuid.UUID) -> None:
        """What a spawn no run took leaves: its config (and the credential in it), its sandbox's gateway and
        private conversation directory."""
        if mcp_config is not None:
            mcp_config.unlink(missing_ok=True)
        if gateway is not None and self.isolation is not None:
            await gateway.close()
            await asyncio.to_thread(self.isolation.drop_cgroup, spawn_id)
            self.isolation.forget_spawn(spawn_id)

    async def end_ahead(self, ahead: Ahead, reason: str) -> None:
        """A sandbox no turn will take: its launcher told there is no command (an end of file), so the sandbox
        ends; ended by signal after the grace; its config (and the credential in it, never bound) deleted."""
        ahead.command.close()
        await self._ended_or_killed(ahead.proc)
        await self._release(ahead.mcp_config, ahead.gateway, ahead.spawn_id)
        log.info("ahead_retired", thread=str(ahead.session_id), reason=reason, spawn_id=str(ahead.spawn_id))

    async def _take_ahead(self, task: ClaimedTask, workdir: Path, conv: Conversation,
                          mcp_wanted: bool) -> Ahead | None:
        """The thread's sandbox started ahead, when this turn spawns as it was started for and its conversation
        has not moved on since (it linked the stored one at its start); else None (and it is ended)."""
        if task.json_schema is not None or not conv.resume or conv.substrate is not self.substrate:
            return None
        ahead = await self.ahead.take(task.session_id)
        if ahead is None:
            return None
        try:  # the turn's from here: ended if anything cuts this short
            transcript = await asyncio.to_thread(substrate.session_state, self.substrate, str(task.session_id))
        except BaseException:
            self.ahead.give_back(ahead, "start_cut_short")
            raise
        # a spawn has an MCP config when its role uses the harness and the executor serves it
        mcp_wanted = mcp_wanted and bool(self.credentials.mcp_url)
        reason = ("spawn_differs" if workdir != ahead.workdir or task.project_id is not None or conv.fork_from
                  or task.role != ahead.role or mcp_wanted != (ahead.mcp_config is not None) else
                  "conversation_moved_on" if transcript != ahead.transcript else None)
        if reason is not None:
            log.info("ahead_unused", thread=str(task.session_id), reason=reason)
            self.ahead.give_back(ahead, reason)
            return None
        return ahead

    @staticmethod
    async def _feed_prompt(proc: asyncio.subprocess.Process, prompt: bytes) -> None:
        """The brief on the process's stdin, then end of input (`claude -p` reads its prompt from there)."""
        assert proc.stdin is not None
        try:
            proc.stdin.write(prompt)
            await proc.stdin.drain()
            proc.stdin.close()
            await proc.stdin.wait_closed()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it died before reading: its exit says why

    async def _attachments(self, task: ClaimedTask, worktree: Path | None) -> tuple[dict[str, Any], ...] | str:
        """The files the user sent, handed over: written into a project worker's worktree (its brief names
        them), else content blocks of its user message; or why they could not be placed."""
        if not task.attachment_ids:
            return ()
        files = await self.store.attachments(task.attachment_ids)
        if worktree is not None:
            try:
                await asyncio.to_thread(user_input.place_in_worktree, worktree, files)
            except OSError as exc:
                return f"could not place the files the user sent in the worktree: {exc}"
            return ()
        # up to 20 MiB to base64-encode: off the event loop, which reads every running task's output
        return tuple(await asyncio.to_thread(user_input.content_blocks, task.brief, files))

    async def _worktree(self, task: ClaimedTask) -> Path | str | None:
        """A worker of a project runs in a git worktree of its own, never in the project's checkout: its path,
        None for any other task, or why it could not be made."""
        try:
            return await projects.prepare_worktree(self.store.pool, self.writer, task.id, self.config.worktree_root)
        except (worktrees.GitError, OSError) as exc:
            return f"could not make the worker's git worktree: {exc}"

    @staticmethod
    async def _spawn_parent(lookup: asyncio.Future[uuid.UUID | None], task_id: uuid.UUID) -> uuid.UUID | None:
        """The looked-up parent of a run's task.spawned; the process runs already, so a failed lookup costs
        the tree one link, never the run."""
        try:
            return await lookup
        except Exception:  # noqa: BLE001 - see above
            log.exception("spawn_parent_failed", task_id=str(task_id))
            return None

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
            await self.set_activity(r, "running")

    async def _read_stdout(self, r: Running) -> None:
        assert r.proc.stdout is not None
        task_id, session_id, project_id = r.task_id, r.session_id, r.project_id
        async for chunk in process.iter_line_chunks(r.proc.stdout):
            events = []
            read_at = _now()
            for raw, event_id in zip(chunk, journal.new_event_ids(len(chunk))):
                if not raw.strip():
                    continue
                line = stream.classify(raw)
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

    async def _supervise(self, r: Running, task: ClaimedTask) -> None:
        readers = [asyncio.create_task(self._read_stdout(r)), asyncio.create_task(self._read_stderr(r))]
        try:
            rc = await self._until_exit(r)
            if r.gateway is not None and self.isolation is not None:
                await r.gateway.close()
                assert r.workdir is not None
                self.isolation.keep_session(r.workdir, r.cli_session or str(r.session_id), r.spawn_key,
                                            substrate_config=r.substrate)
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
        await self.writer.put(self._event(r, "task.signal_sent", {"signal": "SIGKILL", "reason": hit,
                                                                  "delivered": sent}))

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
        await self.writer.write([self._event(r, "task.exited", payload, parent_id=r.spawned_id)])
        await self._finish_task(r.task_id, TaskEnd(
            outcome.status, reason, rc if rc >= 0 else None, -rc if rc < 0 else None, r.last_output_at))
        await self.store.end_session(r.session_id, "idle" if task.session_id else "ended",
                                     r.facts.substrate_session_id)
        if task.session_id is not None and task.json_schema is None:
            self.warm.turn_ended(task.session_id)  # its conversation is stored: the next turn can start now
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
        await self.writer.put(self._event(r, "task.signal_sent", {"signal": "SIGTERM", "reason": r.stop_reason,
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
        await self.writer.put(self._event(r, "task.signal_sent", {"signal": "SIGKILL", "reason": "grace_expired",
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
