"""What a 5 MiB image costs: its upload, and what it adds to a turn, next to copying its bytes through
PostgreSQL once in the same run.

    python -m tests.bench.bench_attachments [--turns 20] [--uploads 20] [--mib 5]

The ingress and the executor run as their own processes, the real CLI against the scripted model.
(a) POST /api/attachments of a 5 MiB PNG -> stored (201), next to the baseline: the same bytes inserted
    into PostgreSQL and read back (one round trip through the store, from this process).
(b) POST /api/chat -> the turn's first stream line, and its first assistant line, at an SSE client, for a
    chat carrying the image and the same chat without it, alternating, each in a thread of its own (a
    resumed conversation would send earlier images again). The goal is about the assistant line: the
    model has the image only then (the CLI may print its first line before it reads its input).
    Goal: the image adds <= 1.5x the baseline of (a).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import time

import httpx
import psycopg
from PIL import Image

from tests.bench import services, stats
from tests.bench.bench_e2e import Stream
from tests.served import SSEEvent


def noise_png(mib: float) -> bytes:
    """A PNG of random pixels, about `mib` MiB (noise does not compress: the file is the size of its pixels)."""
    side = int((mib * 2**20 / 3) ** 0.5)
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, format="PNG", compress_level=1)
    return out.getvalue()


async def pg_copy(admin_dsn: str, data: bytes, n: int) -> list[float]:
    """The bytes into PostgreSQL and back, n times: what storing and then reading the file costs at least."""
    times = []
    async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as conn:
        await conn.execute("CREATE TEMP TABLE copy_bench (id serial PRIMARY KEY, data bytea)")
        for _ in range(n + 1):  # the first warms the connection and is not counted
            t0 = time.perf_counter()
            cur = await conn.execute("INSERT INTO copy_bench (data) VALUES (%b) RETURNING id", [data])
            row = await cur.fetchone()
            assert row is not None
            cur = await conn.execute("SELECT data FROM copy_bench WHERE id = %s", [row[0]], binary=True)
            back = await cur.fetchone()
            times.append(time.perf_counter() - t0)
            assert back is not None and len(back[0]) == len(data)
            await conn.execute("DELETE FROM copy_bench")
    return times[1:]


async def uploads(http: httpx.AsyncClient, data: bytes, n: int) -> tuple[list[float], list[str]]:
    times, ids = [], []
    for _ in range(n + 1):
        t0 = time.perf_counter()
        r = await http.post("/api/attachments", files={"file": ("screen.png", data, "image/png")})
        times.append(time.perf_counter() - t0)
        r.raise_for_status()
        ids.append(r.json()["id"])
    return times[1:], ids


async def threads(http: httpx.AsyncClient, n: int) -> list[str]:
    made = []
    for i in range(n):
        r = await http.post("/api/threads", json={"title": f"bench {i}", "mode": "autonomous"})
        r.raise_for_status()
        made.append(r.json()["thread_id"])
    return made


async def turn(http: httpx.AsyncClient, stream: Stream, thread: str, attachment: str | None) -> tuple[float, float]:
    """POST /api/chat -> (first stream line, first assistant line) of its turn, at the SSE client."""
    body: dict[str, object] = {"text": "what is on this screen?", "thread_id": thread}
    if attachment:
        body["attachment_ids"] = [attachment]
    t0 = time.perf_counter()
    (await http.post("/api/chat", json=body)).raise_for_status()
    spawned_at, spawned = await stream.until(lambda ev: ev.event == "task.spawned")
    task_id = json.loads(spawned.data)["task_id"]

    def mine(ev: SSEEvent) -> bool:
        return bool(json.loads(ev.data).get("task_id") == task_id)

    first, _ = await stream.until(lambda ev: ev.event.startswith("stream.") and mine(ev))
    assistant, _ = await stream.until(lambda ev: ev.event == "stream.assistant" and mine(ev))
    await stream.until(lambda ev: ev.event == "task.exited" and mine(ev))
    return first - t0, assistant - t0


async def bench(url: str, admin_dsn: str, turns: int, n_uploads: int, mib: float) -> None:
    image = noise_png(mib)
    copy = await pg_copy(admin_dsn, image, n_uploads)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120, read=None)) as http:
        up, _ = await uploads(http, image, n_uploads)
        _, ids = await uploads(http, image, turns)  # one per turn with the image (a file goes once)
        homes = await threads(http, 2 * (turns + 1))
        await asyncio.sleep(1)  # the executor creates the threads
        stream = Stream(http)
        await asyncio.wait_for(stream.connected.wait(), 30)
        with_first, with_asst, without_first, without_asst = [], [], [], []
        for i in range(turns + 1):  # the first pair warms caches and is not counted
            a = await turn(http, stream, homes[2 * i], ids[i])
            b = await turn(http, stream, homes[2 * i + 1], None)
            if i:
                with_first.append(a[0])
                with_asst.append(a[1])
                without_first.append(b[0])
                without_asst.append(b[1])
        stream.task.cancel()
    size = f"{len(image) / 2**20:.2f} MiB"
    print(f"(a) a {size} PNG")
    print(f"    POST /api/attachments -> stored:            {stats.summary(up, (50,))}")
    print(f"    baseline: into PostgreSQL and back once:    {stats.summary(copy, (50,))}")
    print(f"    upload against the baseline: {stats.fmt_ratio(stats.ratio(up, copy, 50), 'p50; informational: the upload re-encodes the image')}")
    print(f"(b) {turns} turns with the image and {turns} without, alternating, each in its own thread")
    print(f"    chat -> first stream line,    with the image:    {stats.summary(with_first, (50,))}")
    print(f"    chat -> first stream line,    without:           {stats.summary(without_first, (50,))}")
    print(f"    chat -> first assistant line, with the image:    {stats.summary(with_asst, (50,))}")
    print(f"    chat -> first assistant line, without:           {stats.summary(without_asst, (50,))}")
    w, wo, c = (stats.percentile(x, 50) for x in (with_asst, without_asst, copy))
    if w is not None and wo is not None and c:
        print(f"    the image adds {(w - wo) * 1000:+.1f} ms at p50 to the assistant line = "
              f"{(w - wo) / c:.2f}x the baseline's p50 (n={turns} pairs, n={len(copy)} copies)  (goal <= 1.5x)")


async def main(turns: int, n_uploads: int, mib: float) -> None:
    with services.scratch_store() as (tmp, db, model):
        env = services.service_env(db, model, tmp)
        async with services.running(db, env) as svc:
            print(f"before: {stats.machine_load()}")
            await bench(svc.url, db.admin_dsn, turns, n_uploads, mib)
            print(f"after: {stats.machine_load()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=20, help="measured turns of each kind (a p50 needs 20)")
    parser.add_argument("--uploads", type=int, default=20, help="measured uploads (a p50 needs 20)")
    parser.add_argument("--mib", type=float, default=5.0)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.uploads, args.mib))
