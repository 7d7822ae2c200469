"""Time from an answer POST to ask_user_question's return, at MCP clients calling the tool directly,
next to a bare NOTIFY round trip measured between the same rounds; with one question pending and with
20 pending. The executor (hosting the MCP server) and the ingress run as their own processes.

    python -m tests.bench.bench_ask [--asks 1000] [--pending 20]

Each measured answer is POSTed by id while the stated number of questions wait (with 20, the client
whose question was answered asks again before the next answer). A thread LISTENs on the same server
for `question_answered`, which splits each round trip in two: POST start -> the NOTIFY reaching a bare
listener (the ingress's answer path and the commit), and that NOTIFY -> the tool's return at the
client (the executor's LISTEN dispatch, the answer as `question_closed` carried it, and the MCP server's
response path). Goal for each: p99 within 3x of the bare round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import httpx2
import psutil
import psycopg
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.bench import stats
from tests.bench.bench_sse import wait_up
from tests.pg import Cluster
from tests.served import free_port

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

QUESTION = {"question": "Go on?", "header": "Go", "multiSelect": False,
            "options": [{"label": "Yes", "description": "continue"}, {"label": "No", "description": "stop"}]}
# bare NOTIFY round trips taken after each measured answer, so the baseline sees the same load
BARE_PER_ASK = 2


class Notes:
    """A LISTEN connection in its own thread: the moment each question NOTIFY arrives, on perf_counter."""

    def __init__(self, dsn: str, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.asked: asyncio.Queue[str] = asyncio.Queue()
        self.answered: dict[str, float] = {}
        self._stop = threading.Event()
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._conn.execute("LISTEN question_asked")
        self._conn.execute("LISTEN question_answered")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for note in self._conn.notifies(timeout=0.2):
                now = time.perf_counter()
                if note.channel == "question_answered":
                    self.answered[note.payload] = now
                else:
                    self.loop.call_soon_threadsafe(self.asked.put_nowait, note.payload)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._conn.close()


class Asker:
    """One MCP session asking one question at a time, in its own task (anyio wants a session entered and
    left in the same task)."""

    def __init__(self, mcp_url: str, i: int, headers: dict[str, str]):
        self.text = f"Go on with {i}?"
        self._url = mcp_url
        self._headers = headers
        self._asks: asyncio.Queue[asyncio.Future[float] | None] = asyncio.Queue()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async with httpx2.AsyncClient(headers=self._headers, timeout=httpx2.Timeout(30, read=300)) as http, \
                Client(streamable_http_client(self._url, http_client=http)) as client:
            while (returned := await self._asks.get()) is not None:
                result = await client.call_tool("ask_user_question", {"questions": [{**QUESTION, "question": self.text}]})
                if result.is_error:
                    returned.set_exception(RuntimeError(str(result.content)))
                else:
                    returned.set_result(time.perf_counter())

    async def ask(self, notes: Notes) -> tuple[str, asyncio.Future[float]]:
        """Ask; (the stored question's id, a future of the moment the tool returned)."""
        returned: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._asks.put_nowait(returned)
        return await asyncio.wait_for(notes.asked.get(), 30), returned

    async def close(self) -> None:
        self._asks.put_nowait(None)
        await self.task


async def bare_rtt(lis: psycopg.AsyncConnection, snd: psycopg.AsyncConnection, n: int, out: list[float]) -> None:
    gen = lis.notifies()
    try:
        for _ in range(n):
            t = time.perf_counter()
            await snd.execute("SELECT pg_notify('bench_rtt', 'x')")
            await anext(gen)
            out.append(time.perf_counter() - t)
    finally:
        await gen.aclose()


def as_spawn(admin_dsn: str) -> dict[str, str]:
    """The MCP headers of a running task the harness spawned: the session and task it names and, where the
    harness identifies callers by a per-spawn credential, that credential (only its hash is stored)."""
    token = secrets.token_urlsafe(32)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for _ in range(300):  # a running task added before the executor reconciled would be crashed
            if conn.execute("SELECT 1 FROM journal WHERE event_type = 'executor.started'").fetchone():
                break
            time.sleep(0.1)
        session = conn.execute("INSERT INTO sessions (role, lifecycle) VALUES ('worker', 'running') "
                               "RETURNING id").fetchone()[0]  # type: ignore[index]
        task = conn.execute("INSERT INTO tasks (session_id, role, status, started_at) "
                            "VALUES (%s, 'worker', 'running', now()) RETURNING id", [session]).fetchone()[0]  # type: ignore[index]
        headers = {"X-Petal-Session": str(session), "X-Petal-Task": str(task)}
        if conn.execute("SELECT to_regclass('harness_credentials')").fetchone()[0]:  # type: ignore[index]
            conn.execute("INSERT INTO harness_credentials (token_sha256, task_id, session_id) VALUES (%s, %s, %s)",
                         [hashlib.sha256(token.encode()).digest(), task, session])
            headers["Authorization"] = f"Bearer {token}"
    return headers


async def scenario(mcp_url: str, http: httpx.AsyncClient, notes: Notes, dsn: str, pending: int,
                   asks: int, headers: dict[str, str]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"total": [], "post": [], "to_notify": [], "notify_to_return": [], "bare": []}
    askers = [Asker(mcp_url, i, headers) for i in range(pending)]
    waiting = [await a.ask(notes) for a in askers]  # one at a time, so each stored id is known to be its
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as lis, \
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as snd:
        await lis.execute("LISTEN bench_rtt")
        for k in range(asks):
            i = k % pending
            qid, returned = waiting[i]
            start = time.perf_counter()
            r = await http.post(f"/api/asks/{qid}/answer", json={"answers": {askers[i].text: "Yes"}})
            posted = time.perf_counter()
            r.raise_for_status()
            done = await asyncio.wait_for(returned, 30)
            for _ in range(100):  # the listener thread may not have stamped it yet
                if qid in notes.answered:
                    break
                await asyncio.sleep(0.01)
            notified = notes.answered.pop(qid)
            out["total"].append(done - start)
            out["post"].append(posted - start)
            out["to_notify"].append(notified - start)
            out["notify_to_return"].append(done - notified)
            await bare_rtt(lis, snd, BARE_PER_ASK, out["bare"])
            waiting[i] = await askers[i].ask(notes)  # back to `pending` questions waiting
    for qid, _ in waiting:
        await http.delete(f"/api/asks/{qid}")
    for a in askers:
        await a.close()
    return out


def cpu_s(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        t = psutil.Process(pid).cpu_times()
        out[name] = t.user + t.system
    return out


def report(label: str, r: dict[str, list[float]], goal: float, cpu: dict[str, float]) -> None:
    print(f"{label}")
    n = len(r["total"])
    print("    CPU per answer (robust to load; includes each side's share of asking): "
          + "  ".join(f"{k} {v / n * 1000:.2f} ms" for k, v in cpu.items()))
    print(f"    answer POST -> tool return:       {stats.summary(r['total'])}")
    print(f"    bare NOTIFY round trip:           {stats.summary(r['bare'], digits=3)}")
    print(f"    p99 ratio: {stats.fmt_ratio(stats.ratio(r['total'], r['bare'], 99), f'goal <= {goal:g}x')}")
    print("    breakdown (each from its own samples; the parts overlap, they do not add up):")
    print(f"      POST round trip at the client:  {stats.summary(r['post'])}")
    print(f"      POST start -> NOTIFY seen:      {stats.summary(r['to_notify'])}")
    print(f"      NOTIFY seen -> tool return:     {stats.summary(r['notify_to_return'])}")


async def main(asks: int, pending: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster.start(Path(tmp) / "pg")
        db = cluster.create_migrated()
        port, mcp_port = free_port(), free_port()
        env = {**os.environ, "OPEN_MODE": "1", "PETAL_INGRESS_PORT": str(port), "PETAL_MCP_PORT": str(mcp_port),
               "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_INGRESS_DSN": db.ingress_dsn,
               "PETAL_DATA_DIR": str(Path(tmp) / "var"), "PETAL_LOG_LEVEL": "warning"}
        services = [subprocess.Popen([sys.executable, "-m", "petal_dispatch.cli", name], env=env)
                    for name in ("executor", "ingress")]
        url, mcp_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{mcp_port}/harness-mcp/"
        notes: Notes | None = None
        try:
            await wait_up(url)
            for _ in range(300):  # the executor's MCP server
                try:
                    socket.create_connection(("127.0.0.1", mcp_port), timeout=0.2).close()
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            notes = Notes(db.executor_dsn, asyncio.get_running_loop())
            headers = as_spawn(db.admin_dsn)
            print(f"before: {stats.machine_load()}")
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                await scenario(mcp_url, http, notes, db.executor_dsn, 1, 20, headers)  # warm-up, not counted
                pids = {"ingress": services[1].pid, "executor": services[0].pid, "bench": os.getpid()}
                for label, n, goal in ((f"one question pending ({asks} answers)", 1, 3),
                                       (f"{pending} questions pending ({asks} answers)", pending, 3)):
                    before = cpu_s(pids)
                    result = await scenario(mcp_url, http, notes, db.executor_dsn, n, asks, headers)
                    after = cpu_s(pids)
                    report(label, result, goal, {k: after[k] - before[k] for k in pids})
            print(f"after: {stats.machine_load()}")
        finally:
            if notes is not None:
                notes.close()
            for p in services:
                p.terminate()
                p.wait(20)
            cluster.drop_all()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--asks", type=int, default=1000, help="answers measured per scenario (p99 needs 1000)")
    parser.add_argument("--pending", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.asks, args.pending))
