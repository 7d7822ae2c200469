"""Waiting costs nothing: turns parked on their user's questions hold no CLI process past PETAL_PARK_AFTER_S, and an
answer given after it resumes the conversation about as fast as a message starts a cold turn.

    python -m tests.bench.bench_parked [--questions 20] [--grace 2]

The ingress and the executor run as their own processes (sandboxed spawns, as deployed; warm turns off, so the
cold path is the figure), the real CLI against the scripted model. `questions` threads each get a message whose
turn asks a question (ask_user_question) nobody answers at first.
(a) resident memory of the executor and all its descendants (the sandboxes and CLIs under it): idle, with the
    questions parked and no grace (PETAL_PARK_AFTER_S=0: each waits in its CLI), and with the grace, once it
    passed (the executor restarted). Goal: parked past the grace <= idle + 100 MiB.
(b) an answer's way to the model: POST of the answer to a question whose process ended -> the model's request
    carrying it (a new turn resuming the thread with the answer), next to the cold path in the same run:
    POST /api/chat to an idle thread -> the model's request carrying that message. Goal: p50 <= 1.2x cold.
Each arrival is seen by polling the scripted model's request log every millisecond, in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx
import psycopg

from executor.run import process
from petal_dispatch.demo.scripted_model import Rule, ScriptedModelServer
from tests.bench import record, services, stats

MIB = 2**20


def _question(i: int) -> dict[str, Any]:
    return {"question": f"Which way for {i}?", "header": "Way", "multiSelect": False,
            "options": [{"label": "Left", "description": ""}, {"label": "Right", "description": ""}]}


def rules(n: int) -> list[Rule]:
    return [Rule(role="orchestrator", match_last="[harness] A late answer", replies=[{"text": "resumed"}]),
            Rule(role="orchestrator", match_last="cold ", replies=[{"text": "hi"}]),
            *[Rule(role="orchestrator", match=f"park {i} ", replies=[
                {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [_question(i)]}}},
                {"text": "thanks"}]) for i in range(n)]]


def tree_mib(pid: int) -> float:
    return (process.tree_rss(pid) or 0) / MIB


def settled_mib(pid: int, samples: int = 10) -> float:
    """The median of a second's samples: a process's RSS moves a little as its loops run."""
    values = []
    for _ in range(samples):
        values.append(tree_mib(pid))
        time.sleep(0.1)
    return stats.median(values)


async def _count(admin_dsn: str, query: str, *params: Any) -> int:
    async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as conn:
        row = await (await conn.execute(query, params)).fetchone()
        return int(row[0]) if row else 0


async def _until(check: Any, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.2)


async def park(http: httpx.AsyncClient, admin_dsn: str, n: int, ended: bool) -> list[str]:
    """`n` threads whose turns asked and wait: running (no grace) or ended past the grace."""
    threads = []
    for i in range(n):
        made = await http.post("/api/threads", json={"title": f"parked {i}", "mode": "autonomous"})
        threads.append(made.json()["thread_id"])
        await http.post("/api/chat", json={"text": f"park {i} now", "thread_id": threads[-1]})
    status = "cancelled" if ended else "running"
    await _until(lambda: _waiting(admin_dsn, threads, status, n), f"{n} questions parked ({status})")
    return threads


async def _waiting(admin_dsn: str, threads: list[str], status: str, n: int) -> bool:
    return await _count(admin_dsn, "SELECT count(*) FROM questions q JOIN tasks t ON t.id = q.task_id "
                        "WHERE q.status = 'pending' AND t.status = %s AND t.session_id = ANY(%s::uuid[])",
                        status, threads) == n


async def arrival(model: ScriptedModelServer, needle: str, since: int) -> float:
    """perf_counter when a request carrying `needle` in its user text reached the model (polled each ms)."""
    while True:
        for req in model.requests[since:]:
            if any(needle in str(b.get("text", "")) for b in req.user_blocks):
                return time.perf_counter()
        await asyncio.sleep(0.001)


async def answer_latencies(http: httpx.AsyncClient, model: ScriptedModelServer, threads: list[str]) -> list[float]:
    asks = (await http.get("/api/asks", params={"status": "pending", "limit": 200})).json()["asks"]
    out = []
    for i in range(len(threads)):
        ask = next(a for a in asks if a["questions"][0]["question"] == f"Which way for {i}?"
                   and a["thread_scope"] == threads[i])
        since = len(model.requests)
        t0 = time.perf_counter()
        posted = await http.post(f"/api/asks/{ask['id']}/answer", json={"answers": {f"Which way for {i}?": "Left"}})
        assert posted.status_code == 202, posted.text  # late: the answer goes to the thread
        out.append(await asyncio.wait_for(arrival(model, f"Which way for {i}? → Left", since), 120) - t0)
        await asyncio.sleep(0.5)  # one at a time: the next is measured on an idle executor
    return out


async def cold_latencies(http: httpx.AsyncClient, model: ScriptedModelServer, threads: list[str],
                         admin_dsn: str) -> list[float]:
    out = []
    for i, thread in enumerate(threads):
        await _until(lambda t=thread: _idle(admin_dsn, t), "the thread idle")
        since = len(model.requests)
        t0 = time.perf_counter()
        await http.post("/api/chat", json={"text": f"cold {i}", "thread_id": thread})
        out.append(await asyncio.wait_for(arrival(model, f"cold {i}", since), 120) - t0)
        await asyncio.sleep(0.5)
    return out


async def _idle(admin_dsn: str, thread: str) -> bool:
    return await _count(admin_dsn, "SELECT count(*) FROM tasks WHERE session_id = %s AND status IN "
                        "('pending', 'running')", thread) == 0


async def main(n: int, grace: float) -> None:
    with services.scratch_store() as (tmp, db, model):
        model.scenario.rules = rules(n)
        env = {**services.service_env(db, model, tmp, workers=4), "PETAL_WARM_TURNS": "0",
               "PETAL_MAX_PARKED": str(max(32, n)), "PETAL_ASK_TIMEOUT_S": "3600"}
        print(f"before: {stats.machine_load()}; {n} questions")
        async with services.running(db, {**env, "PETAL_PARK_AFTER_S": str(grace)}) as svc, \
                httpx.AsyncClient(base_url=svc.url, timeout=30) as http:
            await asyncio.sleep(3)  # the executor's start-up work done (its spares up)
            idle = settled_mib(svc.executor.pid)
            threads = await park(http, db.admin_dsn, n, ended=True)
            freed = settled_mib(svc.executor.pid)
            answers = await answer_latencies(http, model, threads)
            cold = await cold_latencies(http, model, threads, db.admin_dsn)
            # the control: no grace (the executor restarted), each question waits in its CLI
            services.stop(svc.executor)
            svc.executor = services.start("executor", {**env, "PETAL_PARK_AFTER_S": "0"})
            await services.executor_started(db.admin_dsn, 2)
            await asyncio.sleep(3)
            idle_b = settled_mib(svc.executor.pid)
            await park(http, db.admin_dsn, n, ended=False)
            held = settled_mib(svc.executor.pid)
        print(f"(a) executor + descendants resident (median of 10 samples each): idle {idle:.0f} MiB, {n} questions "
              f"parked past a {grace:g} s grace {freed:.0f} MiB: {freed - idle:+.0f} MiB  (goal <= +100 MiB)")
        print(f"    control, no grace (PETAL_PARK_AFTER_S=0): idle {idle_b:.0f} MiB, {n} parked {held:.0f} MiB: "
              f"{held - idle_b:+.0f} MiB, {(held - idle_b) / n:.0f} MiB a question")
        print("(b) answer to a parked question -> the model:  " + stats.summary(answers, (50,)))
        print("    cold path: chat message -> the model:        " + stats.summary(cold, (50,)))
        print("    ratio p50: " + stats.fmt_ratio(stats.ratio(answers, cold, 50), "goal <= 1.2x"))
        record.value("parked_memory", f"executor + descendants resident with {n} questions parked past the grace, "
                     "over idle", freed - idle, "MiB", n=10, stat="median", baseline=held - idle_b,
                     baseline_label=f"the same {n} held in their CLIs", goal=("<=", 100), goal_on="value")
        record.latency("parked_answer", "an answer to a parked question → the model", answers, cold, 50,
                       baseline_label="cold path: chat message → the model", goal=("<=", 1.2))
        print(f"after: {stats.machine_load()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=20, help="parked questions (a p50 needs 20)")
    parser.add_argument("--grace", type=float, default=2.0, help="PETAL_PARK_AFTER_S for the parked phase")
    args = parser.parse_args()
    asyncio.run(main(args.questions, args.grace))
