"""The permission round trip's added latency for an allowed call, next to the same call pre-allowed.

    python -m tests.bench.bench_gate [CALLS] [ROUNDS]
ROUNDS rounds (default 10; with CALLS 100, the 1,000 samples a p99 needs) of one real CLI run per variant against the scripted model, the variants
interleaved so that a shared machine's load drifts over all of them alike; CALLS Bash calls per run
(`echo N`, allowed by the classifier). A call's latency is the time from its `tool_use` line to its
`tool_result` line on stdout, so every variant includes running the command; the difference is the CLI
asking (an `ask` rule, no hook process) plus the MCP round trip plus the classifier. Variants: pre-allowed
(no gate); the bare gate tool (no database); and the wired path — a worker spawned by the real executor,
whose gate tool resolves the caller's credential and the task's directory in PostgreSQL (there the times
are the journal's read times of the same two lines). Goal (issue 18): p99 overhead ≤ 20 ms.
Also prints the classifier alone over the corpus.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from mcp.server.mcpserver import Context

from executor import gates
from executor.harness import permission
from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.bench import stats
from tests.harness import FINAL, claude_bin, claude_env, running_executor
from tests.pg import Cluster
from tests.e2e.test_gates_cli import gate_server
from tests.unit.test_gates_corpus import CASES, HOME, WORKDIR


async def _latencies(tmp: Path, calls: int, gated: bool) -> list[float]:
    work = tmp / ("gated" if gated else "preallowed")
    work.mkdir()
    replies = [{"tool_use": {"name": "Bash", "input": {"command": f"echo {i}"}}} for i in range(calls)]

    async def autonomous(ctx: Context) -> permission.GateContext:
        return permission.GateContext(str(work), str(tmp / "home"), "autonomous")

    with ScriptedModelServer(Scenario.single(*replies, {"text": "done"})) as model:
        async with gate_server(autonomous) as url:
            config = tmp / "mcp.json"
            config.write_text(json.dumps({"mcpServers": {"harness": {"type": "http", "url": url}}}))
            flags = permission.cli_args() if gated else ["--allowedTools", "Bash"]
            cmd = [claude_bin(), "-p", "--output-format", "stream-json", "--verbose", f"--mcp-config={config}",
                   "--strict-mcp-config", *flags, "--", "go"]
            env = claude_env(model, tmp / "home") | {"CLAUDE_CONFIG_DIR": str(tmp / f"config-{gated}")}
            proc = await asyncio.create_subprocess_exec(*cmd, cwd=work, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE, limit=1 << 24)
            asked: dict[str, float] = {}
            took: list[float] = []
            assert proc.stdout is not None
            async for raw in proc.stdout:
                now = time.perf_counter()
                line = json.loads(raw)
                for block in (line.get("message") or {}).get("content") or []:
                    if not isinstance(block, dict):
                        continue
                    if block.get("type") == "tool_use":
                        asked[block["id"]] = now
                    elif block.get("type") == "tool_result" and block.get("tool_use_id") in asked:
                        assert not block.get("is_error"), block
                        took.append((now - asked.pop(block["tool_use_id"])) * 1000)
            await proc.wait()
    return took


async def _wired_latencies(tmp: Path, calls: int) -> list[float]:
    replies = [{"tool_use": {"name": "Bash", "input": {"command": f"echo {i}"}}} for i in range(calls)]
    cluster = Cluster.start(tmp / "pg")
    db = cluster.create_migrated()
    try:
        with ScriptedModelServer(Scenario.single(*replies, {"text": "done"})) as model:
            async with running_executor(db, model, tmp / "wired") as h:
                task_id = await h.dispatch("bench")
                final = await h.wait_task(task_id, lambda r: r["status"] in FINAL, timeout=600)
                assert final["status"] == "success", final
                events = await h.events(task_id)
    finally:
        cluster.drop_all()
    asked: dict[str, float] = {}
    took: list[float] = []
    for e in events:
        content = (e.payload.get("message") or {}).get("content") if isinstance(e.payload, dict) else None
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                asked[block["id"]] = e.created_at.timestamp()
            elif block.get("type") == "tool_result" and block.get("tool_use_id") in asked:
                assert not block.get("is_error"), block
                took.append((e.created_at.timestamp() - asked.pop(block["tool_use_id"])) * 1000)
    return took


def _overhead(values: list[float], base: list[float], q: float) -> str:
    """The q-th percentile's excess over the pre-allowed call's, from exact order statistics of each."""
    a, b = stats.percentile(values, q), stats.percentile(base, q)
    if a is None or b is None:
        return f"p{q:g} - (n={min(len(values), len(base))} < {stats.min_samples(q)})"
    return f"p{q:g} {a - b:7.1f} ms"


async def main(calls: int, rounds: int) -> None:
    gated: list[float] = []
    preallowed: list[float] = []
    wired: list[float] = []
    print(f"before: {stats.machine_load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as tmp:
        for r in range(rounds):
            here = Path(tmp) / f"round-{r}"
            here.mkdir()
            gated += await _latencies(here, calls, gated=True)
            preallowed += await _latencies(here, calls, gated=False)
            wired += await _wired_latencies(here, calls)
    print(f"{rounds} x {calls} allowed Bash calls per variant, interleaved (tool_use → tool_result on stdout)")
    for name, values in (("bare gate tool", gated), ("wired (executor)", wired), ("pre-allowed", preallowed)):
        print(f"  {name:17} {stats.summary(values, scale=1.0, digits=1)}")
    for name, values in (("bare gate tool", gated), ("wired (executor)", wired)):
        print(f"  overhead, {name:17} {_overhead(values, preallowed, 50)}   {_overhead(values, preallowed, 99)}"
              "   (goal: p99 <= 20 ms)")
    timings = []
    for _, command in CASES * 3:
        start = time.perf_counter()
        gates.classify("Bash", {"command": command}, WORKDIR, HOME)
        timings.append((time.perf_counter() - start) * 1000)
    print(f"classifier alone over the corpus: {stats.summary(timings, scale=1.0)}")
    print(f"after: {stats.machine_load()}")


if __name__ == "__main__":
    # 100 calls x 10 rounds: 1,000 samples per variant, the fewest an exact p99 needs
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100, int(sys.argv[2]) if len(sys.argv) > 2 else 10))
