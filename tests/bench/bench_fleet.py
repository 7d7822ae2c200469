"""Dispatch -> spawn with one executor and with three on the same database, in one run.

    python -m tests.bench.bench_fleet [--tasks 200] [--capacity 8] [--executors 3]

Each executor is a supervisor of its own (its own pool, lease and name) whose "claude" is a script that
prints one result line and exits, so the figures are the claim path's: the time from a task's
`task.dispatch_requested` to its `task.spawned` (journal clock), p50 and p99, and workers started per
second (first dispatch to last spawn). The three-executor figures are printed as a ratio of the
one-executor ones.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from executor.settle import dispatch
from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.bench import services
from tests.harness import config_for, running_supervisor, substrate_for, worker
from tests.pg import Cluster

RESULT = ('{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"x",'
          '"num_turns":1,"duration_ms":1,"total_cost_usd":0}')


def _quick_claude(tmp: Path) -> Path:
    return services.fake_cli(tmp / "fake-cli" / "quick-claude", f"echo '{RESULT}'")


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def run(cluster: Cluster, tmp: Path, executors: int, tasks: int, capacity: int) -> dict[str, float]:
    db = cluster.create_migrated()
    try:
        with ScriptedModelServer(Scenario()) as model:
            sub = replace(substrate_for(model, tmp), claude_bin=str(_quick_claude(tmp)))
            async with contextlib.AsyncExitStack() as stack:
                hs = [await stack.enter_async_context(running_supervisor(
                    db.executor_dsn, db.admin_dsn, sub,
                    config_for(tmp / f"e{i}", name=f"bench-{i}", max_workers=capacity, poll_interval_s=1.0)))
                    for i in range(executors)]
                workdir = config_for(tmp).default_workdir
                ids = [await dispatch.request(hs[0].db.pool, worker(f"job {i}", workdir=workdir))
                       for i in range(tasks)]
                for t in ids:
                    await hs[0].wait_final(t, timeout=600)
                events = await hs[0].events()
        requested = {e.task_id: e.created_at for e in events if e.event_type == "task.dispatch_requested"}
        spawned = {e.task_id: e.created_at for e in events if e.event_type == "task.spawned"}
        by = {e.payload["executor"] for e in events if e.event_type == "task.spawned"}
        assert len(spawned) == tasks and len(by) == executors, (len(spawned), by)
        lat = [(spawned[t] - requested[t]).total_seconds() * 1000 for t in spawned]
        span = (max(spawned.values()) - min(requested.values())).total_seconds()
        return {"p50": _pct(lat, 50), "p99": _pct(lat, 99), "rate": tasks / span}
    finally:
        cluster.drop(db)


async def main(tasks: int, capacity: int, executors: int) -> None:
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        cluster = Cluster.start(tmp / "pg")
        try:
            one = await run(cluster, tmp / "one", 1, tasks, capacity)
            many = await run(cluster, tmp / "many", executors, tasks, capacity)
        finally:
            cluster.drop_all()
    print(f"{tasks} tasks, capacity {capacity} per executor")
    for label, r in (("1 executor", one), (f"{executors} executors", many)):
        print(f"  {label:<12} dispatch->spawn p50 {r['p50']:.1f} ms  p99 {r['p99']:.1f} ms  "
              f"{r['rate']:.1f} workers started/s")
    print(f"  ratio {executors}/1: p50 {many['p50'] / one['p50']:.2f}  p99 {many['p99'] / one['p99']:.2f}  "
          f"workers/s {many['rate'] / one['rate']:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--capacity", type=int, default=8)
    parser.add_argument("--executors", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.capacity, args.executors))
