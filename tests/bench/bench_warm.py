"""Warm turns: a chat message's first stream line from a CLI started ahead of it, next to the CLI's own cold
start in the same run.

    python -m tests.bench.bench_warm [--turns 20] [--settle 3]

The ingress and the executor run as their own processes (sandboxed spawns, as deployed), the real CLI
against the scripted model. One thread takes `turns` messages, each sent `settle` seconds after the previous
turn ended (a person reads the reply before writing the next; the warm process started meanwhile).
(a) warm turns on (PETAL_WARM_TURNS=2): POST /api/chat -> the turn's first stream line at an SSE client,
    next to the CLI's own cold spawn -> first stdout line for the command line a cold turn runs, spawned
    directly (unsandboxed, the executor's environment, on a copy of its CLI config directory) between the
    turns. Goal: warm <= 0.5x cold at p50.
    Printed beside it: each warm process's resident memory (the sandbox and the CLI in it) while it waits.
(b) warm turns off (PETAL_WARM_TURNS=0, the executor restarted): the same pairs; the cold path through the
    harness must stay within 1.10x of the CLI's own start (per turn, next to its own direct spawn).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from executor.run import process, substrate
from tests.bench import record, services, stats
from tests.bench.bench_e2e import Stream


async def cold_spawn_to_first_line(argv: list[str], env: dict[str, str], cwd: str, prompt: bytes) -> float:
    """The CLI's own start: spawn -> its first stdout line, the prompt on stdin as the executor gives it."""
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.DEVNULL, env=env, cwd=cwd,
                                                start_new_session=True, limit=1 << 26)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(prompt)
    proc.stdin.close()
    await proc.stdout.readline()
    first = time.perf_counter() - start
    await proc.stdout.read()
    await proc.wait()
    return first


async def _warm_started(admin_dsn: str, thread: str, n: int, timeout: float = 60) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as conn:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            cur = await conn.execute("SELECT payload FROM journal WHERE event_type = 'warm.started' AND session_id = %s "
                                     "ORDER BY seq", [thread])
            rows = await cur.fetchall()
            if len(rows) >= n:
                return rows[n - 1][0]  # type: ignore[no-any-return]  # jsonb: the driver's Any
            await asyncio.sleep(0.05)
    raise RuntimeError(f"warm process {n} of the thread never started")


async def _retired(admin_dsn: str, thread: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT payload ->> 'reason' FROM journal WHERE event_type = 'warm.retired' "
                                 "AND session_id = %s ORDER BY seq", [thread])
        return [r[0] for r in await cur.fetchall()]


def _direct_argv(argv: list[str], mcp_file: Path) -> list[str]:
    """A turn's command line as the CLI's own cold start: plain `-p` input, an MCP config without a credential."""
    out = [f"--mcp-config={mcp_file}" if a.startswith("--mcp-config=") else a for a in argv]
    if "--input-format" in out:
        i = out.index("--input-format")
        del out[i : i + 2]
    return out


async def phase(url: str, admin_dsn: str, turns: int, settle: float, warm: bool, env: dict[str, str],
                mcp_file: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"turn": [], "direct": [], "rss": [], "waited": []}
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(60, read=None)) as http:
        stream = Stream(http)
        await asyncio.wait_for(stream.connected.wait(), 30)
        thread = (await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
        for i in range(turns + 1):  # the first turn starts the conversation (always cold): not counted
            if i and warm:
                started = await _warm_started(admin_dsn, thread, i)
                await asyncio.sleep(settle)
                rss = process.tree_rss(started["pid"])
                if rss is not None:
                    out["rss"].append(rss)
            elif i:
                await asyncio.sleep(settle)
            t0 = time.perf_counter()
            (await http.post("/api/chat", json={"text": f"message {i}", "thread_id": thread})).raise_for_status()
            _, spawned = await stream.until(lambda ev: ev.event == "task.spawned")
            first, _ = await stream.until(lambda ev: ev.event.startswith("stream."))
            await stream.until(lambda ev: ev.event == "task.exited")
            payload = json.loads(spawned.data)["payload"]
            if not i:
                continue
            if warm and "warm" not in payload:
                print(f"    turn {i} ran cold (no warm process taken); warm processes ended so far: "
                      f"{await _retired(admin_dsn, thread)}", flush=True)
            if "warm" in payload:
                out["waited"].append(payload["warm"]["waited_s"])
            out["turn"].append(first - t0)
            # on a copy of the CLI's config directory: resuming the thread itself would add a turn to its
            # conversation, which the next warm process (started with the conversation as it was) must not miss
            copy = mcp_file.parent / "direct-config"
            await asyncio.to_thread(shutil.rmtree, copy, True)
            await asyncio.to_thread(shutil.copytree, env["CLAUDE_CONFIG_DIR"], copy, symlinks=True)
            out["direct"].append(await cold_spawn_to_first_line(
                _direct_argv(payload["argv"], mcp_file), {**env, "CLAUDE_CONFIG_DIR": str(copy)},
                payload["workdir"], f"direct {i}".encode()))
        stream.task.cancel()
    return out


def report(label: str, r: dict[str, list[float]], goal: float, per_turn: bool = True) -> None:
    print(label)
    print(f"    POST /api/chat -> first stream line at an SSE client: {stats.summary(r['turn'])}")
    print(f"    the CLI's own cold spawn -> first stdout line:        {stats.summary(r['direct'])}")
    ratio = stats.ratio(r["turn"], r["direct"], 50)
    print(f"    p50 ratio: {stats.fmt_ratio(ratio, f'goal <= {goal:g}x')}")
    record.latency("warm_" + label.split()[0].strip("():").lower(), f"POST /api/chat → first stream line, {label}",
                   r["turn"], r["direct"], 50, baseline_label="the CLI's own cold spawn → first line", goal=("<=", goal))
    if per_turn:
        # each turn next to its own direct spawn, back to back: the CLI's start varies by +-100 ms from run to run
        paired = [h / d for h, d in zip(r["turn"], r["direct"], strict=True)]
        p50 = stats.percentile(paired, 50)
        print(f"    per turn, against its own direct spawn: p50 {p50:.2f}x (n={len(paired)})" if p50 is not None
              else f"    per turn: too few pairs (n={len(paired)} < 20)")
    if r["rss"]:
        mib = sorted(x / 2**20 for x in r["rss"])
        print(f"    resident memory per warm process while it waits (sandbox + CLI): min {mib[0]:.1f} MiB  "
              f"median {stats.median(mib):.1f} MiB  max {mib[-1]:.1f} MiB (n={len(mib)})")
    if r["waited"]:
        print(f"    each warm process waited {stats.median(r['waited']):.1f} s (median, n={len(r['waited'])}) "
              "between its start and its message")


async def main(turns: int, settle: float, cold_only: bool) -> None:
    with services.scratch_store() as (tmp, db, model):
        env = services.service_env(db, model, tmp)
        mcp_file = tmp / "direct-mcp.json"
        async with services.running(db, {**env, "PETAL_WARM_TURNS": "0" if cold_only else "2"}) as svc:
            mcp_file.write_text(json.dumps(substrate.mcp_config(svc.mcp_url, "", None)))
            # the environment the executor gives its CLI, built the same way (docs/claude-cli.md: it matters)
            cli_env = substrate.build_env(substrate.SubstrateConfig(
                config_dir=svc.config_dir, base_env=env, max_retries=int(env["PETAL_CLAUDE_MAX_RETRIES"])),
                "bench-direct")
            print(f"before: {stats.machine_load()}; {turns} turns per phase, each sent {settle:g} s after the "
                  "previous one ended")
            if not cold_only:
                warm = await phase(svc.url, db.admin_dsn, turns, settle, True, cli_env, mcp_file)
                report("(a) warm turns on", warm, 0.5)
                services.stop(svc.executor)
                svc.executor = services.start("executor", {**env, "PETAL_WARM_TURNS": "0"})
                await services.executor_started(db.admin_dsn, 2)
            cold = await phase(svc.url, db.admin_dsn, turns, settle, False, cli_env, mcp_file)
            report("(b) warm turns off: the cold path", cold, 1.10)
            print(f"after: {stats.machine_load()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=20, help="measured turns per phase (a p50 needs 20)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between a turn's end and the next message")
    parser.add_argument("--cold-only", action="store_true",
                        help="(b) alone (also against a tree without warm turns, for a before/after)")
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.settle, args.cold_only))
