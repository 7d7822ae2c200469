"""`petal-dispatch executor`: the supervisor, its journal writer, its LISTEN connection, the harness MCP
server and the loops beside them (settler, threads, projects, notifier, gate rules), as one process."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import os
import signal
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config

from executor import harness as harness_mcp
from executor.gates import rules as gate_rules
from executor.journal.writer import HOLD_BYTES as JOURNAL_HOLD_BYTES
from executor.journal.writer import JournalWriter
from executor.notify import notifier as notify
from executor.notify.duty import Duty
from executor.projects import service as projects
from executor.run import fleet
from executor.run.substrate import SubstrateConfig
from executor.run.supervisor import Supervisor, SupervisorConfig
from executor.sandbox.bwrap import SandboxPolicy, install_root
from executor.sandbox.gateway import parse_allowlist
from executor.settle import threads
from executor.settle.settler import Settler, SettlerConfig
from shared import database, datalock, dbserver, errors, logs, ports
from shared.database import Database
from shared.settings import Settings

log = logs.get(__name__)

# Channels the executor listens on. Each carries an id; readers re-read the tables.
CHANNELS = ["task_pending", "stop_queue", "question_answered", "chat_queue", "thread_control_queue", "journal",
            "notify_queue", "task_changed", "project_queue",
            "gate_rule_queue"]
# At shutdown, how long the settler may act on the ends the stop itself caused (the next start does the rest).
FINAL_SETTLE_TIMEOUT_S = 10
# The per-spawn MCP config's timeout sits this far above the ask timeout, so the CLI never cuts an ask short.
MCP_TIMEOUT_MARGIN_S = 120
# The executor's loops wait this long for a pooled connection before counting the database as away.
ACQUIRE_TIMEOUT_S = 5.0


def substrate_config(settings: Settings, env: Mapping[str, str]) -> SubstrateConfig:
    return SubstrateConfig(
        claude_bin=settings.claude_bin,
        config_dir=settings.claude_config_dir,
        base_env=dict(env),
        max_retries=settings.claude_max_retries,
        api_timeout_ms=settings.claude_api_timeout_ms,
        byte_stream_idle_timeout_ms=settings.claude_stream_idle_timeout_ms,
    )


def sandbox_policy(settings: Settings, env: Mapping[str, str]) -> SandboxPolicy | None:
    """Every spawn's sandbox, or None on the operator's explicit PETAL_SANDBOX=off (logged). Fails closed:
    SandboxUnavailable, naming the cause and the fix, where the sandbox cannot run."""
    if settings.sandbox == "off":
        log.warning("sandbox_off", detail="PETAL_SANDBOX=off: workers run unsandboxed, as this service's user, "
                    "and reach what it reaches")
        return None
    data_dir = settings.data_dir.resolve()
    # the data directory, the home, and every project's checkout: a spawn sees its own tree, not another's
    hidden = [data_dir, Path(env.get("HOME") or Path.home()), *settings.project_root_paths]
    if settings.worktree_dir is not None:
        hidden.append(settings.worktree_dir.resolve())
    allow = [a for a in settings.sandbox_allow.split(",") if a.strip()]
    try:
        parse_allowlist(allow)
    except ValueError as exc:
        raise errors.ConfigError(f"PETAL_SANDBOX_ALLOW: {exc}") from None
    # the CLI's install stays visible where it lies in a hidden home (a cache under ~/.cache)
    exposed = [root for root in (install_root(settings.claude_bin, env.get("PATH")),) if root is not None]
    return SandboxPolicy.find(hidden=hidden, allow=allow, exposed=exposed, path=env.get("PATH"))


def supervisor_config(settings: Settings, sandbox: SandboxPolicy | None = None) -> SupervisorConfig:
    return SupervisorConfig(
        sandbox=sandbox,
        mcp_url=f"http://{settings.mcp_host}:{settings.mcp_port}{harness_mcp.PATH}",
        mcp_timeout_ms=int((settings.ask_timeout_s + MCP_TIMEOUT_MARGIN_S) * 1000),
        max_workers=settings.max_workers,
        stall_timeout_s=settings.stall_timeout_s,
        stop_grace_s=settings.stop_grace_s,
        max_runtime_s=settings.max_runtime_s,
        default_workdir=settings.workdir,
        run_dir=settings.data_dir.resolve() / "run",
        worktree_dir=settings.worktree_dir,
        keep_worktrees=settings.keep_worktrees,
        name=settings.executor_name or fleet.default_name(),
        labels=fleet.parse_labels(settings.executor_labels),
        lease_s=settings.lease_s,
        shared_claude_config=settings.shared_claude_config,
    )


def notify_config(settings: Settings) -> notify.NotifyConfig:
    return notify.NotifyConfig(
        data_dir=settings.data_dir.resolve(), vapid_private_key=settings.vapid_private_key,
        vapid_subject=settings.vapid_subject, ntfy_url=settings.ntfy_url, ntfy_token=settings.ntfy_token,
        public_url=settings.public_url, rate_limit_s=settings.notify_rate_limit_s,
        allow_loopback_push=settings.push_allow_loopback)


async def serve(dsn: str, substrate: SubstrateConfig, config: SupervisorConfig, stop: asyncio.Event, *,
                mcp_host: str = "127.0.0.1", mcp_port: int = 8002, ask_timeout_s: float = 300.0,
                extract: bool = True, backoff_base_s: float = 30.0,
                notify_config: notify.NotifyConfig | None = None,
                project_roots: tuple[Path, ...] = (),
                journal_hold_bytes: int = JOURNAL_HOLD_BYTES) -> None:
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
            dsn, name="petal-executor", acquire_timeout_s=ACQUIRE_TIMEOUT_S, at_start="wait", stop=stop))
        if stop.is_set():  # stopped while waiting for the database
            return
        writer = JournalWriter(db.pool, spill_dir=config.run_dir, hold_bytes=journal_hold_bytes)
        await writer.start()
        stack.push_async_callback(writer.flush_and_stop)

        # what can fail is made before any loop starts: a failed start unwinds only the above
        listener = db.listener(CHANNELS)
        wake = listener.subscribe(["task_pending", "stop_queue"])
        harness = harness_mcp.Harness(db, writer, listener, ask_timeout_s)
        mcp_stop = asyncio.Event()
        mcp_config = Config()
        mcp_config.bind = [f"{mcp_host}:{mcp_port}"]
        mcp_config.accesslog = None
        mcp_config.errorlog = logs.foreign("hypercorn.error")  # in the log style of every other line
        mcp_config.graceful_timeout = 2.0
        mcp_app = harness_mcp.asgi_app(harness_mcp.build(harness), mcp_host)
        supervisor = Supervisor(db, writer, substrate, config)
        supervisor.on_credential_revoked = harness.forget
        conversations = threads.Threads(db.pool, writer)
        # every end is acted on from the store (extraction, the policy, the thread's turn boundary)
        settler = Settler(db.pool, SettlerConfig(extract=extract, backoff_base_s=backoff_base_s,
                                                 keep_worktrees=config.keep_worktrees), conversations.wake)
        repos = projects.Projects(db.pool, writer, projects.ProjectsConfig(project_roots, config.keep_worktrees))
        notifier = notify.Notifier(db.pool, notify_config or notify.NotifyConfig(),
                                   Duty(dsn, notify.NOTIFIER_DUTY, config.name), name=config.name)
        await db.availability.retry(notifier.start, "notifier")
        settle_sub = listener.subscribe(["task_changed", "question_answered"])
        thread_sub = listener.subscribe(["chat_queue", "thread_control_queue"])
        project_sub = listener.subscribe(["project_queue"])
        notify_sub = listener.subscribe(["journal", "notify_queue"])
        rule_sub = listener.subscribe(["gate_rule_queue"])

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
        # each is one consume() loop (shared/consume.py): it waits out an outage and outlives a pass's error
        side = [
            loops.start(group, "threads", conversations.run(thread_sub)),
            loops.start(group, "projects", repos.run(project_sub)),
            loops.start(group, "notifier", notifier.run(notify_sub)),
            loops.start(group, "gate-rules", gate_rules.run_rule_queue(db.pool, writer, rule_sub)),
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
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _stop_mcp(mcp_stop: asyncio.Event, serving: asyncio.Task[None]) -> None:
    mcp_stop.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(serving, 10)


async def _settle_last(settling: asyncio.Task[None], settler: Settler) -> None:
    await _cancel(settling)
    # the ends the stop itself caused; whatever is left is settled by the next start
    with contextlib.suppress(Exception):
        await asyncio.wait_for(settler.settle_pending(), FINAL_SETTLE_TIMEOUT_S)


async def _stop_supervisor(supervisor: Supervisor, supervising: asyncio.Task[None]) -> None:
    supervisor.stop()  # it stops its children and journals their ends before it returns
    await asyncio.gather(supervising, return_exceptions=True)  # a crash is _Loops' to raise


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(settings: Settings) -> None:
    """The harness MCP lets its caller dispatch workers that run Bash: it stays on loopback unless forced."""
    if not is_loopback(settings.mcp_host) and not settings.mcp_force_bind:
        raise errors.ConfigError(
            f"refusing to serve the harness MCP on PETAL_MCP_HOST={settings.mcp_host}: it must be a loopback "
            "address (127.0.0.1) unless PETAL_MCP_FORCE_BIND=1 says the network itself is trusted")


def main(settings: Settings) -> int:
    check_bind(settings)
    policy = sandbox_policy(settings, os.environ)  # before anything starts: no unsandboxed spawn, ever
    dbserver.check_data_dir(settings)  # its run files and keys live there, whichever database it uses
    # one executor per data directory (`up` runs its own under this lock): a second is refused at once,
    # naming the holder, before it binds a port or writes anything
    held = datalock.acquire(settings, datalock.EXECUTOR)
    try:
        ports.check_free(settings.mcp_host, settings.mcp_port, "harness MCP server")
        return _run(settings, policy)
    finally:
        held.release()


def _run(settings: Settings, policy: SandboxPolicy | None) -> int:
    info = dbserver.resolve(settings)
    database.wait_for_schema(info.executor_dsn, "petal-executor")  # started during an outage: it waits

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(info.executor_dsn, substrate_config(settings, os.environ), supervisor_config(settings, policy), stop,
                    mcp_host=settings.mcp_host, mcp_port=settings.mcp_port, ask_timeout_s=settings.ask_timeout_s,
                    backoff_base_s=settings.backoff_base_s, notify_config=notify_config(settings),
                    project_roots=settings.project_root_paths, journal_hold_bytes=settings.journal_hold_bytes)

    asyncio.run(run())
    log.info("executor_stopped")
    return 0
