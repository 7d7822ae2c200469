"""Costs flat in the store's size: every read the page makes, and the executor's claims, settlement and threads
loop, on a big store next to the same read on a nearly empty one, in one run.

    python -m tests.bench.bench_store_scale --big-dsn DSN [--small-dsn DSN] [--samples 1000]
    python -m tests.bench.bench_store_scale [--events 10000000]      # seeds both stores first (slow)

DSNs are superuser DSNs of databases seeded by tests/bench/seed_store.py (migrated here to the current
schema first; on a big store a new index takes minutes, once). Without --small-dsn the baseline store is
made next to the big one: the same seeding at 1/100 of its journal (100,000 events, 2,100 tasks, 210 threads
for the default: the thread and task lists come back as full pages of 200 on both, and each thread is as
busy), so each read returns the same kind and amount of data and only the store's size differs. (A store
with nothing in it would answer every read with nothing, or 404.)

Each read is chosen the same way in both stores: the newest thread that is not archived, a worker of about
2,000 records (its events page returns the full 1,000), the head of the journal. One ingress process per
store, as deployed; reads are sent one at a time (latency, not throughput), alternating between the stores
within each round so a burst of load elsewhere lands on both. The executor's queries run through psycopg as
the executor's role (prepared after five runs, as in the service), inside a transaction rolled back.

Prints, per read: n, p50 and p99 (exact order statistics) on each store, and the ratio of the p99s
(goal <= 1.5x).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql

from executor.sql import queries as executor_sql
from petal_dispatch import dbpasswords, dbserver
from shared import migrate
from tests.bench import record, seed_store, stats
from tests.bench.bench_sse import wait_up
from tests.pg import Cluster
from tests.served import free_port

GOAL = 1.5
QS = (50, 90, 99)
# the executor row the claim query needs to see live (a benchmark's own name)
EXECUTOR = "bench-scale"
SSE_BACK = 1_000
# more threads than the page's thread list and task list show (200 each), so both stores answer full pages
LIST_FLOOR = 210


@dataclass
class Target:
    """One store, its ingress, and what its reads ask for."""

    label: str
    admin_dsn: str
    thread: uuid.UUID = uuid.UUID(int=0)
    worker: uuid.UUID = uuid.UUID(int=0)
    head: int = 0
    events: int = 0
    url: str = ""
    proc: subprocess.Popen[bytes] | None = None
    paths: dict[str, str] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)


def _role_dsn(admin: str, role: str) -> str:
    return dbserver.role_dsn(admin, role)


def prepare(t: Target) -> None:
    """Migrate, make the claim's executor live, and pick the reads' targets by the same rule in both stores."""
    started = time.monotonic()
    migrate.migrate(t.admin_dsn)
    took = time.monotonic() - started
    if took > 5:
        print(f"{t.label}: migrated to the current schema in {took:.0f} s")
    with psycopg.connect(t.admin_dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")  # statistics for indexes a migration just made, as autovacuum would soon
        conn.execute("INSERT INTO executors (name, capacity, lease_s, lease_until) VALUES (%s, 8, 30, now() + "
                     "interval '1 day') ON CONFLICT (name) DO UPDATE SET lease_until = now() + interval '1 day', "
                     "lost_at = NULL, stopped_at = NULL, epoch = 1", (EXECUTOR,))
        row = conn.execute("SELECT s.id FROM sessions s WHERE s.role = 'orchestrator' AND s.lifecycle <> 'archived' "
                           "AND (SELECT count(*) FROM tasks t WHERE t.session_id = s.id) >= 3 "
                           "ORDER BY s.created_at DESC LIMIT 1").fetchone()
        assert row is not None, f"{t.label}: no thread to read"
        t.thread = row[0]
        # the newest worker of about 2,000 records (at least 1,000: its first events page is full)
        best: tuple[int, uuid.UUID] | None = None
        for (worker,) in conn.execute("SELECT id FROM tasks WHERE role = 'worker' ORDER BY created_at DESC "
                                      "LIMIT 500").fetchall():
            n = conn.execute("SELECT count(*) FROM journal WHERE task_id = %s", (worker,)).fetchone()
            if n is not None and n[0] >= 1_000 and (best is None or abs(n[0] - 2_000) < best[0]):
                best = (abs(n[0] - 2_000), worker)
                if best[0] <= 500:
                    break
        if best is None:
            raise RuntimeError(f"{t.label}: no worker of 1,000 records or more")
        t.worker = best[1]
        head = conn.execute("SELECT last_seq FROM journal_head").fetchone()
        assert head is not None
        t.head = t.events = head[0]


def start_ingress(t: Target, tmp: Path) -> None:
    port = free_port()
    env = {**os.environ, "OPEN_MODE": "1", "PETAL_INGRESS_PORT": str(port),
           "PETAL_INGRESS_DSN": _role_dsn(t.admin_dsn, dbpasswords.INGRESS_ROLE),
           "PETAL_EXECUTOR_DSN": _role_dsn(t.admin_dsn, dbpasswords.EXECUTOR_ROLE),
           "PETAL_DATA_DIR": str(tmp / t.label), "PETAL_LOG_LEVEL": "warning"}
    t.proc = subprocess.Popen([sys.executable, "-m", "petal_dispatch.cli", "ingress"], env=env)
    t.url = f"http://127.0.0.1:{port}"


async def page_paths(t: Target, http: httpx.AsyncClient) -> None:
    """The page's reads (static/js/*.js), as it sends them, for this store's thread and worker."""
    th, w = t.thread, t.worker
    first = (await http.get(f"{t.url}/api/threads/{th}/conversation?limit=100")).json()["events"]
    before = first[len(first) // 2]["seq"] if first else t.head
    t.paths = {
        "conversation (chat.js)": f"/api/threads/{th}/conversation?limit=100",
        "conversation, paged back": f"/api/threads/{th}/conversation?before_seq={before}&limit=100",
        "thread list (threads.js)": "/api/threads",
        "projects (threads.js)": "/api/projects",
        "queue (chat.js)": f"/api/queue?thread_id={th}",
        "task list (tasks.js)": "/api/tasks?limit=200",
        "a thread's tasks (tasks.js)": f"/api/tasks?limit=500&thread_id={th}",
        "a task (tasks.js)": f"/api/tasks/{w}",
        "a task's events (tasks.js)": f"/api/tasks/{w}/events?limit=1000",
        "a task's first events": f"/api/tasks/{w}/events?limit=5",
        "a task's handoff (tasks.js)": f"/api/handoffs?scope_id={w}&limit=1",
        "a task's usage (tasks.js)": f"/api/usage?by=task&task_id={w}",
        "asks, pending (asks.js)": "/api/asks?status=pending&limit=100",
        "asks, answered (asks.js)": "/api/asks?status=answered&limit=20",
        "context (context.js)": f"/api/context?thread_id={th}",
        "a thread's usage (context.js)": f"/api/usage?by=thread&thread_id={th}",
        "gate rules (context.js)": f"/api/gate-rules?thread_id={th}",
        "executors (context.js)": "/api/executors",
        "activity (activity.js)": f"/api/events?after_seq={max(t.head - 200, 0)}&limit=200",
    }


_ID = re.compile(rb"^id: ?\d+$", re.MULTILINE)


async def sse_resume(url: str, after: int, expect: int) -> None:
    """An SSE client resuming `expect` events back: connects with Last-Event-ID, reads until it has them all."""
    port = int(url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    try:
        writer.write(f"GET /api/stream HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
                     f"Last-Event-ID: {after}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")):
            raise RuntimeError(f"stream refused: {head[:200]!r}")
        seen, buf = 0, b""
        while seen < expect:
            chunk = await reader.read(1 << 16)
            if not chunk:
                raise RuntimeError(f"the stream ended after {seen} of {expect} events")
            buf = (buf + chunk).replace(b"\r\n", b"\n")
            cut = buf.rfind(b"\n\n")
            if cut >= 0:
                seen += len(_ID.findall(buf[:cut]))
                buf = buf[cut + 2:]
    finally:
        writer.close()


# The executor's hot queries: claiming, settlement, the threads loop, the notifier (executor/sql/*.sql).
def executor_cases(t: Target) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        "claim (supervisor)": ("claim_pending_tasks", {"name": EXECUTOR, "epoch": 1, "labels": [],
                                                       "shared_config": True, "n": 4, "n_unattended": 3}),
        "stop requests (supervisor)": ("claim_stop_requests", {"name": EXECUTOR}),
        "settlement claim (settler)": ("claim_unsettled_task", {"skip": []}),
        "settled worker (settler)": ("get_settled_worker", {"id": t.worker}),
        "exit denials (settler)": ("get_exit_denials", {"id": t.worker}),
        "result line (settler)": ("get_task_result", {"id": t.worker, "max_bytes": 1024 * 1024}),
        "worker texts (extraction)": ("list_worker_texts", {"id": t.worker, "limit": 20}),
        "approvals (settler)": ("list_answered_approvals", {}),
        "threads with chat (threads loop)": ("list_threads_with_pending_chat", {"id": None}),
        "thread state (threads loop)": ("list_threads_with_pending_chat", {"id": t.thread}),
        "take chat (threads loop)": ("take_pending_chat", {"thread_id": t.thread, "origin": None, "limit": 50}),
        "thread controls (threads loop)": ("claim_thread_controls", {"executor": EXECUTOR}),
        "notify candidates (notifier)": ("list_notify_candidates", {"after": t.head - 100, "limit": 100}),
    }


def check_cases() -> None:
    """Every executor query is given what it names (said before the minutes of seeding, not after them)."""
    t = Target("check", "")
    t.thread = t.worker = uuid.uuid4()
    for label, (name, params) in executor_cases(t).items():
        if missing := set(re.findall(r"%\((\w+)\)s", executor_sql[name])) - set(params):
            raise SystemExit(f"bench_store_scale: {label} ({name}) is not given {sorted(missing)}")


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def run(big: Target, small: Target, samples: int, budget_s: float) -> None:
    targets = (small, big)
    limits = httpx.Limits(max_keepalive_connections=2)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        for t in targets:
            await wait_up(t.url)
            await page_paths(t, http)
        conns = {t.label: await psycopg.AsyncConnection.connect(_role_dsn(t.admin_dsn, dbpasswords.EXECUTOR_ROLE))
                 for t in targets}
        cases = {t.label: executor_cases(t) for t in targets}
        reads = list(small.paths)
        print(f"{len(reads)} page reads, SSE resume {SSE_BACK:,} back, {len(cases['small'])} executor queries; "
              f"{samples} rounds; {stats.machine_load()}", flush=True)

        async def get(t: Target, path: str) -> None:
            r = await http.get(t.url + path)
            r.raise_for_status()
            r.read()

        async def query(t: Target, name: str, params: dict[str, Any]) -> None:
            conn = conns[t.label]
            async with conn.transaction(force_rollback=True):
                await (await conn.execute(executor_sql[name], params)).fetchall()

        started = time.monotonic()
        try:
            for i in range(samples + 5):  # the first five rounds warm caches and prepared statements
                order = targets if i % 2 else targets[::-1]
                for read in reads:
                    for t in order:
                        t.samples.setdefault(read, []).append(await timed(functools.partial(get, t, t.paths[read])))
                for t in order:
                    key = f"SSE resume, {SSE_BACK:,} back"
                    t.samples.setdefault(key, []).append(
                        await timed(functools.partial(sse_resume, t.url, t.head - SSE_BACK, SSE_BACK)))
                for label in cases["small"]:
                    for t in order:
                        name, params = cases[t.label][label]
                        t.samples.setdefault(label, []).append(await timed(functools.partial(query, t, name, params)))
                if i == 4:
                    for t in targets:
                        t.samples.clear()
                if i % 100 == 99:
                    print(f"  round {i + 1 - 5}, {time.monotonic() - started:.0f} s", flush=True)
                if time.monotonic() - started > budget_s:
                    print(f"  stopped after {i + 1 - 5} rounds: the time budget ({budget_s:.0f} s) is spent", flush=True)
                    break
        finally:
            for c in conns.values():
                await c.close()
    report(big, small)


def report(big: Target, small: Target) -> None:
    print(f"\nbig store {big.events:,} events; baseline {small.events:,} events; {stats.machine_load()}")
    print(f"{'read':34s} {'baseline':>60s} {'big store':>60s}  p50 ratio  p90 ratio  p99 ratio (goal <= {GOAL}x)")
    worst = 0.0
    for read, base in small.samples.items():
        got = big.samples[read]
        r = stats.ratio(got, base, 99)
        worst = max(worst, r or 0)
        r50, r90 = stats.ratio(got, base, 50), stats.ratio(got, base, 90)
        print(f"{read:34s} {stats.summary(base, QS):>60s} {stats.summary(got, QS):>60s}  "
              f"{'-' if r50 is None else f'{r50:.2f}x':>9s}  {'-' if r90 is None else f'{r90:.2f}x':>9s}  "
              f"{stats.fmt_ratio(r, f'<= {GOAL}x')}{'' if r is None or r <= GOAL else '  OVER'}")
    print(f"worst p99 ratio {worst:.2f}x")
    # for the report: each read's ratio at the highest percentile its samples support (p99 from 1,000 rounds)
    n = min(len(v) for v in small.samples.values())
    q = next(q for q in (99, 90, 50) if n >= stats.min_samples(q))
    ratios = {read: stats.ratio(big.samples[read], base, q) for read, base in small.samples.items()}
    shown = [(read, r) for read, r in ratios.items() if r is not None]
    worst_read, worst_q = max(shown, key=lambda x: x[1])
    record.value("store_scale", f"the slowest of {len(shown)} reads on a {big.events:,}-event store against one of "
                 f"{small.events:,} ({worst_read})", worst_q, "×", n=n, stat=f"p{q} ratio", ratio=worst_q,
                 goal=("<=", GOAL))
    record.series("store_scale_reads", f"each read on {big.events:,} events against {small.events:,}, p{q} (n={n})",
                  "read", f"p{q} ratio, big store / baseline", {f"p{q} ratio": shown}, kind="barh")


def _db(cluster: Cluster, label: str) -> str:
    name = f"{label}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(cluster.root_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = cluster.dsn_for(name)
    migrate.migrate(dsn)
    return dsn


def small_shape(big_events: int) -> seed_store.Shape:
    """A store 1/100 of the big one's journal, with enough threads and tasks that the lists the page reads
    come back full on both (a page of threads and of tasks is 200: LIST_FLOOR), each thread as busy."""
    base = seed_store.Shape()
    scale = max(big_events, 1) / base.events
    threads = max(round(base.threads * scale / 100), LIST_FLOOR)
    return seed_store.Shape(events=max(round(big_events / 100), 100_000),
                            tasks=round(threads * base.tasks / base.threads), threads=threads, projects=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big-dsn", help="a superuser DSN of a store seeded by tests/bench/seed_store.py")
    parser.add_argument("--small-dsn", help="the baseline store (default: seeded here at 1/500 of the big one)")
    parser.add_argument("--events", type=int, default=seed_store.Shape.events,
                        help="without --big-dsn: the big store's size, seeded here first")
    parser.add_argument("--samples", type=int, default=1000, help="rounds (a p99 needs 1,000)")
    parser.add_argument("--budget-s", type=float, default=float("inf"),
                        help="stop the rounds after this long and report what was measured")
    args = parser.parse_args()
    check_cases()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        cluster: Cluster | None = None
        if args.big_dsn:
            big_dsn = args.big_dsn
            with psycopg.connect(big_dsn) as conn:
                head = conn.execute("SELECT last_seq FROM journal_head").fetchone()
            big_events = head[0] if head else 0
        else:
            cluster = Cluster.start(tmp / "pg")
            big_dsn = _db(cluster, "big")
            scale = args.events / seed_store.Shape.events
            shape = seed_store.Shape(events=args.events, tasks=max(round(20_000 * scale), 40),
                                     threads=max(round(2_000 * scale), 4))
            print(f"seeding the big store: {shape}", flush=True)
            seed_store.seed(big_dsn, shape, rebuild_indexes=args.events >= 1_000_000, quiet=False)
            big_events = args.events
        small_dsn, made = args.small_dsn, None
        if small_dsn is None:
            root = Cluster(psycopg.conninfo.make_conninfo(big_dsn, dbname="postgres")) if cluster is None else cluster
            small_dsn = made = _db(root, "baseline")
            seed_store.seed(small_dsn, small_shape(big_events))
        big, small = Target("big", big_dsn), Target("small", small_dsn)
        try:
            for t in (big, small):
                prepare(t)
                start_ingress(t, tmp)
            asyncio.run(run(big, small, args.samples, args.budget_s))
        finally:
            for t in (big, small):
                if t.proc is not None:
                    t.proc.terminate()
                    t.proc.wait(30)
            if cluster is not None:
                cluster.drop_all()
                cluster.close()
            elif made is not None:
                with psycopg.connect(psycopg.conninfo.make_conninfo(made, dbname="postgres"), autocommit=True) as conn:
                    name = psycopg.conninfo.conninfo_to_dict(made)["dbname"]
                    conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(str(name))))


if __name__ == "__main__":
    main()
