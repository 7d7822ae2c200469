"""Time from an answer POST to ask_user_question's return, at MCP clients calling the tool directly (raw
JSON-RPC POSTs, as the CLI's own client sends them on the wire), next to bare NOTIFY round trips taken all
along by a process of their own (tests/bench/notify_rtt.py: the same machine load); with one question
pending and with 20 pending. The executor (hosting the MCP server) and the ingress run as their own processes.

    python -m tests.bench.bench_ask [--asks 1000] [--pending 20]

Each measured answer is POSTed by id while the stated number of questions wait (with 20, the client
whose question was answered asks again before the next answer), once the executor has put its question up
(as a user answers a question after reading it). A thread LISTENs on the same server
for `question_answered`, which splits each round trip in two: POST start -> the NOTIFY reaching a bare
listener (the ingress's answer path and the commit), and that NOTIFY -> the tool's return at the
client (the executor's LISTEN dispatch, the answer as `question_closed` carried it, and the MCP server's
response path). Goal for each: p99 within 3x of the bare round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from tests.bench import notify_rtt, raw_http, record, stats
from tests.bench.bench_sse import wait_up
from tests.pg import Cluster
from tests.served import free_port

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

QUESTION = {"question": "Go on?", "header": "Go", "multiSelect": False,
            "options": [{"label": "Yes", "description": "continue"}, {"label": "No", "description": "stop"}]}
# the longest wait for a question's put-up to end where its task's activity does not change (put_up)
ACTIVITY_WAIT_S = 0.2
# what the SDK's client sends with every call on the stateless transport
PROTOCOL = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": PROTOCOL,
        "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {}}


class Notes:
    """A LISTEN connection in its own thread: the moment each question NOTIFY arrives, on perf_counter, and
    the questions asked and the tasks' activity changes in the order they came."""

    def __init__(self, dsn: str, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.asked: asyncio.Queue[tuple[str, str]] = asyncio.Queue()  # (channel, payload)
        self.answered: dict[str, float] = {}
        self._stop = threading.Event()
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._conn.execute("LISTEN question_asked")
        self._conn.execute("LISTEN question_answered")
        self._conn.execute("LISTEN task_activity")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for note in self._conn.notifies(timeout=0.2):
                now = time.perf_counter()
                if note.channel == "question_answered":
                    self.answered[note.payload] = now
                else:
                    self.loop.call_soon_threadsafe(self.asked.put_nowait, (note.channel, note.payload))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._conn.close()


class Asker:
    """One client asking one question at a time, as a raw JSON-RPC POST per call (the stateless transport
    needs no session) on a keep-alive connection of its own (tests/bench/raw_http.py): the moment is the
    response's arrival whole, as the CLI, the harness's real client, gets it. The Python SDK's client spent
    some 2 ms of this process's CPU per call parsing and validating, and httpx 1 ms, on the same two cores
    as the services it measures."""

    def __init__(self, mcp_url: str, i: int, headers: dict[str, str]):
        self.text = f"Go on with {i}?"
        self._url = mcp_url
        self._headers = {**headers, "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": PROTOCOL,
                         "MCP-Method": "tools/call", "MCP-Name": "ask_user_question"}
        self._asks: asyncio.Queue[asyncio.Future[float] | None] = asyncio.Queue()
        self._calls = 0
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        http = raw_http.Client(self._url, self._headers)
        try:
            while (returned := await self._asks.get()) is not None:
                self._calls += 1
                r = await http.post_json("", {
                    "jsonrpc": "2.0", "id": self._calls, "method": "tools/call",
                    "params": {"name": "ask_user_question",
                               "arguments": {"questions": [{**QUESTION, "question": self.text}]}, "_meta": META}})
                try:
                    result = _result(r)
                except (ValueError, KeyError, raw_http.HTTPError) as exc:
                    returned.set_exception(RuntimeError(f"{exc}: {r.body[:500]!r}"))
                    continue
                if result.get("isError"):
                    returned.set_exception(RuntimeError(str(result.get("content"))))
                else:
                    returned.set_result(r.at)
        finally:
            await http.close()

    async def ask(self, notes: Notes) -> tuple[str, asyncio.Future[float]]:
        """Ask; (the stored question's id, a future of the moment the tool returned)."""
        returned: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._asks.put_nowait(returned)
        return await asyncio.wait_for(put_up(notes), 30), returned

    async def close(self) -> None:
        self._asks.put_nowait(None)
        await self.task


def _result(r: raw_http.Response) -> dict[str, Any]:
    """A tools/call's result, from a JSON response or the last message of an event stream (a call that sent
    progress first)."""
    r.raise_for_status()
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in r.body.decode().splitlines() if line.startswith("data:")]
        body = json.loads(data[-1])
    else:
        body = r.json()
    return body["result"]  # type: ignore[no-any-return]


async def put_up(notes: Notes) -> str:
    """The next question asked, once the executor has finished putting it up (its task's activity became
    awaiting_user, the ask's last write): a user answers a question after reading it, so an answer is not
    measured against the asking's own work. Where the activity does not change (it already was
    awaiting_user: a second question of the task) the wait ends after ACTIVITY_WAIT_S."""
    while (note := await notes.asked.get())[0] != "question_asked":
        pass  # an activity change before the question: the previous answer's
    with contextlib.suppress(TimeoutError):
        while (await asyncio.wait_for(notes.asked.get(), ACTIVITY_WAIT_S))[0] != "task_activity":
            pass
    return note[1]


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
                   asks: int, spawns: list[dict[str, str]]) -> dict[str, list[float]]:
    answering = raw_http.Client(str(http.base_url))
    out: dict[str, list[float]] = {"total": [], "post": [], "to_notify": [], "notify_to_return": [], "bare": []}
    # each question from a spawn of its own, as questions wait in a running executor (a task has a few at most)
    askers = [Asker(mcp_url, i, spawns[i]) for i in range(pending)]
    waiting = [await a.ask(notes) for a in askers]  # one at a time, so each stored id is known to be its
    async with notify_rtt.Beside(dsn) as beside:  # the baseline, under the same load, all along
        for k in range(asks):
            i = k % pending
            qid, returned = waiting[i]
            start = time.perf_counter()
            r = await answering.post_json(f"/api/asks/{qid}/answer", {"answers": {askers[i].text: "Yes"}})
            posted = r.at
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
            waiting[i] = await askers[i].ask(notes)  # back to `pending` questions waiting
    out["bare"] = beside.rtts
    for qid, _ in waiting:
        await http.delete(f"/api/asks/{qid}")
    for a in askers:
        await a.close()
    await answering.close()
    return out


def cpu_s(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        t = psutil.Process(pid).cpu_times()
        out[name] = t.user + t.system
    return out


# the goals: answer POST -> tool return at p99 against the bare NOTIFY round trip; the services' CPU per answer
RATIO_GOAL, CPU_GOAL_MS = 1.5, 3.0


def report(label: str, r: dict[str, list[float]], goal: float, cpu: dict[str, float]) -> None:
    print(f"{label}")
    n = len(r["total"])
    print("    CPU per answer (robust to load; includes each side's share of asking): "
          + "  ".join(f"{k} {v / n * 1000:.2f} ms" for k, v in cpu.items()))
    print(f"    answer POST -> tool return:       {stats.summary(r['total'])}")
    print(f"    bare NOTIFY round trip (alongside): {stats.summary(r['bare'], digits=3)}")
    print(f"    p99 ratio: {stats.fmt_ratio(stats.ratio(r['total'], r['bare'], 99), f'goal <= {goal:g}x')}")
    print("    breakdown (each from its own samples; the parts overlap, they do not add up):")
    print(f"      POST round trip at the client:  {stats.summary(r['post'])}")
    print(f"      POST start -> NOTIFY seen:      {stats.summary(r['to_notify'])}")
    print(f"      NOTIFY seen -> tool return:     {stats.summary(r['notify_to_return'])}")
    key = "ask_" + label.split()[0].strip("():").lower()
    record.latency(key, f"answer POST → ask_user_question's return, {label}", r["total"], r["bare"],
                   99, baseline_label="bare NOTIFY round trip (alongside)", goal=("<=", goal))
    services = sum(spent for side, spent in cpu.items() if side != "bench") / n * 1000
    print(f"    CPU per answer, ingress + executor: {services:.2f} ms  (goal <= {CPU_GOAL_MS:g} ms)")
    record.value(f"{key}_cpu", f"CPU per answer, ingress + executor ({label})", services, "ms", n=n,
                 goal=("<=", CPU_GOAL_MS), goal_on="value")


async def main(asks: int, pending: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster.start(Path(tmp) / "pg")
        db = cluster.create_migrated()
        port, mcp_port = free_port(), free_port()
        env = {**os.environ, "OPEN_MODE": "1", "PETAL_INGRESS_PORT": str(port), "PETAL_MCP_PORT": str(mcp_port),
               "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_INGRESS_DSN": db.ingress_dsn,
               "PETAL_DATA_DIR": str(Path(tmp) / "var"), "PETAL_LOG_LEVEL": "warning",
               # no CLI runs here (the tool is called directly), but the executor starts only logged in
               "ANTHROPIC_API_KEY": "sk-ant-fake", "PETAL_CLAUDE_CONFIG_DIR": str(Path(tmp) / "claude-config")}
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
            spawns = [as_spawn(db.admin_dsn) for _ in range(max(pending, 1))]
            print(f"before: {stats.machine_load()}")
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                await scenario(mcp_url, http, notes, db.executor_dsn, 1, 20, spawns)  # warm-up, not counted
                pids = {"ingress": services[1].pid, "executor": services[0].pid, "bench": os.getpid()}
                for label, n, goal in ((f"one question pending ({asks} answers)", 1, RATIO_GOAL),
                                       (f"{pending} questions pending ({asks} answers)", pending, RATIO_GOAL)):
                    before = cpu_s(pids)
                    result = await scenario(mcp_url, http, notes, db.executor_dsn, n, asks, spawns)
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
