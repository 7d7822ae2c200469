"""Time from an answer POST to ask_user_question's return, at an MCP client calling the tool directly,
next to a bare NOTIFY round trip in the same run; then the same with 20 questions pending at once.
The executor (hosting the MCP server) and the ingress run as their own processes.

    python -m tests.bench.bench_ask [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from mcp.client import Client

from tests.bench.bench_sse import bare_notify_rtt, wait_up
from tests.pg import Cluster
from tests.web import free_port

POST_TIMES: list[float] = []
QUESTION = {"question": "Go on?", "header": "Go", "multiSelect": False,
            "options": [{"label": "Yes", "description": "continue"}, {"label": "No", "description": "stop"}]}


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) > 1 else values[0] * 1000


async def one_round(mcp_url: str, http: httpx.AsyncClient, concurrent: int) -> list[float]:
    """`concurrent` clients ask at once; once all are stored, each is answered: POST→return per ask."""
    stored: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()

    async def ask(i: int) -> float:
        text = f"Go on with {i}?"
        async with Client(mcp_url) as client:  # entered and left in this task, as anyio requires
            call = asyncio.ensure_future(client.call_tool("ask_user_question",
                                                          {"questions": [{**QUESTION, "question": text}]}))
            ids = await stored
            start = time.perf_counter()
            await http.post(f"/api/asks/{ids[text]}/answer", json={"answers": {text: "Yes"}})
            POST_TIMES.append(time.perf_counter() - start)
            await call
            return time.perf_counter() - start

    tasks = [asyncio.create_task(ask(i)) for i in range(concurrent)]
    while True:  # one poller for everyone
        asks = (await http.get("/api/asks", params={"status": "pending", "limit": 500})).json()["asks"]
        if len(asks) >= concurrent:
            break
        await asyncio.sleep(0.02)
    stored.set_result({a["questions"][0]["question"]: a["id"] for a in asks})
    return list(await asyncio.gather(*tasks))


async def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster.start(Path(tmp) / "pg")
        db = cluster.create_migrated()
        port, mcp_port = free_port(), free_port()
        env = {**os.environ, "OPEN_MODE": "1", "PETAL_INGRESS_PORT": str(port), "PETAL_MCP_PORT": str(mcp_port),
               "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_INGRESS_DSN": db.ingress_dsn,
               "PETAL_DATA_DIR": str(Path(tmp) / "var"), "PETAL_LOG_LEVEL": "warning"}
        services = [subprocess.Popen([sys.executable, "-m", "shared.cli", name], env=env)
                    for name in ("executor", "ingress")]
        url, mcp_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{mcp_port}/harness-mcp/"
        try:
            await wait_up(url)
            for _ in range(300):  # the executor's MCP server
                try:
                    socket.create_connection(("127.0.0.1", mcp_port), timeout=0.2).close()
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                single = [t for _ in range(rounds) for t in await one_round(mcp_url, http, 1)]
                single_posts = list(POST_TIMES)
                many = [t for _ in range(max(1, rounds // 10)) for t in await one_round(mcp_url, http, 20)]
            rtt = await bare_notify_rtt(db.executor_dsn)
        finally:
            for p in services:
                p.terminate()
                p.wait(20)
            cluster.drop_all()
    print(f"answer POST -> tool return, one pending:   p50 {pct(single, 50):.1f} ms  p99 {pct(single, 99):.1f} ms"
          f"  ({len(single)} asks)")
    print(f"answer POST -> tool return, 20 pending:    p50 {pct(many, 50):.1f} ms  p99 {pct(many, 99):.1f} ms"
          f"  ({len(many)} asks)")
    print(f"  (of which the answer POST itself, one pending: p50 {pct(single_posts, 50):.1f} ms"
          f"  p99 {pct(single_posts, 99):.1f} ms)")
    print(f"bare NOTIFY round trip:                     p50 {pct(rtt, 50):.2f} ms  p99 {pct(rtt, 99):.2f} ms")
    print(f"p99 ratio (one pending): {pct(single, 99) / pct(rtt, 99):.1f}x   (20 pending): "
          f"{pct(many, 99) / pct(rtt, 99):.1f}x   (goal <= 20x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    asyncio.run(main(parser.parse_args().rounds))
