"""Live feel, measured in the browser: from a line the CLI prints to its text on screen.

    python -m tests.bench.bench_live [--lines 100]

One orchestrator turn of the real claude CLI on the scripted model prints `--lines` assistant text lines
(each followed by a harness tool call, so each is its own stream-json line). For each line:
  printed   the journal's `created_at` (when the supervisor read the line from the CLI's stdout)
  committed when a LISTEN on `journal` heard the NOTIFY of the batch holding it (≈ its commit)
  sse       when a plain SSE client (httpx, this process) received it from /api/stream
  screen    when the page's MutationObserver saw its text in Chat (Chromium, performance.timeOrigin + now)
and prints p50/p99 (exact order statistics, nearest rank) with n beside each, for printed→screen next to
the SSE commit→client figure of the same run (goal: printed→screen p99 within 2x of commit→client p99).
The executor, the ingress, the SSE client and the listener share this process's event loop, and the
machine may be shared: read the figures side by side, not as absolutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
import time
from pathlib import Path

import httpx
import psycopg

from executor.scripted_model import Rule, Scenario, ScriptedModelServer
from shared.threads import DEFAULT_THREAD_ID
from tests.harness import running_executor
from tests.pg import Cluster
from tests.test_web_client import DESKTOP, browser, page_at
from tests.web import ingress_server, sse_events

WATCH = """() => {
  window.__seen = {};
  new MutationObserver(() => {
    for (const el of document.querySelectorAll("#messages .step.text")) {
      const m = /bench line (\\d+)\\./.exec(el.textContent);
      if (m && !(m[1] in window.__seen)) window.__seen[m[1]] = performance.timeOrigin + performance.now();
    }
  }).observe(document.getElementById("messages"), { childList: true, subtree: true, characterData: true });
}"""


def order_stat(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile: an observed value, no interpolation."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def report(name: str, values_ms: list[float]) -> float:
    p50, p99 = order_stat(values_ms, 0.50), order_stat(values_ms, 0.99)
    print(f"  {name:<28} p50 {p50:8.1f} ms (n={len(values_ms)})   p99 {p99:8.1f} ms (n={len(values_ms)})")
    return p99


async def listen_commits(dsn: str, commits: dict[int, float], stop: asyncio.Event) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("LISTEN journal")
        while not stop.is_set():
            async for n in conn.notifies(timeout=0.5):
                commits[int(n.payload)] = time.time()


async def read_sse(url: str, head: int, arrived: dict[int, float], stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=None) as http, \
            http.stream("GET", "/api/stream", headers={"Last-Event-ID": str(head)}) as response:
        async for ev in sse_events(response):
            if ev.id is not None:
                arrived[int(ev.id)] = time.time()
            if stop.is_set():
                return


async def main(lines: int) -> None:
    replies = [{"text": f"bench line {k}.", "tool_use": {"name": "mcp__harness__get_handoffs",
                                                        "input": {"scope_id": str(DEFAULT_THREAD_ID)}}}
               for k in range(lines)] + [{"text": "bench done."}]
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=replies)])
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster.start(Path(tmp) / "pg")
        db = cluster.create_migrated()
        try:
            with ScriptedModelServer(scenario) as model:
                async with running_executor(db, model, Path(tmp)), ingress_server(db.ingress_dsn) as url, \
                        browser() as b, httpx.AsyncClient(base_url=url) as http:
                    head = (await http.get("/api/info")).json()["journal_head"]
                    stop = asyncio.Event()
                    commits: dict[int, float] = {}
                    arrived: dict[int, float] = {}
                    side = [asyncio.create_task(listen_commits(db.admin_dsn, commits, stop)),
                            asyncio.create_task(read_sse(url, head, arrived, stop))]
                    async with page_at(b, url, DESKTOP) as page:
                        await page.evaluate(WATCH)
                        await page.fill("#composer-text", "bench")
                        await page.click("#composer button")
                        deadline = time.monotonic() + 60 + lines * 3
                        while time.monotonic() < deadline:
                            seen = await page.evaluate("Object.keys(window.__seen).length")
                            if seen >= lines:
                                break
                            await asyncio.sleep(0.5)
                        screen = {int(k): v / 1000 for k, v in (await page.evaluate("window.__seen")).items()}
                    await asyncio.sleep(1)
                    stop.set()
                    for t in side:
                        t.cancel()
                    await asyncio.gather(*side, return_exceptions=True)
            with psycopg.connect(db.admin_dsn) as conn:
                rows = conn.execute(
                    "SELECT seq, extract(epoch FROM created_at), payload FROM journal"
                    " WHERE seq > %s AND event_type = 'stream.assistant' ORDER BY seq", [head]).fetchall()
        finally:
            cluster.drop(db)
    notified = sorted(commits)
    printed_to_screen, commit_to_sse, printed_to_sse, commit_to_screen = [], [], [], []
    for seq, created, payload in rows:
        text = "".join(b.get("text", "") for b in payload["message"]["content"] if b.get("type") == "text")
        if not text.startswith("bench line "):
            continue
        k = int(text.removeprefix("bench line ").rstrip("."))
        committed = next((commits[s] for s in notified if s >= seq), None)
        if k in screen:
            printed_to_screen.append((screen[k] - float(created)) * 1000)
            if committed is not None:
                commit_to_screen.append((screen[k] - committed) * 1000)
        if seq in arrived:
            printed_to_sse.append((arrived[seq] - float(created)) * 1000)
            if committed is not None:
                commit_to_sse.append((arrived[seq] - committed) * 1000)
    print(json.dumps({"lines": lines, "on_screen": len(screen)}))
    browser_p99 = report("printed -> screen (browser)", printed_to_screen)
    report("commit -> screen (browser)", commit_to_screen)
    report("printed -> SSE client", printed_to_sse)
    sse_p99 = report("commit -> SSE client", commit_to_sse)
    print(f"  p99 ratio printed->screen / commit->SSE client: {browser_p99 / sse_p99:.1f}x  (goal <= 2x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=100)
    asyncio.run(main(parser.parse_args().lines))
