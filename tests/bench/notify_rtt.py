"""Bare LISTEN/NOTIFY round trips in a process of their own, for a baseline taken while the system under
test is loaded (not after it, on a quiet machine), one every GAP_S:

    python -m tests.bench.notify_rtt DSN N     N round trips
    python -m tests.bench.notify_rtt DSN -     until standard input closes (the trial's end)

prints the round trips' seconds as JSON. `beside(dsn)` runs it from a benchmark's event loop."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

import psycopg

GAP_S = 0.004  # light enough not to load what it stands beside (at 2 ms the SSE trial's p99 doubled); 1,000+ in its 5 s


def rtts(dsn: str, n: int | None, stop: threading.Event) -> list[float]:
    out: list[float] = []
    with psycopg.connect(dsn, autocommit=True) as lis, psycopg.connect(dsn, autocommit=True) as snd:
        lis.execute("LISTEN bench_rtt_beside")
        while not stop.is_set() and (n is None or len(out) < n):
            t = time.perf_counter()
            snd.execute("SELECT pg_notify('bench_rtt_beside', %s)", [str(len(out))])
            next(lis.notifies())
            out.append(time.perf_counter() - t)
            time.sleep(GAP_S)
    return out


class Beside:
    """The round trips taken for as long as a trial runs: `async with Beside(dsn) as b:` ... `b.rtts`."""

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.rtts: list[float] = []
        self._proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Beside:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.bench.notify_rtt", self.dsn, "-",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._proc is not None
        out, _ = await self._proc.communicate(b"")  # closes its stdin: it stops and prints
        self.rtts = json.loads(out)


def main(dsn: str, count: str) -> None:
    stop = threading.Event()
    if count == "-":
        def until_closed() -> None:
            sys.stdin.read()
            stop.set()
        threading.Thread(target=until_closed, daemon=True).start()
    print(json.dumps(rtts(dsn, None if count == "-" else int(count), stop)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
