"""Journal append throughput next to the same server's raw COPY of identical rows, in one run.

    python -m tests.bench.bench_journal [--events 200000] [--batch 1000]

Uses PETAL_TEST_DSN when set, else an embedded server in a temporary directory. Prints events/s for
each round of each, their medians and the ratio of the medians (target: append >= 0.5 x raw COPY).
Rounds alternate so a burst of load elsewhere lands on both.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from psycopg_pool import AsyncConnectionPool

from shared import journal
from shared.models import NewEvent
from shared.sql import queries
from tests.bench import record, stats
from tests.pg import Cluster


def _events(n: int) -> list[NewEvent]:
    return [
        NewEvent(
            "stream.assistant",
            {"type": "assistant", "message": {"content": [{"type": "text", "text": f"token {i}\tand\\n"}]}, "i": i},
        )
        for i in range(n)
    ]


async def _bench_append(dsn: str, events: list[NewEvent], batch: int) -> float:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as pool:
        start = time.perf_counter()
        for i in range(0, len(events), batch):
            await journal.append(pool, events[i : i + batch])
        return time.perf_counter() - start


def _copy_text(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _encode_rows(events: list[NewEvent], first_seq: int) -> list[bytes]:
    """COPY text rows for the same events, built before the clock starts."""
    now = datetime.now(UTC).isoformat()
    return [
        (
            f"{uuid.uuid4()}\t{first_seq + i}\t\\N\t\\N\t\\N\t\\N\t\\N\t{ev.event_type}\t{ev.tier}\t{now}\t"
            f"{_copy_text(journal.encode_payload(ev.payload))}\n"
        ).encode()
        for i, ev in enumerate(events, start=1)
    ]


async def _bench_copy(dsn: str, events: list[NewEvent], batch: int, first_seq: int) -> float:
    """The floor: the server's COPY of identical rows, pre-encoded, in the same batches; no seq lock,
    no NOTIFY, no Python work inside the timed region."""
    rows = _encode_rows(events, first_seq)
    chunks = [b"".join(rows[i : i + batch]) for i in range(0, len(rows), batch)]
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        start = time.perf_counter()
        for chunk in chunks:
            async with conn.transaction(), conn.cursor().copy(queries["copy_journal"]) as copy:
                await copy.write(chunk)
        return time.perf_counter() - start


async def main(n: int, batch: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster.start(Path(tmp))
        db = cluster.create_migrated()
        try:
            # raw COPY writes seqs far above the journal's head so the two never collide
            copy_seq = 10**12
            append_t, copy_t = [], []
            for r in range(rounds):
                evs = _events(n)
                if r % 2 == 0:
                    append_t.append(await _bench_append(db.executor_dsn, evs, batch))
                    copy_t.append(await _bench_copy(db.admin_dsn, _events(n), batch, copy_seq))
                else:
                    copy_t.append(await _bench_copy(db.admin_dsn, _events(n), batch, copy_seq))
                    append_t.append(await _bench_append(db.executor_dsn, evs, batch))
                copy_seq += n
            a, c = n / stats.median(append_t), n / stats.median(copy_t)
            print(f"events={n} batch={batch} rounds={rounds}; {stats.machine_load()}")
            print(f"journal.append: {a:,.0f} events/s (median; rounds: "
                  + ", ".join(f"{n / t:,.0f}" for t in append_t) + ")")
            print(f"raw COPY:       {c:,.0f} events/s (median; rounds: " + ", ".join(f"{n / t:,.0f}" for t in copy_t)
                  + "; rows pre-encoded, same batches)")
            print(f"ratio append/COPY: {a / c:.2f}  (target >= 0.5)")
            record.value("journal_append", f"journal.append, events/s in batches of {batch} (median of {rounds} rounds)",
                         a, "events/s", n=rounds, stat="median", baseline=c,
                         baseline_label="the server's COPY of the same rows", baseline_n=rounds, ratio=a / c,
                         goal=(">=", 0.5))
        finally:
            cluster.drop_all()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.events, args.batch, args.rounds))
