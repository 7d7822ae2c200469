"""`petal-dispatch executor`: the supervisor, its journal writer and its LISTEN connection, as one process."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping

from executor.journal_writer import JournalWriter
from executor.substrate import SubstrateConfig
from executor.supervisor import Supervisor, SupervisorConfig
from shared import dbserver, logs
from shared.database import Database
from shared.settings import Settings

log = logs.get(__name__)

# Channels the executor wakes on. Each carries an id; the supervisor re-reads the tables.
CHANNELS = ["task_pending", "stop_queue"]


def substrate_config(settings: Settings, env: Mapping[str, str]) -> SubstrateConfig:
    return SubstrateConfig(
        claude_bin=settings.claude_bin,
        config_dir=settings.claude_config_dir,
        base_env=dict(env),
        max_retries=settings.claude_max_retries,
        api_timeout_ms=settings.claude_api_timeout_ms,
        byte_stream_idle_timeout_ms=settings.claude_stream_idle_timeout_ms,
    )


def supervisor_config(settings: Settings) -> SupervisorConfig:
    return SupervisorConfig(
        max_workers=settings.max_workers,
        stall_timeout_s=settings.stall_timeout_s,
        stop_grace_s=settings.stop_grace_s,
        max_runtime_s=settings.max_runtime_s,
        default_workdir=settings.workdir,
        run_dir=settings.data_dir.resolve() / "run",
    )


async def serve(dsn: str, substrate: SubstrateConfig, config: SupervisorConfig, stop: asyncio.Event) -> None:
    async with Database(dsn, name="petal-executor") as db:
        writer = JournalWriter(db.pool)
        await writer.start()
        listener = db.listener(CHANNELS)
        wake = listener.subscribe()
        listening = asyncio.create_task(listener.run(), name="listener")
        supervisor = Supervisor(db, writer, substrate, config)
        supervising = asyncio.create_task(supervisor.run(wake), name="supervisor")
        stopping = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait({supervising, listening, stopping}, return_when=asyncio.FIRST_COMPLETED)
            supervisor.stop()
            await supervising  # re-raises a supervisor crash (e.g. another executor holds the lock)
        finally:
            listening.cancel()
            stopping.cancel()
            await asyncio.gather(listening, stopping, return_exceptions=True)
            await writer.flush_and_stop()


def main(settings: Settings) -> int:
    info = dbserver.resolve(settings)
    dbserver.require_current(info.executor_dsn)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(info.executor_dsn, substrate_config(settings, os.environ), supervisor_config(settings), stop)

    asyncio.run(run())
    log.info("executor_stopped")
    return 0
