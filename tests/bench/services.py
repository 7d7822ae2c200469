"""The ingress and the executor as their own processes, the way they are deployed, for the benchmarks.

A benchmark that hosted them in its own event loop would time its own load generator's and browser
driver's work into theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.bench.bench_sse import wait_up
from tests.harness import claude_bin, claude_env
from tests.pg import DB, Cluster
from tests.served import free_port


@dataclass
class Services:
    url: str
    mcp_url: str
    config_dir: Path
    workdir: Path
    ingress: subprocess.Popen[bytes]
    executor: subprocess.Popen[bytes]


@contextlib.contextmanager
def scratch_store() -> Iterator[tuple[Path, DB, ScriptedModelServer]]:
    """A temporary directory, the scripted model, and a migrated database on a server of its own, dropped after."""
    with tempfile.TemporaryDirectory() as tmpdir, ScriptedModelServer(Scenario()) as model:
        tmp = Path(tmpdir)
        cluster = Cluster.start(tmp / "pg")
        try:
            yield tmp, cluster.create_migrated(), model
        finally:
            cluster.drop_all()


def service_env(db: DB, model: ScriptedModelServer, tmp: Path, *, workers: int = 1,
                claude: str | None = None) -> dict[str, str]:
    """Both services' environment: open mode on loopback, the real CLI on the scripted model."""
    workdir = tmp / "work"
    workdir.mkdir(exist_ok=True)
    port, mcp_port = free_port(), free_port()
    return {**os.environ, **claude_env(model, tmp / "home"), "OPEN_MODE": "1",
            "PETAL_INGRESS_PORT": str(port), "PETAL_MCP_PORT": str(mcp_port),
            "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_INGRESS_DSN": db.ingress_dsn,
            "PETAL_DATA_DIR": str(tmp / "var"), "PETAL_LOG_LEVEL": "warning",
            "PETAL_CLAUDE_BIN": claude or claude_bin(), "PETAL_CLAUDE_CONFIG_DIR": str(tmp / "claude-config"),
            "PETAL_WORKDIR": str(workdir), "PETAL_CLAUDE_MAX_RETRIES": "0",
            "PETAL_MAX_WORKERS": str(max(workers, 1))}


def fake_cli(path: Path, body: str) -> Path:
    """A shell script standing in for `claude` where a benchmark times the executor, not the CLI: it answers the
    start-up checks as the real one does (`--version`, `auth status` with an API key: petal_dispatch/doctor.py),
    and runs `body` for a spawn. Give it a directory of its own: the executor refuses a workdir inside the CLI's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n"
                    'case "$1" in --version) echo "2.1.328 (Claude Code)"; exit 0;; esac\n'
                    'if [ "$1 $2" = "auth status" ]; then\n'
                    '  echo \'{"loggedIn": true, "authMethod": "api_key", "apiKeySource": "ANTHROPIC_API_KEY"}\'; exit 0\n'
                    f"fi\n{body}\n")
    path.chmod(0o755)
    return path


def start(name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "petal_dispatch.cli", name], env=env)


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)


async def executor_started(admin_dsn: str, count: int) -> None:
    """Until `count` executors have reconciled on this database (a restart is the second)."""
    async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as conn:
        for _ in range(600):
            cur = await conn.execute("SELECT count(*) FROM journal WHERE event_type = 'executor.started'")
            row = await cur.fetchone()
            if row and row[0] >= count:
                return
            await asyncio.sleep(0.1)
    raise RuntimeError("the executor never started")


@contextlib.asynccontextmanager
async def running(db: DB, env: dict[str, str]) -> AsyncIterator[Services]:
    """Both services on `env` (from service_env), once they serve; stopped after (whichever executor the
    caller left in `executor`: a benchmark may restart it with another environment)."""
    ingress = start("ingress", env)
    svc = Services(f"http://127.0.0.1:{env['PETAL_INGRESS_PORT']}",
                   f"http://127.0.0.1:{env['PETAL_MCP_PORT']}/harness-mcp/",
                   Path(env["PETAL_CLAUDE_CONFIG_DIR"]), Path(env["PETAL_WORKDIR"]), ingress, start("executor", env))
    try:
        await wait_up(svc.url)
        await executor_started(db.admin_dsn, 1)
        yield svc
    finally:
        stop(svc.ingress, svc.executor)
