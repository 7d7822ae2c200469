"""Fire latency of scheduled routines next to plain chat, in one run.

    python -m tests.bench.bench_routines [--fires 1000] [--rate 10]

One executor (in-process, the real loops) and the ingress on a fresh database. First the baseline: `--fires`
chat messages at `--rate` a second, each to a fresh thread through the ingress, sent on a timetable. Then as
many scheduled instants at the same rate from ten routines: their schedules are read on a test clock that
runs fast (one clock minute every 1/rate real seconds, `RoutinesConfig.clock_rate`), each routine firing on
every tenth clock minute, so a scheduled instant falls on a known real time. The two phases take turns rather
than overlap: together they would be twice the rate the goal names. The "claude" spawned is a script that
prints one result line and exits, so the figures are the path to the process: scheduled instant -> the run's
`task.spawned`, and chat sent -> its turn's `task.spawned` (the database's clock for both ends but the
instant, whose real time the test clock fixes, and the send). Printed: each with its sample count and exact
order statistics, the ratio of the p99s (goal: routines <= 1.5x chat), and the load average after each phase.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg

from executor.routines import RoutinesConfig
from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.bench import record, services, stats
from tests.bench.stats import fmt_pct, percentile, ratio
from tests.harness import running_executor
from tests.pg import DB, Cluster
from tests.served import ingress_server

RESULT = ('{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"x",'
          '"num_turns":1,"duration_ms":1,"total_cost_usd":0}')
ROUTINES = 10


class FastClock:
    """Clock time = base + (real time since t0) * rate: a clock minute every 60/rate real seconds."""

    def __init__(self, base: datetime, rate: float):
        self.base, self.rate, self.t0 = base, rate, time.time()

    def __call__(self) -> datetime:
        return self.base + timedelta(seconds=(time.time() - self.t0) * self.rate)

    def real(self, at: datetime) -> datetime:
        """When (real, UTC) the clock shows `at`."""
        return datetime.fromtimestamp(self.t0 + (at - self.base).total_seconds() / self.rate, UTC)


def _quick_claude(tmp: Path) -> Path:
    return services.fake_cli(tmp / "fake-cli" / "quick-claude", f"cat > /dev/null\necho '{RESULT}'")


async def run(tmp: Path, fires: int, rate: float) -> tuple[list[float], list[float]]:
    cluster = Cluster.start(tmp / "pg")
    db = cluster.create_migrated()
    os.environ["PETAL_CLAUDE_BIN"] = str(_quick_claude(tmp))
    # a clock minute per 1/rate s; the first instants come once everything is up
    clock_rate = 60.0 * rate
    base = datetime(2026, 1, 5, 0, 0, tzinfo=UTC)
    clock = FastClock(base - timedelta(days=1), clock_rate)  # far before the schedules until all is set up
    try:
        with ScriptedModelServer(Scenario()) as model:
            async with running_executor(db, model, tmp, routines=RoutinesConfig(
                    clock=clock, clock_rate=clock_rate, missed_grace_s=1e9), max_workers=64) as h, \
                    ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
                # a thread per message, so each starts a turn at once (made in the store: the API's thread control
                # is not what is measured)
                threads = [str(uuid.uuid4()) for _ in range(fires)]
                with psycopg.connect(db.admin_dsn) as conn:
                    conn.cursor().executemany(
                        "INSERT INTO sessions (id, role, lifecycle, mode) VALUES (%s, 'orchestrator', 'idle', 'autonomous')",
                        [(t,) for t in threads])
                for i in range(ROUTINES):  # routine i fires on the clock minutes ≡ i (mod 10)
                    made = await http.post("/api/routines", json={
                        "name": f"r{i}", "prompt": "tick", "schedule": {
                            "cron": f"{i}-59/{ROUTINES} * * * *", "tz": "UTC", "overlap": "parallel"}})
                    assert made.status_code == 202, made.text
                # first the baseline: chat at the same rate, to fresh threads, each spawned (a slow tail is
                # measured, not cut off); the routines' clock stands a day before their schedules meanwhile
                # (sent on a timetable, each POST in a task of its own: a slow answer does not hold back the next)
                sent: dict[str, datetime] = {}
                posts = []
                t0 = time.time() + 1.0
                for i in range(fires):
                    await asyncio.sleep(max(0.0, t0 + i / rate - time.time()))
                    sent[threads[i]] = datetime.now(UTC)
                    posts.append(asyncio.create_task(http.post("/api/chat", json={
                        "text": f"hello {i}", "thread_id": threads[i]})))
                await asyncio.gather(*posts)
                await _all_spawned(db)
                print(f"after chat: load average {os.getloadavg()[0]:.2f}")
                # then the routines: the clock shows `base` two seconds from now; the schedules start there
                # (nothing before is owed)
                clock.base, clock.t0 = base, time.time() + 2.0
                with psycopg.connect(db.admin_dsn) as conn:
                    conn.execute("UPDATE routines SET scheduled_through = %s, next_fire_at = %s + make_interval("
                                 "mins => CASE WHEN name = 'r0' THEN 10 ELSE substring(name from 2)::int END)",
                                 [base, base])
                end = base + timedelta(minutes=fires)
                while clock() < end + timedelta(minutes=1):
                    await asyncio.sleep(0.2)
                # every instant up to `end` made a run (a lagging schedule is measured, not cut off) ...
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    with psycopg.connect(db.admin_dsn) as conn:
                        count = conn.execute("SELECT count(*) FROM routine_runs WHERE scheduled_at <= %s",
                                            [end]).fetchone()
                    if count is not None and count[0] >= fires:
                        break
                    await asyncio.sleep(0.5)
                with psycopg.connect(db.admin_dsn) as conn:
                    conn.execute("UPDATE routines SET enabled = false")
                await _all_spawned(db)  # ... and every run spawned
                print(f"after routines: load average {os.getloadavg()[0]:.2f}")
                with psycopg.connect(db.admin_dsn) as conn:
                    routine_rows = conn.execute(
                        "SELECT r.scheduled_at, j.created_at, d.created_at FROM routine_runs r JOIN journal j"
                        " ON j.task_id = r.task_id AND j.event_type = 'task.spawned' JOIN journal d ON d.task_id = r.task_id"
                        " AND d.event_type = 'task.dispatch_requested' WHERE r.scheduled_at <= %s", [end]).fetchall()
                    steps = conn.execute(
                        "SELECT r.scheduled_at, r.created_at, r.started_at, d.created_at FROM routine_runs r"
                        " JOIN journal d ON d.task_id = r.task_id AND d.event_type = 'task.dispatch_requested'"
                        " WHERE r.scheduled_at <= %s", [end]).fetchall()
                    made_runs = conn.execute("SELECT status, count(*) FROM routine_runs GROUP BY 1").fetchall()
                    print("routine runs by status:", made_runs, "tasks:", conn.execute(
                        "SELECT role, status, count(*) FROM tasks GROUP BY 1, 2").fetchall())
                    chat_rows = conn.execute(
                        "SELECT c.created_at, j.created_at, d.created_at, c.thread_id FROM chat_queue c JOIN journal u"
                        " ON u.message_id = c.id AND u.event_type = 'task.user_message' JOIN journal j"
                        " ON j.task_id = u.task_id AND j.event_type = 'task.spawned' JOIN journal d ON d.task_id = u.task_id"
                        " AND d.event_type = 'task.dispatch_requested'").fetchall()
                del h
    finally:
        cluster.drop_all()
        cluster.close()
    fired = [(spawned - clock.real(at)).total_seconds() for at, spawned, _ in routine_rows]
    # chat from the moment the client sends it (the user's view), as a schedule's instant is the routine's
    chatted = [(spawned - sent[str(thread)]).total_seconds() for _, spawned, _, thread in chat_rows]
    queued_only = [(spawned - queued).total_seconds() for queued, spawned, _, _ in chat_rows]
    print(f"  chat: queued row -> task.spawned {fmt_pct(queued_only, 50)} (the POST's own time left out)")
    for name, i, j in (("instant -> run row", 0, 1), ("run row -> start", 1, 2), ("start -> requested", 2, 3)):
        values = [((r[j] - (clock.real(r[i]) if i == 0 else r[i])).total_seconds()) for r in steps]
        print(f"  routine: {name} {fmt_pct(values, 50)}")
    # where the time goes: up to the task's request, then the supervisor's claim and spawn
    for label, rows, start in (("routine", routine_rows, clock.real), ("chat", chat_rows, lambda t: t)):
        before = [(r[2] - start(r[0])).total_seconds() for r in rows]
        after = [(r[1] - r[2]).total_seconds() for r in rows]
        print(f"  {label}: to task.dispatch_requested {fmt_pct(before, 50)}; requested -> spawned {fmt_pct(after, 50)}")
    return fired, chatted


async def _all_spawned(db: DB, timeout: float = 300) -> None:
    """Until nothing waits to be spawned: no pending task and no queued run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with psycopg.connect(db.admin_dsn) as conn:
            left = conn.execute("SELECT count(*) FROM tasks WHERE status = 'pending'").fetchone()
            queued = conn.execute("SELECT count(*) FROM routine_runs WHERE status = 'queued'").fetchone()
        if left == (0,) and queued == (0,):
            return
        await asyncio.sleep(0.5)


async def main(fires: int, rate: float) -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmpdir:
        fired, chatted = await run(Path(tmpdir), fires, rate)
    print(f"{rate:g} fires/s from {ROUTINES} routines, after chat at the same rate (from the client's send)")
    for label, values in (("scheduled instant -> task.spawned", fired), ("chat sent -> task.spawned", chatted)):
        print(f"  {label:<36} n={len(values)}  {fmt_pct(values, 50)}  {fmt_pct(values, 90)}  {fmt_pct(values, 99)}"
              f"  max {max(values) * 1000:.2f} ms" if values else f"  {label}: no samples")
    # the goal's p99 from 1,000 fires; a quick run (fewer) is held to the same bound at p90
    record.latency("routine_fire", f"a routine's scheduled instant → task.spawned, {rate:g} fires/s", fired, chatted,
                   99 if len(fired) >= stats.min_samples(99) else 90,
                   baseline_label="chat sent → task.spawned, same rate", goal=("<=", 1.5))
    for q in (50, 90, 99):
        r = ratio(fired, chatted, q)
        if r is not None:
            print(f"  routine / chat p{q}: {r:.2f}x (goal p99 <= 1.5x)")
        elif percentile(fired, 50) is not None:
            print(f"  routine / chat p{q}: too few samples (n={min(len(fired), len(chatted))})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fires", type=int, default=200)
    parser.add_argument("--rate", type=float, default=10.0)
    args = parser.parse_args()
    asyncio.run(main(args.fires, args.rate))
