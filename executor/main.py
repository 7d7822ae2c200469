"""The executor: the supervisor, its journal writer, its LISTEN connection, the harness MCP server and the
loops beside them (settler, threads, projects, notifier, gate rules), run by `serve(config, stop)`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config

from executor import harness as harness_mcp
from executor import gates
from executor.harness.scope import DispatchLimits
from executor.journal.writer import HOLD_BYTES as JOURNAL_HOLD_BYTES
from executor.journal.writer import STOP_FLUSH_TIMEOUT_S, JournalWriter
from executor.notify import notifier as notify
from executor.notify.duty import Duty
from executor.projects import service as projects
from executor.routines import Routines, RoutinesConfig
from executor.run.substrate import SubstrateConfig, config_home, handback_cli
from executor.run.supervisor import STOP_DRAIN_S, Supervisor, SupervisorConfig
from executor.sandbox import scratch
from executor.sessions import adopt as claude_sessions
from executor.sessions.index import Index as SessionIndex
from executor.sessions.index import SessionsConfig
from executor.settle import threads
from executor.settle.settler import Settler, SettlerConfig
from executor.terminals.held import END_GRACE_S
from executor.terminals.server import Terminals, TerminalsConfig
from shared import aio, errors, logs
from shared.database import Database

log = logs.get(__name__)

# Channels the executor listens on. Each carries an id; readers re-read the tables (but an asking tool takes
# how its question closed from `question_closed`, executor/asks/).
CHANNELS = ["task_pending", "stop_queue", "question_answered", "chat_queue", "thread_control_queue", "journal",
            "notify_queue", "task_ended", "project_queue",
            "gate_rule_queue", "routine_queue", "routines", "question_closed", "question_settle"]
# At shutdown, how long the settler may act on the ends the stop itself caused (the next start does the rest).
FINAL_SETTLE_TIMEOUT_S = 10
MCP_STOP_TIMEOUT_S = 10
POOL_CLOSE_S = 5  # psycopg_pool's close waits this long for connections in use
# The executor's loops wait this long for a pooled connection before counting the database as away.
ACQUIRE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ExecutorConfig:
    """What the executor runs on; the application builds it from the settings (petal_dispatch/executor_wiring.py)."""

    dsn: str = field(repr=False)  # the executor role's; it may carry a password
    substrate: SubstrateConfig = field(repr=False)  # its base environment holds this process's secrets
    supervisor: SupervisorConfig
    mcp_host: str = "127.0.0.1"
    mcp_port: int = 8002
    ask_timeout_s: float = 300.0
    settler: SettlerConfig = field(default_factory=SettlerConfig)
    notify: notify.NotifyConfig = field(default_factory=notify.NotifyConfig)
    # a project's workdir must lie under one of these (empty: the service user's home)
    project_roots: tuple[Path, ...] = ()
    journal_hold_bytes: int = JOURNAL_HOLD_BYTES
    # the CLI's stored conversations this executor lists and lets threads continue
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    routines: RoutinesConfig = field(default_factory=RoutinesConfig)
    # how deep workers may dispatch workers, and how many one task may ask for
    dispatch_limits: DispatchLimits = field(default_factory=DispatchLimits)
    # what no worker may write: no project's repository (nor an adopted conversation's directory) may contain it or
    # lie inside it (shared/protected.py)
    protected: tuple[tuple[str, Path], ...] = ()
    # the link `petal-dispatch claude` started anywhere finds this executor's terminal socket by (None: none)
    terminal_pointer: Path | None = None


def stop_within_s(config: ExecutorConfig) -> float:
    """How long an orderly stop may take (petal_dispatch/signals.py ends one that takes longer): the bound of each of
    its slow steps, in the order they run, and a margin for the quick ones. 110 s with the defaults; a stop
    normally takes a few seconds."""
    s = config.supervisor
    return sum([
        s.stop_grace_s,  # the warm turns' processes, together
        s.stop_grace_s,  # the sandboxes started ahead, together
        s.stop_grace_s + s.drain_timeout_s + 5,  # the runs' children, their ends journaled
        STOP_DRAIN_S,  # what the runs queued, written
        FINAL_SETTLE_TIMEOUT_S,
        2 * END_GRACE_S,  # the terminal sessions: SIGHUP, SIGTERM, then SIGKILL
        MCP_STOP_TIMEOUT_S,
        STOP_FLUSH_TIMEOUT_S,  # the journal writer's last flush
        POOL_CLOSE_S,
        15,
    ])


async def serve(config: ExecutorConfig, stop: asyncio.Event) -> None:
    """Run until `stop` is set or a loop ends on its own (a crash: raised here once everything is down).

    Resources are entered on one exit stack and every long-lived loop runs in one task group, each loop's
    stop pushed right after it starts: leaving unwinds in reverse, whether after a stop, a crashed loop or
    a failed start. So the supervisor stops its children first (the MCP server and the listener still
    serve them), then the settler settles what that caused, the other loops end, the MCP server stops,
    the listener goes, and the journal writer flushes last."""
    loops = _Loops(stop)
    async with contextlib.AsyncExitStack() as stack:
        # started during an outage, it waits for the database instead of exiting
        db = await stack.enter_async_context(Database(
            config.dsn, name="petal-executor", acquire_timeout_s=ACQUIRE_TIMEOUT_S, at_start="wait", stop=stop,
            guard_seqs=True))
        if stop.is_set():  # stopped while waiting for the database
            return
        writer = JournalWriter(db.pool, spill_dir=config.supervisor.run_dir, hold_bytes=config.journal_hold_bytes)
        await writer.start()
        stack.push_async_callback(writer.flush_and_stop)

        # the socket directories of executors killed before they could remove them (executor/sandbox/scratch.py)
        await asyncio.to_thread(scratch.sweep)
        # what can fail is made before any loop starts: a failed start unwinds only the above
        listener = db.listener(CHANNELS)
        wake = listener.subscribe(["task_pending", "stop_queue"])
        harness = harness_mcp.Harness(db, writer, listener, config.ask_timeout_s,
                                      dispatch_limits=config.dispatch_limits)
        mcp_stop = asyncio.Event()
        mcp_config = Config()
        mcp_config.bind = [f"{config.mcp_host}:{config.mcp_port}"]
        mcp_config.accesslog = None
        mcp_config.errorlog = logs.foreign("hypercorn.error")  # in the log style of every other line
        mcp_config.graceful_timeout = 2.0
        mcp_app = harness_mcp.asgi_app(harness_mcp.build(harness), config.mcp_host)
        supervisor = Supervisor(db, writer, config.substrate, config.supervisor)
        supervisor.on_credential_revoked = harness.forget
        sessions = _session_index(config, db)
        # the user's interactive sessions held here (`petal-dispatch claude`): the page's messages to their threads
        # are typed into them, and "end session" ends them
        terminals = Terminals(db.pool, _terminals_config(config), harness.asks, supervisor.runner.credentials,
                              supervisor.runner.isolation, config.substrate)
        supervisor.interrupt = terminals.interrupt
        conversations = threads.Threads(db.pool, writer, sessions, turn_coming=supervisor.runner.spawner.turn_coming,
                                        terminals=(terminals.deliver, terminals.end))
        # every end is acted on from the store (extraction, the policy, the thread's turn boundary)
        settler = Settler(db.pool, config.settler, conversations.wake)
        # a push runs in the spawns' sandbox (the runner's Isolation; None when the operator turned it off)
        repos = projects.Projects(db.pool, writer,
                                  projects.ProjectsConfig(config.project_roots, config.supervisor.keep_worktrees,
                                                          config.protected), sandboxes=supervisor.runner.isolation)
        name = config.supervisor.name
        notifier = notify.Notifier(db.pool, config.notify, Duty(db.dsn, notify.NOTIFIER_DUTY, name),
                                   name=name)
        await db.availability.retry(notifier.start, "notifier")
        settle_sub = listener.subscribe(["task_ended", "question_settle"])
        thread_sub = listener.subscribe(["chat_queue", "thread_control_queue"])
        project_sub = listener.subscribe(["project_queue"])
        notify_sub = listener.subscribe(["journal", "notify_queue"], keep=notify.wants)
        rule_sub = listener.subscribe(["gate_rule_queue"])
        sessions_sub = listener.subscribe(["task_ended"])
        routine_sub = listener.subscribe(["routine_queue", "routines"])
        routine_end_sub = listener.subscribe(["task_ended"])

        # a live namesake is refused before any loop runs: none of them may act under another's name
        await db.availability.retry(supervisor.lease.join, "lease")
        stack.push_async_callback(supervisor.lease.leave)  # a failed start frees the name; a second leave is a no-op

        # the loops: each one's stop is pushed as it starts, so they stop in the reverse order
        group = await stack.enter_async_context(asyncio.TaskGroup())
        listening = loops.start(group, "listener", listener.run())
        stack.push_async_callback(_cancel, listening)
        with contextlib.suppress(TimeoutError):  # an outage right now: the listener goes on trying
            await asyncio.wait_for(listener.connected.wait(), 30)
        # hypercorn types the app with its own ASGI scope TypedDicts, starlette with a plain mapping
        serving_mcp = loops.start(group, "harness-mcp", hypercorn_serve(
            mcp_app, mcp_config, shutdown_trigger=mcp_stop.wait))  # type: ignore[arg-type]
        stack.push_async_callback(_stop_mcp, mcp_stop, serving_mcp)
        # before the supervisor stops (a session's end is written while the database and the MCP server serve)
        await db.availability.retry(terminals.start, "terminals")
        stack.push_async_callback(terminals.stop)
        # each is one consume() loop (shared/consume.py): it waits out an outage and outlives a pass's error
        side = [
            loops.start(group, "threads", conversations.run(thread_sub)),
            loops.start(group, "projects", repos.run(project_sub)),
            loops.start(group, "notifier", notifier.run(notify_sub)),
            loops.start(group, "gate-rules", gates.run_rule_queue(db.pool, writer, rule_sub)),
            loops.start(group, "claude-sessions", claude_sessions.run(sessions, sessions_sub)),
            loops.start(group, "routines", Routines(db.pool, config.routines).run(routine_sub, routine_end_sub)),
        ]
        stack.push_async_callback(_cancel, *side)
        settling = loops.start(group, "settler", settler.run(settle_sub))
        stack.push_async_callback(_settle_last, settling, settler)
        supervising = loops.start(group, "supervisor", supervisor.run(wake))
        stack.push_async_callback(_stop_supervisor, supervisor, supervising)
        stack.callback(loops.close)  # from here on a loop that returns was stopped

        # what start-up built lives as long as the process: out of the collector's sweeps, so a flood of
        # workers' lines does not pay for walking it in every full collection
        gc.freeze()
        await stop.wait()
    loops.raise_crash()


def _terminals_config(config: ExecutorConfig) -> TerminalsConfig:
    return TerminalsConfig(config.supervisor.name, config.supervisor.run_dir, config.substrate.claude_bin,
                           config.project_roots, cli=handback_cli(config.substrate), pointer=config.terminal_pointer)


def _session_index(config: ExecutorConfig, db: Database) -> SessionIndex:
    """The index of the CLI conversations in the configured directories (default: the service user's
    ~/.claude) and in the executor's own config directory."""
    home_claude = Path(config.substrate.base_env.get("HOME") or Path.home()) / ".claude"
    dirs = tuple(dict.fromkeys([*(config.sessions.dirs or (home_claude,)), config_home(config.substrate)]))
    return SessionIndex(db.pool, config.supervisor.name, dirs, config.project_roots, home_claude,
                        config.sessions.poll_s, protected=config.protected, cli=handback_cli(config.substrate))


class _Loops:
    """The executor's long-lived loops: one that ends before `stop` (a crash, or an unexpected return)
    is logged and sets `stop`, so the executor comes down in order and `serve` raises its error."""

    def __init__(self, stop: asyncio.Event):
        self.stop = stop
        self.closing = False
        self.crashes: list[BaseException] = []

    def close(self) -> None:
        self.closing = True

    def start(self, group: asyncio.TaskGroup, name: str, loop: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return group.create_task(self._watched(name, loop), name=name)

    async def _watched(self, name: str, loop: Coroutine[Any, Any, None]) -> None:
        try:
            await loop
        except Exception as exc:  # noqa: BLE001 - said here, raised by serve once everything is down
            if isinstance(exc, errors.PetalError):  # a refusal that says what is wrong (another executor...)
                log.error("executor_loop_refused", loop=name, error=str(exc))
            else:
                log.exception("executor_loop_crashed", loop=name)
            self.crashes.append(exc)
            self.stop.set()
            return
        if not self.stop.is_set() and not self.closing:
            log.error("executor_loop_ended", loop=name)
            self.crashes.append(LoopEnded(f"the executor's {name} loop ended on its own"))
            self.stop.set()

    def raise_crash(self) -> None:
        if self.crashes:
            raise self.crashes[0]


class LoopEnded(RuntimeError):
    """One of the executor's long-lived loops returned although nobody stopped it."""


async def _cancel(*tasks: asyncio.Task[None]) -> None:
    await aio.cancel_and_wait(*tasks)  # a crash is _Loops' to raise


async def _stop_mcp(mcp_stop: asyncio.Event, serving: asyncio.Task[None]) -> None:
    mcp_stop.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(serving, MCP_STOP_TIMEOUT_S)


async def _settle_last(settling: asyncio.Task[None], settler: Settler) -> None:
    await _cancel(settling)
    # the ends the stop itself caused; whatever is left is settled by the next start
    with contextlib.suppress(Exception):
        await asyncio.wait_for(settler.settle_pending(), FINAL_SETTLE_TIMEOUT_S)


async def _stop_supervisor(supervisor: Supervisor, supervising: asyncio.Task[None]) -> None:
    supervisor.stop()  # it stops its children and journals their ends before it returns
    await asyncio.gather(supervising, return_exceptions=True)  # a crash is _Loops' to raise


