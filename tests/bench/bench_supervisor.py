"""Supervisor cost and line latency, each next to a baseline measured in the same run.

    python -m tests.bench.bench_supervisor [--lines-per-worker 5000] [--workers 8]

(a) 8 concurrent workers whose "claude" is a replayer printing a recorded stream-json transcript (with
    partial messages) as fast as the pipe takes it: lines journaled per second by the supervisor, next
    to the bare journal append rate of the same lines (goal >= 0.8).
(b) the real CLI on the scripted model streaming token by token (--include-partial-messages): delay
    from a line being read off the process's stdout to the NOTIFY that announces it, p50 and p99, next
    to a minimal loop that reads the same kind of process's lines and INSERTs + NOTIFYs each one on its
    own (goal: p99 within 2x of that loop's).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from psycopg_pool import AsyncConnectionPool

from executor.run import process, stream, substrate
from executor.settle import dispatch
from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from shared import journal
from shared.listener import Listener
from shared.models import NewEvent
from tests.bench import record, services, stats
from tests.harness import config_for, running_supervisor, substrate_for, worker
from tests.pg import Cluster

TRANSCRIPT = Path(__file__).parent.parent / "transcripts" / "partial_messages.jsonl"


def _replayer(tmp: Path, repeats: int) -> Path:
    lines = [ln for ln in TRANSCRIPT.read_bytes().split(b"\n") if ln.strip()]
    # the transcript inside the script: the sandbox shows a spawn its CLI, not the rest of /tmp
    body = b"\n".join(lines * repeats).decode()
    return services.fake_cli(tmp / "fake-cli" / "replay-claude", f"cat <<'TRANSCRIPT'\n{body}\nTRANSCRIPT")


async def supervisor_round(cluster: Cluster, tmp: Path, script: Path, workers: int, total: int) -> tuple[float, float]:
    """Lines/s journaled by the supervisor on the journal's own clock (first spawn to last exit), and
    this process's CPU seconds meanwhile (the supervisor, its readers and its writer all run here)."""
    db = cluster.create_migrated()
    with ScriptedModelServer(Scenario()) as model:
        sub = replace(substrate_for(model, tmp), claude_bin=str(script))
        async with running_supervisor(db.executor_dsn, db.admin_dsn, sub,
                                      config_for(tmp, max_workers=workers)) as h:
            cpu0 = _cpu()
            ids = [await h.dispatch(f"replay {i}") for i in range(workers)]
            for t in ids:
                await h.wait_final(t, timeout=600)
            cpu = _cpu() - cpu0
            events = await h.events()
    spawned = min(e.created_at for e in events if e.event_type == "task.spawned")
    exited = max(e.created_at for e in events if e.event_type == "task.exited")
    cluster.drop(db)
    assert sum(e.event_type.startswith("stream.") for e in events) == total
    return total / (exited - spawned).total_seconds(), cpu


async def bare_round(cluster: Cluster, base: list[bytes], repeats: int, workers: int) -> tuple[float, float]:
    """Lines/s of journal.append for the same rows in batches of 2,000, built before the clock starts."""
    db = cluster.create_migrated()
    lines = [stream.classify(raw) for raw in base] * repeats
    async with AsyncConnectionPool(db.executor_dsn, min_size=1, max_size=1, open=False) as pool:
        # identical rows: each worker's lines carry its task and session ids, as the supervisor's do
        events = []
        for _ in range(workers):
            task_id, session_id = uuid.uuid4(), uuid.uuid4()
            async with pool.connection() as conn:
                await conn.execute("INSERT INTO sessions (id, role, lifecycle) VALUES (%s, 'worker', 'running')",
                                   [session_id])
                await conn.execute("INSERT INTO tasks (id, role, session_id) VALUES (%s, 'worker', %s)",
                                   [task_id, session_id])
            events += [NewEvent(ln.event_type, ln.payload, task_id=task_id, session_id=session_id,
                                payload_json=ln.payload_json, created_at=datetime.now(UTC)) for ln in lines]
        for t in {e.event_type for e in events}:
            await journal.register_event_type(pool, t, "raw")
        cpu0 = _cpu()
        start = time.perf_counter()
        for i in range(0, len(events), 2000):
            await journal.append(pool, events[i : i + 2000])
        rate = len(events) / (time.perf_counter() - start)
        cpu = _cpu() - cpu0
    cluster.drop(db)
    return rate, cpu


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def bench_throughput(cluster: Cluster, tmp: Path, workers: int, per_worker: int, rounds: int) -> None:
    base = [ln for ln in TRANSCRIPT.read_bytes().split(b"\n") if ln.strip()]
    repeats = max(1, per_worker // len(base))
    total = repeats * len(base) * workers
    script = _replayer(tmp, repeats)
    sup, bare = [], []
    for r in range(rounds):  # alternating, so a burst of load elsewhere lands on both
        order = (True, False) if r % 2 == 0 else (False, True)
        for supervised in order:
            if supervised:
                sup.append(await supervisor_round(cluster, tmp, script, workers, total))
            else:
                bare.append(await bare_round(cluster, base, repeats, workers))
    print(f"(a) {workers} replaying workers, {total} lines, {rounds} alternating rounds")
    print("    supervisor journaled: " + ", ".join(f"{x:,.0f}" for x, _ in sup) + " lines/s (spawn to last exit)")
    print("    bare journal append:  " + ", ".join(f"{x:,.0f}" for x, _ in bare) + " lines/s")
    ratio = stats.median([x for x, _ in sup]) / stats.median([x for x, _ in bare])
    print(f"    ratio of medians: {ratio:.2f}  (goal >= 0.8)")
    record.value("supervisor_lines", f"lines/s journaled by the supervisor from {workers} replaying workers (median "
                 f"of {rounds} rounds)", stats.median([x for x, _ in sup]), "lines/s", n=rounds, stat="median",
                 baseline=stats.median([x for x, _ in bare]), baseline_label="bare journal append of the same rows",
                 baseline_n=rounds, ratio=ratio, goal=(">=", 0.8))
    print(f"    CPU of this process per line (robust to load): supervisor "
          f"{stats.median([c for _, c in sup]) / total * 1e6:.1f} us (reading, parsing, batching, appending), "
          f"bare append {stats.median([c for _, c in bare]) / total * 1e6:.1f} us")


async def _notify_times(dsn: str, channel: str, sink: dict[int, datetime], stop: asyncio.Event) -> Listener:
    listener = Listener(dsn, [channel])
    sub = listener.subscribe([channel])

    async def drain() -> None:
        while True:
            note = await sub.get()
            head = note.payload.partition(" ")[0]  # `<last seq>`, or `<last seq> <the rows>` (shared/sql/journal.sql)
            if head.isdigit():
                sink.setdefault(int(head), datetime.now(UTC))

    asyncio.create_task(drain())
    asyncio.create_task(listener.run())
    await listener.connected.wait()
    return listener


def _latencies(read_at: dict[int, datetime], notified: dict[int, datetime]) -> list[float]:
    marks = sorted(notified.items())
    out = []
    j = 0
    for seq in sorted(read_at):
        while j < len(marks) and marks[j][0] < seq:
            j += 1
        if j < len(marks):
            out.append((marks[j][1] - read_at[seq]).total_seconds() * 1000)
    return out


async def bench_latency(cluster: Cluster, tmp: Path, tokens: int) -> None:
    text = " ".join(f"w{i}" for i in range(tokens))
    scenario = Scenario.single({"text": text, "delay_s": 0.005})
    db = cluster.create_migrated()
    stop = asyncio.Event()
    with ScriptedModelServer(scenario) as model:
        # the partial-messages flag makes the CLI print one line per token
        sub = replace(substrate_for(model, tmp), extra_args=("--include-partial-messages",))
        notified: dict[int, datetime] = {}
        await _notify_times(db.executor_dsn, "journal", notified, stop)
        async with running_supervisor(db.executor_dsn, db.admin_dsn, sub, config_for(tmp)) as h:
            tid = await dispatch.request(h.db.pool, worker("stream", workdir=config_for(tmp).default_workdir))
            await h.wait_final(tid, timeout=300)
            await asyncio.sleep(0.5)
            evs = [e for e in await h.events(tid) if e.event_type.startswith("stream.")]
        sup = _latencies({e.seq: e.created_at for e in evs}, notified)

        # baseline: read the same CLI's lines; INSERT + NOTIFY each on its own
        base_notified: dict[int, datetime] = {}
        await _notify_times(db.executor_dsn, "bench_line", base_notified, stop)
        spec = substrate.SpawnSpec(role="worker", prompt="stream", session_uuid=str(uuid.uuid4()))
        cmd = substrate.build_command(sub, spec)
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                    stdin=asyncio.subprocess.PIPE,
                                                    env=substrate.build_env(sub, "bench"), cwd=tmp)
        assert proc.stdin is not None  # the prompt on stdin, as the runner gives it (not on the command line)
        proc.stdin.write(substrate.stdin_input(spec))
        await proc.stdin.drain()
        proc.stdin.close()
        read_at: dict[int, datetime] = {}
        seq = 10**12
        async with await psycopg.AsyncConnection.connect(db.executor_dsn, autocommit=True) as conn:
            assert proc.stdout is not None
            async for raw in process.iter_lines(proc.stdout):
                seq += 1
                read_at[seq] = datetime.now(UTC)
                line = stream.classify(raw)
                await conn.execute(
                    "INSERT INTO journal (event_id, seq, event_type, tier, payload) "
                    "VALUES (gen_random_uuid(), %s, 'stream.other', 'raw', %s::jsonb)",
                    [seq, journal.encode_payload(line.payload)])
                await conn.execute("SELECT pg_notify('bench_line', %s)", [str(seq)])
        await proc.wait()
        await asyncio.sleep(0.5)
        base = _latencies(read_at, base_notified)
    cluster.drop(db)
    print("(b) real CLI, token-by-token stream")
    print(f"    supervisor read->NOTIFY:   {stats.summary(sup, scale=1.0)}")
    print(f"    minimal loop read->NOTIFY: {stats.summary(base, scale=1.0)}")
    print(f"    p99 ratio supervisor/loop: {stats.fmt_ratio(stats.ratio(sup, base, 99), 'goal <= 2')}")
    record.latency("supervisor_stream", "the real CLI's streamed line, read → NOTIFY", sup, base, 99,
                   baseline_label="a minimal read-INSERT-NOTIFY loop", goal=("<=", 2.0), scale=1.0)


async def main(workers: int, per_worker: int, tokens: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        cluster = Cluster.start(tmp / "pg")
        try:
            print(f"before: {stats.machine_load()}")
            await bench_throughput(cluster, tmp, workers, per_worker, rounds)
            await bench_latency(cluster, tmp, tokens)
            print(f"after: {stats.machine_load()}")
        finally:
            cluster.drop_all()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--lines-per-worker", type=int, default=5000)
    parser.add_argument("--tokens", type=int, default=1200, help="streamed lines in (b) (a p99 needs 1000)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.workers, args.lines_per_worker, args.tokens, args.rounds))
