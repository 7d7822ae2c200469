"""Load generator for the benchmarks, run as several processes so it measures the server, not itself.

    python -m tests.bench.sse_load clients URL PATH N EXPECT TIMEOUT
    python -m tests.bench.sse_load post URL PATH SECONDS CONCURRENCY

Each process prints JSON lines on stdout: {"ready": true} once its clients are connected (clients mode),
then one result that includes `cpu`, the share of one core the process used while it measured. A
result is only worth as much as that share leaves headroom (see HEADROOM).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.bench.stats import CpuClock

# A generator process busier than this share of a core, or waiting for a CPU more than STARVED of the
# time, may itself have capped the rate it reports.
HEADROOM = 0.7
STARVED = 0.2
# Load generator processes per trial; each takes its share of the clients.
PROCESSES = max(2, min(8, (os.cpu_count() or 2) * 2))


# One event block's id and its payload's send time: regexes over raw bytes, so a client costs little
# more than reading its socket (httpx with a line-by-line SSE parser and json.loads per event took most
# of a core at the rates that matter, and the generators, not the server, set the figure).
_ID = re.compile(rb"^id: ?(\d+)$", re.MULTILINE)
_SENT = re.compile(rb'"t": ?([0-9.eE+-]+)')


async def one_client(url: str, path: str, expect: int, ready: asyncio.Event, counter: list[int],
                     lat: list[float], seqs: list[int]) -> None:
    """One SSE client over a bare socket. HTTP/1.0, so the body arrives unframed (no chunked encoding to
    undo) and ends when the server closes."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 22)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")):
            raise RuntimeError(f"stream refused: {head[:80]!r}")
        counter[0] += 1
        if counter[0] == counter[1]:
            ready.set()
        buf = b""
        while len(seqs) < expect:
            chunk = await reader.read(1 << 16)
            if not chunk:
                return
            now = time.time()
            # sse-starlette ends lines with CRLF, the bare server with LF
            buf = (buf + chunk).replace(b"\r\n", b"\n")
            cut = buf.rfind(b"\n\n")
            if cut < 0:
                continue
            whole, buf = buf[:cut], buf[cut + 2:]
            for block in whole.split(b"\n\n"):
                found = _ID.search(block)
                if found is None:
                    continue  # a comment or heartbeat
                seqs.append(int(found.group(1)))
                sent = _SENT.search(block)
                if sent is not None:
                    lat.append(now - float(sent.group(1)))
    finally:
        writer.close()


async def clients(url: str, path: str, n: int, expect: int, timeout: float) -> dict[str, object]:
    ready = asyncio.Event()
    counter = [0, n]
    lats: list[list[float]] = [[] for _ in range(n)]
    seqs: list[list[int]] = [[] for _ in range(n)]
    tasks = [asyncio.create_task(one_client(url, path, expect, ready, counter, lats[i], seqs[i]))
             for i in range(n)]
    await asyncio.wait_for(ready.wait(), 60)
    print(json.dumps({"ready": True, "connected": counter[0]}), flush=True)
    clock = CpuClock()
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    cpu, starved = clock.busy(), clock.starved()
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    complete = sum(1 for s in seqs if len(s) >= expect and s == sorted(s) and len(set(s)) == len(s))
    return {"complete": complete, "clients": n, "latencies": [x for lat in lats for x in lat],
            "max_latency": max((max(lat) for lat in lats if lat), default=None), "cpu": cpu, "starved": starved}


async def post(url: str, path: str, seconds: float, concurrency: int) -> dict[str, object]:
    ok = 0
    stop = time.monotonic() + seconds

    async def worker(http: httpx.AsyncClient, w: int) -> None:
        nonlocal ok
        i = 0
        while time.monotonic() < stop:
            i += 1
            r = await http.post(path, json={"text": f"bench {os.getpid()} {w}-{i}"})
            ok += r.status_code == 202
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as http:
        clock = CpuClock()
        start = time.monotonic()
        await asyncio.gather(*(worker(http, w) for w in range(concurrency)))
        return {"ok": ok, "rps": ok / (time.monotonic() - start), "cpu": clock.busy(), "starved": clock.starved()}


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.bench.sse_load", *args,
                                                stdout=asyncio.subprocess.PIPE, limit=1 << 28)


class Generators:
    """`n` SSE clients spread over PROCESSES load generator processes, connected on entry.

    `results()` waits for every process's result; `headroom` says whether each stayed under HEADROOM.
    """

    def __init__(self, url: str, path: str, n: int, *, expect: int, timeout: float, processes: int = PROCESSES):
        self.args = (url, path, n, expect, timeout)
        self.processes = max(1, min(processes, n))
        self.procs: list[asyncio.subprocess.Process] = []
        self.connected = 0

    async def __aenter__(self) -> Generators:
        url, path, n, expect, timeout = self.args
        shares = [n // self.processes + (i < n % self.processes) for i in range(self.processes)]
        self.procs = [await _spawn("clients", url, path, str(k), str(expect), str(timeout)) for k in shares]
        for p in self.procs:
            assert p.stdout is not None
            line = json.loads(await asyncio.wait_for(p.stdout.readline(), 120))
            self.connected += line["connected"]
        return self

    async def results(self) -> dict[str, Any]:
        out: list[dict[str, Any]] = []
        for p in self.procs:
            assert p.stdout is not None
            out.append(json.loads(await asyncio.wait_for(p.stdout.readline(), 600)))
            await p.wait()
        lats = [x for r in out for x in r["latencies"]]
        return {"complete": sum(r["complete"] for r in out), "clients": sum(r["clients"] for r in out),
                "latencies": lats, "max_latency": max(lats) if lats else None,
                "cpu": [r["cpu"] for r in out], "starved": [r["starved"] for r in out], "headroom": _headroom(out)}

    async def __aexit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.returncode is None:
                p.kill()
                await p.wait()


async def posts(url: str, path: str, seconds: float, concurrency: int,
                processes: int = PROCESSES) -> dict[str, Any]:
    """POST requests from several processes at once; their summed rate and each one's CPU share."""
    per = max(1, concurrency // processes)
    procs = [await _spawn("post", url, path, str(seconds), str(per)) for _ in range(processes)]
    out = []
    for p in procs:
        assert p.stdout is not None
        out.append(json.loads(await asyncio.wait_for(p.stdout.readline(), seconds + 120)))
        await p.wait()
    return {"rps": sum(r["rps"] for r in out), "cpu": [r["cpu"] for r in out],
            "starved": [r["starved"] for r in out], "headroom": _headroom(out)}


def _headroom(results: list[dict[str, Any]]) -> bool:
    return all(r["cpu"] < HEADROOM and r["starved"] < STARVED for r in results)


def main() -> None:
    mode, url, path, *rest = sys.argv[1:]
    if mode == "clients":
        result = asyncio.run(clients(url, path, int(rest[0]), int(rest[1]), float(rest[2])))
    else:
        result = asyncio.run(post(url, path, float(rest[0]), int(rest[1])))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
