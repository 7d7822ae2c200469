"""What the worker sandbox costs, sandboxed against unsandboxed in the same run.

    python -m tests.bench.bench_sandbox [--turns 40] [--tasks 12] [--calls 105] [--rounds 4]

The real executor supervisor and the real CLI against the scripted model, one supervisor sandboxed (every spawn
in bubblewrap with its gateway, as in production) and one with the sandbox off, in alternating rounds so the
machine's drift falls on both alike.
(a) dispatch committed -> the task's first stream line journaled, per turn (goal: the sandbox adds <= 10% at
    p50; the paired figure sets each sandboxed turn against the unsandboxed one next to it).
(b) a Bash call's round trip inside a running task: the CLI's tool_use line -> its tool_result line, both as
    journaled when read (goal: p99 <= 15 ms more sandboxed).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from dataclasses import replace
from pathlib import Path

import psycopg

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests.bench import stats
from tests.harness import config_for, running_supervisor, substrate_for
from tests.pg import Cluster


async def _first_line_s(admin_dsn: str, task_id: object) -> float:
    async with await psycopg.AsyncConnection.connect(admin_dsn) as conn:
        row = await (await conn.execute(
            "SELECT (SELECT min(created_at) FROM journal WHERE task_id = %(t)s AND event_type LIKE 'stream.%%')"
            " - (SELECT created_at FROM journal WHERE task_id = %(t)s AND event_type = 'task.dispatch_requested')",
            {"t": task_id})).fetchone()
    assert row is not None and row[0] is not None
    return float(row[0].total_seconds())


async def _round_trips(admin_dsn: str, task_id: object) -> list[float]:
    """tool_use line -> its tool_result line, per Bash call (journal read times)."""
    async with await psycopg.AsyncConnection.connect(admin_dsn) as conn:
        rows = await (await conn.execute(
            "SELECT event_type, created_at, payload FROM journal WHERE task_id = %s "
            "AND event_type IN ('stream.assistant', 'stream.user') ORDER BY seq", [task_id])).fetchall()
    asked: dict[str, float] = {}
    out = []
    for kind, at, payload in rows:
        for block in (payload.get("message") or {}).get("content") or []:
            if not isinstance(block, dict):
                continue
            if kind == "stream.assistant" and block.get("type") == "tool_use":
                asked[block["id"]] = at.timestamp()
            elif kind == "stream.user" and block.get("type") == "tool_result" and block.get("tool_use_id") in asked:
                out.append(at.timestamp() - asked.pop(block["tool_use_id"]))
    return out


async def main(turns: int, tasks: int, calls: int, rounds: int) -> None:
    replies = [{"tool_use": {"name": "Bash", "input": {"command": "true"}}}] * calls + [{"text": "done"}]
    scenario = Scenario(rules=[Rule(role="worker", match="bash loop", replies=replies)],
                        default={"text": "hello"})
    first: dict[str, list[float]] = {"sandboxed": [], "off": []}
    trips: dict[str, list[float]] = {"sandboxed": [], "off": []}
    paired: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp_name, \
            ScriptedModelServer(scenario) as model:
        tmp = Path(tmp_name)
        cluster = Cluster.start(tmp / "cluster")
        try:
            db = cluster.create_migrated()
            sub = substrate_for(model, tmp)
            on = config_for(tmp, max_workers=1)
            configs = {"sandboxed": on, "off": replace(on, sandbox=None)}
            for r in range(rounds):
                per_round = {k: [] for k in configs}  # type: dict[str, list[float]]
                order = list(configs) if r % 2 == 0 else list(reversed(configs))
                for mode in order:
                    async with running_supervisor(db.executor_dsn, db.admin_dsn, sub, configs[mode]) as h:
                        for _ in range(turns // rounds):
                            t = await h.dispatch("say hello")
                            await h.wait_final(t)
                            per_round[mode].append(await _first_line_s(db.admin_dsn, t))
                        for _ in range(max(tasks // rounds, 1)):
                            t = await h.dispatch("bash loop")
                            await h.wait_final(t, timeout=600)
                            trips[mode] += await _round_trips(db.admin_dsn, t)
                for k in configs:
                    first[k] += per_round[k]
                paired += [a - b for a, b in zip(per_round["sandboxed"], per_round["off"], strict=False)]
        finally:
            cluster.drop_all()
            cluster.close()

    print(f"bench_sandbox: {stats.machine_load()}")
    print("(a) dispatch -> first stream line")
    for k, v in first.items():
        print(f"    {k:10s} {stats.summary(v, (50, 90))}")
    ratio = stats.ratio(first["sandboxed"], first["off"], 50)
    print(f"    p50 sandboxed / off: {stats.fmt_ratio(ratio, 'goal <= 1.10')}")
    base = stats.percentile(first["off"], 50)
    if base and paired:
        med = stats.median(paired)
        print(f"    paired median difference: {med * 1000:+.1f} ms = {med / base:+.1%} of the unsandboxed p50 "
              f"(n={len(paired)} pairs)")
    print("(b) Bash tool_use -> tool_result")
    for k, v in trips.items():
        print(f"    {k:10s} {stats.summary(v, (50, 99))}")
    a, b = stats.percentile(trips["sandboxed"], 99), stats.percentile(trips["off"], 99)
    if a is not None and b is not None:
        print(f"    p99 difference: {(a - b) * 1000:+.2f} ms  (goal <= +15 ms)")
    else:
        print("    p99 difference: - (too few samples for a p99)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--calls", type=int, default=105)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.tasks, args.calls, args.rounds))
