"""Fan-out at scale: what an SSE client costs an ingress, and how many ingress processes 10,000 clients need.

    python -m tests.bench.bench_fanout [--clients 2000] [--rate 20] [--seconds 10]
    python -m tests.bench.bench_fanout --measure 10000 [--processes 3] [--steps 1000,2500,5000,10000]

(a) One ingress process, as deployed, with `--clients` SSE clients connected while the executor's role appends
    `--rate` events/s for `--seconds`: the ingress's resident memory idle and with the clients connected, its
    CPU while they were only connected (heartbeats) and while events flowed, each also per client; how many
    clients got every event in order, and append -> client latency (p50/p99 with n).
(b) The same clients split over 2, 3 and 4 ingress processes on the one database (as behind one proxy): each
    process's CPU and memory, per client.
(c) The extrapolation to 10,000 clients at the same event rate, from the per-client costs measured in (a) and
    (b), stated as such: the CPU they need, in ingress processes (one event loop each, loaded to at most
    HEADROOM of a core), and the memory.

(d) `--measure N`: N clients measured, not extrapolated: `--processes` ingress processes behind one port
    (PETAL_INGRESS_REUSE_PORT: SO_REUSEPORT), clients added in `--steps` up to N while 2 events/s are appended
    (`--measure-rate`); at each step every client must get every event in order, and it prints append -> client
    p50/p99 (n) next to bare NOTIFY round trips taken meanwhile by a process of their own (the floor), the
    processes' RSS and CPU per client, and the knee: the first step whose p50 is more than twice the floor's
    ratio at the first step.

The load generator (tests/bench/sse_load.py) runs as several processes over bare sockets; each one's CPU share
and run-queue wait is printed, and a phase whose generators lacked headroom says so (its client figures then
bound the generators, not the ingress). The appender runs here.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
from psycopg_pool import AsyncConnectionPool

from tests.bench import notify_rtt, record, stats
from tests.bench.bench_sse import append_at
from tests.bench.sse_load import HEADROOM, PROCESSES, Generators
from tests.pg import DB, Cluster
from tests.served import free_port

TARGET_CLIENTS = 10_000
# how long the clients stay connected before events flow (the heartbeat-only CPU is measured over it)
IDLE_S = 5.0
MB = 1024 * 1024


@dataclass
class Ingress:
    url: str
    proc: subprocess.Popen[bytes]
    ps: psutil.Process

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def waited(self) -> float:
        """Seconds its event loop's thread spent runnable but waiting for a CPU (Linux schedstat): an
        ingress starved by the machine delivers late while its own CPU share looks small."""
        try:
            with open(f"/proc/{self.ps.pid}/schedstat") as f:
                return int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0


def start_ingress(db: DB, tmp: Path, i: int, port: int | None = None) -> Ingress:
    """An ingress process; given a `port`, one that shares it with the others started so (SO_REUSEPORT)."""
    shared = port is not None
    port = port or free_port()
    env = {**os.environ, "OPEN_MODE": "1", "PETAL_INGRESS_PORT": str(port), "PETAL_INGRESS_DSN": db.ingress_dsn,
           "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_DATA_DIR": str(tmp / f"ingress{i}"),
           "PETAL_LOG_LEVEL": "warning", "PETAL_INGRESS_REUSE_PORT": "1" if shared else "0"}
    proc = subprocess.Popen([sys.executable, "-m", "petal_dispatch.cli", "ingress"], env=env)
    return Ingress(f"http://127.0.0.1:{port}", proc, psutil.Process(proc.pid))


async def wait_up(url: str, timeout: float = 180) -> None:
    """Until the ingress answers (on a loaded machine a start takes tens of seconds)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=url) as http:
        while True:
            try:
                await http.get("/healthz")
                return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} never came up") from None
                await asyncio.sleep(0.2)


def _gens(res: list[dict[str, Any]]) -> str:
    cpu = [c for r in res for c in r["cpu"]]
    wait = [w for r in res for w in r["starved"]]
    ok = all(r["headroom"] for r in res)
    return (f"load generator: {len(cpu)} processes, CPU " + "/".join(f"{c:.2f}" for c in cpu) + " of a core, run-queue "
            "wait " + "/".join(f"{w:.2f}" for w in wait) + ("" if ok else "  (NO HEADROOM: the generators may have "
                                                              "capped these figures)"))


async def phase(ingresses: list[Ingress], pool: AsyncConnectionPool, clients: int, rate: float,
                seconds: float) -> dict[str, Any]:
    """`clients` split over the ingresses; idle, then `rate` events/s for `seconds`. Per-ingress figures."""
    count = int(rate * seconds)
    k = len(ingresses)
    shares = [clients // k + (i < clients % k) for i in range(k)]
    per_gen = max(1, PROCESSES // k)
    rss_idle = [x.rss() for x in ingresses]
    timeout = IDLE_S + seconds * 3 + 120
    gens = [Generators(x.url, "/api/stream", n, expect=count, timeout=timeout, processes=per_gen)
            for x, n in zip(ingresses, shares, strict=True)]
    entered: list[Generators] = []
    try:
        connect_start = time.monotonic()
        for g in gens:
            entered.append(await g.__aenter__())
        connect_s = time.monotonic() - connect_start
        await asyncio.sleep(1)  # the last connections' set-up out of the idle window
        rss_conn = [x.rss() for x in ingresses]
        cpu0 = [x.cpu() for x in ingresses]
        await asyncio.sleep(IDLE_S)
        cpu1 = [x.cpu() for x in ingresses]
        wait1 = [x.waited() for x in ingresses]
        t0 = time.monotonic()
        await append_at(pool, rate, count)
        results = [await g.results() for g in gens]
        flow_s = time.monotonic() - t0
        cpu2 = [x.cpu() for x in ingresses]
        wait2 = [x.waited() for x in ingresses]
    finally:
        for g in entered:
            await g.__aexit__(None, None, None)
    return {"count": count, "shares": shares, "connected": sum(g.connected for g in gens), "connect_s": connect_s,
            "rss_idle": rss_idle, "rss_conn": rss_conn,
            "idle_cores": [(b - a) / IDLE_S for a, b in zip(cpu0, cpu1, strict=True)],
            "flow_cores": [(c - b) / flow_s for b, c in zip(cpu1, cpu2, strict=True)], "flow_s": flow_s,
            "flow_wait": [(b - a) / flow_s for a, b in zip(wait1, wait2, strict=True)],
            "results": results, "complete": sum(r["complete"] for r in results),
            "latencies": [x for r in results for x in r["latencies"]]}


Point = tuple[int, float, int]  # one ingress process in one phase: its clients, its CPU (cores), its RSS growth


def show(label: str, p: dict[str, Any], rate: float) -> list[Point]:
    n = sum(p["shares"])
    print(f"\n{label}: {n} clients ({'/'.join(map(str, p['shares']))}), connected {p['connected']} in "
          f"{p['connect_s']:.1f} s; {p['complete']}/{n} got all {p['count']} events in order; {stats.machine_load()}")
    points: list[Point] = []
    for i, share in enumerate(p["shares"]):
        grew = p["rss_conn"][i] - p["rss_idle"][i]
        points.append((share, p["flow_cores"][i], grew))
        print(f"  ingress {i}: RSS {p['rss_idle'][i] / MB:.0f} MB idle -> {p['rss_conn'][i] / MB:.0f} MB with {share} "
              f"clients ({grew / share / 1024:.1f} KiB per client); CPU {p['idle_cores'][i]:.3f} cores connected "
              f"only, {p['flow_cores'][i]:.3f} cores at {rate:g} events/s ({p['flow_cores'][i] / share * 1e3:.3f} "
              f"millicores per client), waiting for a CPU {p['flow_wait'][i]:.0%} of the time")
    print(f"  append -> client latency: {stats.summary(p['latencies'], (50, 99))}")
    print(f"  {_gens(p['results'])}")
    return points


def fit(points: list[Point]) -> tuple[float, float]:
    """Least squares of a process's CPU over its clients: (cores of its own at this event rate, cores per client)."""
    n = len(points)
    mx = sum(c for c, _, _ in points) / n
    my = sum(y for _, y, _ in points) / n
    var = sum((c - mx) ** 2 for c, _, _ in points)
    slope = sum((c - mx) * (y - my) for c, y, _ in points) / var if var else my / max(mx, 1)
    return max(my - slope * mx, 0.0), slope


def extrapolate(points: list[Point], base_rss: float, rate: float) -> None:
    fixed, per_client = fit(points)
    rss = sum(g for _, _, g in points) / sum(c for c, _, _ in points)
    print(f"\n(c) EXTRAPOLATED, not measured: {TARGET_CLIENTS:,} clients at {rate:g} events/s from the costs measured "
          f"above. A least-squares fit of each ingress process's CPU over its clients ({len(points)} processes in "
          f"{len({c for c, _, _ in points})} sizes): {fixed:.3f} cores of its own + {per_client * 1e3:.3f} millicores "
          f"per client; {rss / 1024:.1f} KiB resident per client, {base_rss / MB:.0f} MB per idle process.")
    if per_client <= 0 or fixed >= HEADROOM:
        print("  the fit does not extrapolate (no per-client cost measured above the noise)")
        return
    # one event loop per process, loaded to at most HEADROOM of a core
    processes = max(1, math.ceil(TARGET_CLIENTS * per_client / (HEADROOM - fixed)))
    cores = processes * fixed + TARGET_CLIENTS * per_client
    memory = TARGET_CLIENTS * rss + processes * base_rss
    print(f"  -> {processes} ingress process(es) behind one proxy (each at most {HEADROOM:.0%} of a core, "
          f"{TARGET_CLIENTS / processes:,.0f} clients each): {cores:.2f} cores, {memory / MB:.0f} MB resident, "
          f"{processes * 11} database connections (a pool of 10 and a LISTEN each)")


def _clients_of(x: Ingress, port: int) -> int:
    """The SSE connections this process holds on the shared port."""
    return sum(1 for c in x.ps.net_connections(kind="tcp")
               if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port)


async def measure_step(ingresses: list[Ingress], port: int, pool: AsyncConnectionPool, dsn: str, n: int, rate: float,
                       seconds: float) -> dict[str, Any]:
    """`n` clients on the shared port; `rate` events/s for `seconds` with the floor taken alongside."""
    count = max(1, int(rate * seconds))
    url = f"http://127.0.0.1:{port}"
    rss0 = sum(x.rss() for x in ingresses)
    connect_start = time.monotonic()
    async with Generators(url, "/api/stream", n, expect=count, timeout=seconds * 3 + 300) as gens:
        connect_s = time.monotonic() - connect_start
        await asyncio.sleep(1)  # the last connections' set-up out of the measured window
        held = [_clients_of(x, port) for x in ingresses]
        rss1 = sum(x.rss() for x in ingresses)
        cpu0, t0 = sum(x.cpu() for x in ingresses), time.monotonic()
        async with notify_rtt.Beside(dsn) as beside:
            await append_at(pool, rate, count)
            res = await gens.results()
        flow_s = time.monotonic() - t0
        cpu1 = sum(x.cpu() for x in ingresses)
    return {"n": n, "count": count, "connected": gens.connected, "connect_s": connect_s, "held": held,
            "rss_idle": rss0, "rss": rss1, "cores": (cpu1 - cpu0) / flow_s, "result": res, "floor": beside.rtts}


async def measured(db: DB, tmp: Path, processes: int, steps: list[int], rate: float, seconds: float) -> None:
    """(d) every client measured, in steps, on `processes` ingress processes behind one port."""
    port = free_port()
    ingresses = [start_ingress(db, tmp, 100 + i, port) for i in range(processes)]
    rows: list[dict[str, Any]] = []
    try:
        await wait_up(f"http://127.0.0.1:{port}")
        await asyncio.sleep(2)  # every process up: each one answers /healthz on the shared port
        print(f"\n(d) MEASURED: {processes} ingress processes on port {port} (SO_REUSEPORT), {rate:g} events/s for "
              f"{seconds:g} s a step; {stats.machine_load()}")
        async with AsyncConnectionPool(db.executor_dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
            for n in steps:
                row = await measure_step(ingresses, port, pool, db.executor_dsn, n, rate, seconds)
                rows.append(row)
                _show_step(row)
    finally:
        for x in ingresses:
            x.proc.terminate()
        for x in ingresses:
            x.proc.wait(60)
    _knee(rows)


def _show_step(row: dict[str, Any]) -> None:
    res, n = row["result"], row["n"]
    lat, floor = res["latencies"], row["floor"]
    print(f"  {n:,} clients (held {'/'.join(map(str, row['held']))}; connected in {row['connect_s']:.1f} s): "
          f"{res['complete']:,}/{n:,} got all {row['count']} events in order; {stats.machine_load()}")
    print(f"    append -> client {stats.summary(lat, (50, 99))}; floor (bare NOTIFY) "
          f"{stats.summary(floor, (50, 99), digits=3)}; p50 {stats.fmt_ratio(stats.ratio(lat, floor, 50), 'x floor')}")
    print(f"    RSS {row['rss_idle'] / MB:.0f} -> {row['rss'] / MB:.0f} MB ({(row['rss'] - row['rss_idle']) / n / 1024:.1f} "
          f"KiB per client); CPU {row['cores']:.2f} cores ({row['cores'] / n * 1e3:.3f} millicores per client)")
    print(f"    {_gens([res])}")


def _knee(rows: list[dict[str, Any]]) -> None:
    ratios = [(r["n"], stats.ratio(r["result"]["latencies"], r["floor"], 50)) for r in rows]
    known = [(n, q) for n, q in ratios if q is not None]
    knee = next((n for n, q in known[1:] if q > 2 * known[0][1]), None) if known else None
    said = f"at {knee:,} clients" if knee is not None else "not reached within the steps"
    print(f"  knee (p50 more than twice the first step's multiple of the floor): {said}")
    last = rows[-1]
    record.value("fanout_complete", f"SSE clients that got every event in order, {last['n']:,} measured",
                 last["result"]["complete"], "clients", n=last["n"], goal=(">=", last["n"]), goal_on="value")
    record.latency("fanout_latency", f"SSE append → client, {last['n']:,} clients on {len(last['held'])} ingress "
                   "processes", last["result"]["latencies"], last["floor"], 50,
                   baseline_label="bare NOTIFY round trip (alongside)", goal=None)
    record.series("fanout_per_client", "what an SSE client costs, by clients connected", "clients", "per client",
                  {"KiB resident": [(r["n"], (r["rss"] - r["rss_idle"]) / r["n"] / 1024) for r in rows],
                   "CPU, millicores": [(r["n"], r["cores"] / r["n"] * 1e3) for r in rows],
                   "p50 latency, multiple of the floor": [(n, q) for n, q in known]}, log_x=True)


async def run(db: DB, tmp: Path, clients: int, rate: float, seconds: float) -> None:
    points: list[Point] = []
    idle_rss: list[int] = []
    # autocommit, as the executor's pool: a small batch's notification then carries its rows
    async with AsyncConnectionPool(db.executor_dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
        for k in (1, 2, 3, 4):
            ingresses = [start_ingress(db, tmp, i) for i in range(k)]
            try:
                for x in ingresses:
                    await wait_up(x.url)
                await asyncio.sleep(1)
                p = await phase(ingresses, pool, clients, rate, seconds)
                label = "(a) one ingress" if k == 1 else f"(b) {k} ingress processes"
                points += show(label, p, rate)
                idle_rss += p["rss_idle"]
            finally:
                for x in ingresses:
                    x.proc.terminate()
                for x in ingresses:
                    x.proc.wait(30)
    extrapolate(points, sum(idle_rss) / len(idle_rss), rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=20.0, help="events/s appended while the clients listen")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--measure", type=int, help="(d) alone: this many clients measured, on one shared port")
    parser.add_argument("--processes", type=int, default=3, help="(d): ingress processes behind the one port")
    parser.add_argument("--steps", help="(d): client counts, comma-separated (default: 10%%, 25%%, 50%%, all)")
    parser.add_argument("--measure-rate", type=float, default=2.0, help="(d): events/s")
    parser.add_argument("--measure-seconds", type=float, default=10.0, help="(d): seconds a step")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        cluster = Cluster.start(tmp / "pg")
        try:
            db = cluster.create_migrated()
            if args.measure:
                steps = [int(x) for x in args.steps.split(",")] if args.steps else \
                    sorted({max(1, args.measure * k // 100) for k in (10, 25, 50, 100)})
                asyncio.run(measured(db, tmp, args.processes, steps, args.measure_rate, args.measure_seconds))
                return
            print(f"{args.clients} SSE clients, {args.rate:g} events/s for {args.seconds:g} s; {stats.machine_load()}")
            asyncio.run(run(db, tmp, args.clients, args.rate, args.seconds))
        finally:
            cluster.drop_all()
            cluster.close()


if __name__ == "__main__":
    main()
