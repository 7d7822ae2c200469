"""Running the real executor pieces against the real CLI and the scripted model, for tests."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from executor.harness.scope import DispatchLimits
from executor.journal.writer import JournalWriter
from executor.main import ExecutorConfig, serve
from executor.notify.notifier import NotifyConfig
from executor.routines import RoutinesConfig
from executor.run.substrate import SubstrateConfig
from executor.run.supervisor import Supervisor, SupervisorConfig
from executor.run.spawn.warm_pool import WarmConfig
from executor.sandbox.bwrap import SandboxPolicy, install_root
from executor.settle import dispatch
from executor.settle.settler import SettlerConfig
from petal_dispatch import cli_install
from petal_dispatch.demo.scripted_model import ScriptedModelServer
from shared.database import Database
from shared.models import FINAL_STATUSES, Event
from tests.pg import DB
from tests.served import free_port
from tests.wait import until

FINAL = set(FINAL_STATUSES)


def worker(brief: str, **kw: Any) -> dispatch.TaskRequest:
    """A worker's request as the harness's dispatch_worker asks it (`allowed_tools`, `labels` as lists)."""
    for key in ("allowed_tools", "labels"):
        if kw.get(key) is not None:
            kw[key] = tuple(kw[key])
    return dispatch.TaskRequest("worker", brief, project_workdir=True, **kw)


def claude_bin() -> str:
    configured = os.environ.get("PETAL_CLAUDE_BIN")
    if configured:
        return configured
    return _installed(os.environ.get("PETAL_CLAUDE_VERSION") or cli_install.CLAUDE_CODE_VERSION)


@functools.cache
def _installed(version: str) -> str:
    """The cached CLI of a version or tag (PETAL_CLAUDE_VERSION=latest asks npm once per session)."""
    exact = cli_install.resolve(version)
    found = cli_install.installed_bin(cli_install.default_prefix(exact))
    if found is None:
        raise RuntimeError(f"the claude CLI {exact} is missing: run `petal-dispatch install-claude` "
                           "(or bash .ci/run) with the same PETAL_CLAUDE_VERSION")
    return str(found)


def claude_env(model: ScriptedModelServer, home: Path) -> dict[str, str]:
    """The CLI's environment in tests: the scripted model, a fake key, a throwaway HOME and config dir."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": model.url,
        "ANTHROPIC_API_KEY": "sk-ant-fake",
        "NO_PROXY": "127.0.0.1,localhost",
    }


def substrate_for(model: ScriptedModelServer, tmp: Path, **kw: Any) -> SubstrateConfig:
    return SubstrateConfig(
        claude_bin=claude_bin(),
        config_dir=tmp / "claude-config",
        base_env=claude_env(model, tmp / "home"),
        max_retries=kw.pop("max_retries", 0),
        api_timeout_ms=kw.pop("api_timeout_ms", 20_000),
        **kw,
    )


@dataclass
class Harness:
    db: Database
    supervisor: Supervisor
    writer: JournalWriter
    admin_dsn: str
    mcp_url: str | None = None
    _reader: psycopg.AsyncConnection | None = None

    async def _conn(self) -> psycopg.AsyncConnection:
        # one reading connection for the test's polls (a new connection per poll forks a backend)
        if self._reader is None or self._reader.closed:
            self._reader = await psycopg.AsyncConnection.connect(self.admin_dsn, autocommit=True)
        return self._reader

    async def close(self) -> None:
        if self._reader is not None:
            await self._reader.close()

    async def dispatch(self, brief: str, **kw: Any) -> uuid.UUID:
        if "workdir" not in kw and self.supervisor is not None:
            kw["workdir"] = self.supervisor.config.default_workdir
        return await dispatch.request(self.db.pool, worker(brief, **kw))

    async def statuses(self, task_ids: list[uuid.UUID]) -> list[str]:
        """The tasks' statuses read in one statement: one snapshot (row by row, one could end and another start
        between the reads)."""
        async with (await self._conn()).cursor() as cur:
            await cur.execute("SELECT status FROM tasks WHERE id = ANY(%s) ORDER BY id", [task_ids])
            return [status for (status,) in await cur.fetchall()]

    async def task(self, task_id: uuid.UUID) -> dict[str, Any]:
        async with (await self._conn()).cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT * FROM tasks WHERE id = %s", [task_id])
            row = await cur.fetchone()
        assert row is not None
        return row

    async def wait_task(self, task_id: uuid.UUID, predicate: Callable[[dict[str, Any]], bool],
                        timeout: float = 60) -> dict[str, Any]:
        last: dict[str, Any] = {}

        async def reached() -> dict[str, Any] | None:
            nonlocal last
            last = await self.task(task_id)
            return last if predicate(last) else None

        return await until(reached, lambda: f"task {task_id} to reach the condition; last row: {last}", timeout,
                           every=0.05)

    async def wait_final(self, task_id: uuid.UUID, timeout: float = 90) -> dict[str, Any]:
        return await self.wait_task(task_id, lambda r: r["status"] in FINAL, timeout)

    async def turns(self) -> list[dict[str, Any]]:
        """Every orchestrator turn, oldest first."""
        async with (await self._conn()).cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT * FROM tasks WHERE role = 'orchestrator' ORDER BY created_at, id")
            return await cur.fetchall()

    async def ended_turns(self, n: int, timeout: float = 90) -> list[dict[str, Any]]:
        """Wait until the first n orchestrator turns have ended; every turn, oldest first."""
        seen: list[dict[str, Any]] = []

        async def ended() -> list[dict[str, Any]] | None:
            nonlocal seen
            seen = await self.turns()
            return seen if len(seen) >= n and all(t["status"] not in ("pending", "running") for t in seen[:n]) else None

        return await until(ended, lambda: f"{n} ended turns; the turns: {[(t['brief'], t['status']) for t in seen]}",
                           timeout)

    async def events(self, task_id: uuid.UUID | None = None) -> list[Event]:
        async with (await self._conn()).cursor(row_factory=dict_row) as cur:
            if task_id is None:
                await cur.execute("SELECT * FROM journal ORDER BY seq")
            else:
                await cur.execute("SELECT * FROM journal WHERE task_id = %s ORDER BY seq", [task_id])
            return [Event(**r) for r in await cur.fetchall()]

    async def wait_event(self, task_id: uuid.UUID, event_type: str, timeout: float = 60) -> Event:
        async def seen() -> Event | None:
            return next((e for e in await self.events(task_id) if e.event_type == event_type), None)

        return await until(seen, f"{event_type} for task {task_id}", timeout, every=0.05)


@asynccontextmanager
async def running_supervisor(
    executor_dsn: str, admin_dsn: str, substrate: SubstrateConfig, config: SupervisorConfig
) -> AsyncIterator[Harness]:
    async with Database(executor_dsn, name="test-executor", max_size=8) as db:
        writer = JournalWriter(db.pool)
        await writer.start()
        listener = db.listener(["task_pending", "stop_queue"])
        wake = listener.subscribe()
        listening = asyncio.create_task(listener.run())
        supervisor = Supervisor(db, writer, substrate, config)
        supervising = asyncio.create_task(supervisor.run(wake))
        ready = asyncio.create_task(supervisor.ready.wait())
        await asyncio.wait({ready, supervising}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if supervising.done():
            supervising.result()
        harness = Harness(db, supervisor, writer, admin_dsn)
        try:
            yield harness
        finally:
            await harness.close()
            supervisor.stop()
            await asyncio.wait_for(supervising, 60)
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)
            await writer.flush_and_stop()


@functools.cache
def _sandbox_programs() -> SandboxPolicy:
    root = install_root(claude_bin(), os.environ.get("PATH"))
    return SandboxPolicy.find(exposed=[root] if root is not None else [])


def sandbox_for(tmp: Path, allow: tuple[str, ...] = ()) -> SandboxPolicy:
    """The sandbox every test's spawns run in, as the executor builds it: the test's data directory (`tmp`) and
    the CLI's HOME hidden."""
    base = _sandbox_programs()
    return replace(base, hidden=(*base.hidden, tmp.resolve(), (tmp / "home").resolve()), allow=allow)


def config_for(tmp: Path, **kw: Any) -> SupervisorConfig:
    workdir = tmp / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    # warm turns off unless a test is about them (tests/e2e/test_warm_turns.py): each would start a CLI after
    # every turn, a cost the rest of the suite does not need
    base = SupervisorConfig(stall_timeout_s=60, stop_grace_s=5, poll_interval_s=0.5, watchdog_interval_s=0.2,
                            default_workdir=workdir, run_dir=tmp / "run", sandbox=sandbox_for(tmp),
                            warm=WarmConfig(turns=0))
    return replace(base, **kw)


@asynccontextmanager
async def running_executor(db: DB, model: ScriptedModelServer, tmp: Path, *, ask_timeout_s: float = 60,
                   extra_env: dict[str, str] | None = None, extract: bool = False, backoff_base_s: float = 30.0,
                   substrate_kw: dict[str, Any] | None = None, notify_config: Any = None,
                   project_roots: tuple[Path, ...] = (), sessions: Any = None,
                   routines: RoutinesConfig | None = None, dispatch_limits: DispatchLimits | None = None,
                   budget_ask_s: float | None = SettlerConfig.budget_ask_s, **config_kw: Any) -> AsyncIterator[Harness]:
    port = free_port()
    stop = asyncio.Event()
    sub = substrate_for(model, tmp, **(substrate_kw or {}))
    if extra_env:
        sub = replace(sub, base_env={**sub.base_env, **extra_env})
    config_kw.setdefault("mcp_timeout_ms", int((ask_timeout_s + 120) * 1000))
    config = config_for(tmp, mcp_url=f"http://127.0.0.1:{port}/harness-mcp/", **config_kw)
    executor = ExecutorConfig(dsn=db.executor_dsn, substrate=sub, supervisor=config, mcp_port=port,
                              ask_timeout_s=ask_timeout_s,
                              settler=SettlerConfig(extract=extract, backoff_base_s=backoff_base_s,
                                                    budget_ask_s=budget_ask_s),
                              notify=notify_config or NotifyConfig(data_dir=tmp / "var"), project_roots=project_roots,
                              routines=routines or RoutinesConfig(),
                              dispatch_limits=dispatch_limits or DispatchLimits(),
                              **({"sessions": sessions} if sessions is not None else {}))
    task = asyncio.create_task(serve(executor, stop))

    def listening() -> bool:
        if task.done():
            task.result()  # the executor ended before it listened: its error, not a timeout
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    await until(listening, "the harness MCP to listen", 30, every=0.05)
    async with Database(db.executor_dsn, name="test-observer", max_size=2) as observer:
        harness = Harness(observer, None, None, db.admin_dsn, mcp_url=config.mcp_url)  # type: ignore[arg-type]
        try:
            yield harness
        finally:
            await harness.close()
            stop.set()
            await asyncio.wait_for(task, 60)


def live_in_group(pgid: int) -> list[tuple[int, str]]:
    """The processes of a process group that still run. A sandbox's exited bubblewrap init can wait as a zombie
    until the machine's init reaps it: dead, so not counted."""
    import psutil

    live = []
    for proc in psutil.process_iter(["pid", "name", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                live.append((proc.pid, str(proc.info["name"])))
        except (OSError, psutil.Error):
            continue
    return live


def cli_pid(pid: int) -> int:
    """The `claude` process of a spawn: `pid` itself unsandboxed, else the one inside the sandbox that `pid`
    (bubblewrap) started."""
    import psutil

    proc = psutil.Process(pid)
    for candidate in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            if Path(candidate.exe()).resolve() == Path(claude_bin()).resolve():
                return int(candidate.pid)
    raise AssertionError(f"no claude process under pid {pid}")
