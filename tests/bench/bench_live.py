"""Live feel, measured in the browser: from a line the CLI prints to its text painted on screen.

    python -m tests.bench.bench_live [--lines 1100] [--partial]

One orchestrator turn of the real claude CLI on the scripted model prints `--lines` assistant text lines
(each followed by a harness tool call, so each is its own stream-json line). For each line:
  printed   the journal's `created_at` (when the supervisor read the line from the CLI's stdout)
  committed when a LISTEN on `journal` heard the NOTIFY of the batch holding it (~ its commit)
  sse       when a plain SSE client (httpx, this process) received it from /api/stream
  received  when the page's script got the chunk holding its SSE frame (the stream reader's read())
  dom       when the page's MutationObserver saw its text inserted into Chat
  frame     the timestamp of that frame (its animation callbacks'): DOM -> frame is the wait for the
            display's next frame, frame -> painted that frame's own work
  painted   after the frame that painted it: the first task after that frame (the usual "after next
            paint" mark: a requestAnimationFrame, then a posted task; inserted by a frame's own animation
            callbacks (a render in requestAnimationFrame), the frame is that one and the task is posted at once)
Page times are performance.timeOrigin + now(), on the same clock as this process's. Percentiles are exact
nearest-rank samples with their counts (tests/bench/stats.py); a p99 needs 1,000 lines. The goal:
printed -> painted p99 within 2x of the commit -> SSE client p99 of the same run. The executor, the
ingress, the SSE client and the listener share this process's event loop, and the machine may be
shared: read the figures side by side (the load average is printed), not as absolutes.
With --partial the turn runs with --include-partial-messages: every token delta is journaled and sent
too (the page skips them), and their own journal and SSE latencies are printed beside the lines'.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx
import psycopg

from executor.scripted_model import Rule, Scenario, ScriptedModelServer
from shared.threads import DEFAULT_THREAD_ID
from tests.bench import stats
from tests.harness import running_executor
from tests.pg import Cluster
from tests.test_web_client import DESKTOP, browser, page_at
from tests.web import ingress_server, sse_events

# Installed once the page is ready. The stream reader was made before, but each read() is looked up on
# the prototype when called, so from its next read on every chunk is timed as the page's script gets it.
WATCH = """() => {
  const now = () => performance.timeOrigin + performance.now();
  window.__rx = {}; window.__dom = {}; window.__frame = {}; window.__paint = {}; window.__long = [];
  const decoder = new TextDecoder();
  let tail = "";
  const read = ReadableStreamDefaultReader.prototype.read;
  ReadableStreamDefaultReader.prototype.read = function () {
    return read.call(this).then((r) => {
      if (r.value instanceof Uint8Array || typeof r.value === "string") {
        const t = now();
        const text = typeof r.value === "string" ? r.value : decoder.decode(r.value, { stream: true });
        const lines = (tail + text).split(/\\r\\n|\\n|\\r/);
        tail = lines.pop();
        for (const l of lines) if (l.startsWith("id:")) window.__rx[l.slice(3).trim()] = t;
      }
      return r;
    });
  };
  // Whether script runs inside a frame's animation callbacks: what those insert is painted by that same
  // frame, so its "after paint" mark is the first task after it. A requestAnimationFrame asked for from
  // there would wait for the frame after (16.7 ms later at 60 Hz), and count it against the page.
  // Flagged until the microtasks the callback queued (the MutationObserver's among them) have run.
  let inFrame = null;
  const raf = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = (cb) => raf((ts) => {
    inFrame = performance.timeOrigin + ts;
    try { cb(ts); } finally { queueMicrotask(() => { inFrame = null; }); }
  });
  // fn(frame start, painted): the frame that paints what was just inserted starts at its animation
  // callbacks' timestamp (the wait before it is the display's refresh), and is painted by the first task
  // after it
  const afterPaint = (fn) => {
    const post = (frame) => {
      const ch = new MessageChannel();
      ch.port1.onmessage = () => fn(frame, now());
      ch.port2.postMessage(null);
    };
    if (inFrame !== null) post(inFrame); else raf((ts) => post(performance.timeOrigin + ts));
  };
  let pending = [];
  const mark = (el, t) => {
    const m = /bench line (\d+)\./.exec(el.textContent);
    if (m && !(m[1] in window.__dom)) { window.__dom[m[1]] = t; pending.push(m[1]); }
  };
  new MutationObserver((records) => {
    const t = now();
    for (const r of records) for (const n of r.addedNodes) {
      if (n.nodeType !== 1) continue;
      if (n.matches(".step.text")) mark(n, t); else for (const el of n.querySelectorAll(".step.text")) mark(el, t);
    }
    if (!pending.length) return;
    const batch = pending;
    pending = [];
    afterPaint((f, p) => { for (const k of batch) { window.__frame[k] = f; window.__paint[k] = p; } });
  }).observe(document.getElementById("messages"), { childList: true, subtree: true });
  try {
    new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__long.push(e.duration); })
      .observe({ type: "longtask" });
  } catch { /* no long-task timing in this browser */ }
}"""


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


async def main(lines: int, partial: bool) -> None:
    replies = [{"text": f"bench line {k}.", "tool_use": {"name": "mcp__harness__get_handoffs",
                                                        "input": {"scope_id": str(DEFAULT_THREAD_ID)}}}
               for k in range(lines)] + [{"text": "bench done."}]
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=replies)])
    print(f"before: {stats.machine_load()}")
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster.start(Path(tmp) / "pg")
        db = cluster.create_migrated()
        try:
            with ScriptedModelServer(scenario) as model:
                # --partial: the CLI also prints each token delta as its own line (stream.stream_event)
                kw = {"substrate_kw": {"extra_args": ("--include-partial-messages",)}} if partial else {}
                async with running_executor(db, model, Path(tmp), **kw), ingress_server(db.ingress_dsn) as url, \
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
                            if await page.evaluate("Object.keys(window.__paint).length") >= lines:
                                break
                            await asyncio.sleep(0.5)
                        await asyncio.sleep(0.2)
                        page_marks = await page.evaluate(
                            "[window.__rx, window.__dom, window.__frame, window.__paint, window.__long]")
                    await asyncio.sleep(1)
                    stop.set()
                    for t in side:
                        t.cancel()
                    await asyncio.gather(*side, return_exceptions=True)
            with psycopg.connect(db.admin_dsn) as conn:
                rows = conn.execute(
                    "SELECT seq, extract(epoch FROM created_at), payload FROM journal"
                    " WHERE seq > %s AND event_type = 'stream.assistant' ORDER BY seq", [head]).fetchall()
                deltas = conn.execute(
                    "SELECT seq, extract(epoch FROM created_at) FROM journal"
                    " WHERE seq > %s AND event_type = 'stream.stream_event' ORDER BY seq", [head]).fetchall()
                span = conn.execute(
                    "SELECT extract(epoch FROM max(created_at) - min(created_at)), count(*) FROM journal"
                    " WHERE seq > %s AND event_type LIKE 'stream.%%'", [head]).fetchone()
        finally:
            cluster.drop(db)
    rx = {int(k): v / 1000 for k, v in page_marks[0].items()}
    dom, frame, paint = ({int(k): v / 1000 for k, v in m.items()} for m in page_marks[1:4])
    long_tasks: list[float] = page_marks[4]
    notified = sorted(commits)
    stages: dict[str, list[float]] = {name: [] for name in (
        "printed -> committed", "commit -> SSE client", "commit -> page received", "page received -> DOM",
        "DOM -> painted", "  DOM -> frame start", "  frame start -> painted", "printed -> DOM", "printed -> painted",
        "printed -> painted, less the frame wait", "commit -> painted", "printed -> SSE client")}

    def add(name: str, a: float | None, b: float | None) -> None:
        if a is not None and b is not None:
            stages[name].append(b - a)  # seconds; printed in ms

    for seq, created, payload in rows:
        text = "".join(b.get("text", "") for b in payload["message"]["content"] if b.get("type") == "text")
        if not text.startswith("bench line "):
            continue
        k = int(text.removeprefix("bench line ").rstrip("."))
        printed = float(created)
        committed = next((commits[s] for s in notified if s >= seq), None)
        add("printed -> committed", printed, committed)
        add("commit -> SSE client", committed, arrived.get(seq))
        add("commit -> page received", committed, rx.get(seq))
        add("page received -> DOM", rx.get(seq), dom.get(k))
        add("DOM -> painted", dom.get(k), paint.get(k))
        add("  DOM -> frame start", dom.get(k), frame.get(k))
        add("  frame start -> painted", frame.get(k), paint.get(k))
        if k in frame and k in dom:
            add("printed -> painted, less the frame wait", printed + (frame[k] - dom[k]), paint.get(k))
        add("printed -> DOM", printed, dom.get(k))
        add("printed -> painted", printed, paint.get(k))
        add("commit -> painted", committed, paint.get(k))
        add("printed -> SSE client", printed, arrived.get(seq))
    print(json.dumps({"lines": lines, "received": len(rx), "in_dom": len(dom), "painted": len(paint)}))
    for name, values in stages.items():
        print(f"  {name:<40} {stats.summary(values)}")
    if deltas:
        # token deltas: journaled and sent like any line (the page does not draw them)
        d_stages: dict[str, list[float]] = {"printed -> committed": [], "commit -> SSE client": [],
                                            "commit -> page received": []}
        for seq, created in deltas:
            committed = next((commits[s] for s in notified if s >= seq), None)
            if committed is None:
                continue
            d_stages["printed -> committed"].append(committed - float(created))
            if seq in arrived:
                d_stages["commit -> SSE client"].append(arrived[seq] - committed)
            if seq in rx:
                d_stages["commit -> page received"].append(rx[seq] - committed)
        print(f"  token deltas: {len(deltas)} rows ({len(deltas) / lines:.1f} per line)")
        for name, values in d_stages.items():
            print(f"    delta {name:<24} {stats.summary(values)}")
    if span and span[0]:
        print(f"  stream lines journaled: {span[1]} in {float(span[0]):.1f} s ({span[1] / float(span[0]):.0f}/s)")
    print(f"  page long tasks (>= 50 ms): {len(long_tasks)}, {sum(long_tasks):.0f} ms in all,"
          f" longest {max(long_tasks, default=0):.0f} ms")
    # the goal's figure is the painted one; "in the DOM" is what this benchmark measured before it marked
    # paints (it leaves out the wait for the next frame: up to 16.7 ms at 60 Hz)
    for end in ("painted", "DOM"):
        ratio = stats.ratio(stages[f"printed -> {end}"], stages["commit -> SSE client"], 99)
        print(f"  p99 printed -> {end} / commit -> SSE client: {stats.fmt_ratio(ratio, 'goal <= 2')}")
    # The wait for the display's next frame (0 to 16.7 ms at 60 Hz) is the display's, not the harness's:
    # the page cannot paint sooner than the frame after the text is in.
    ratio = stats.ratio(stages["printed -> painted, less the frame wait"], stages["commit -> SSE client"], 99)
    print(f"  p99 printed -> painted less the frame wait / commit -> SSE client: {stats.fmt_ratio(ratio, 'printed')}")
    # like for like (both from the print, so the journal's commit is in both): what the page adds
    ratio = stats.ratio(stages["printed -> painted"], stages["printed -> SSE client"], 99)
    print(f"  p99 printed -> painted / printed -> SSE client: {stats.fmt_ratio(ratio, 'printed')}")
    print(f"after: {stats.machine_load()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=1100, help="a p99 needs 1000")
    parser.add_argument("--partial", action="store_true",
                        help="run the turn with --include-partial-messages (token deltas journaled too)")
    args = parser.parse_args()
    asyncio.run(main(args.lines, args.partial))
