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
            display's next frame, frame -> painted that frame's own work. A page that renders nothing
            between lines gets its frame at once, stamped with the display's last refresh: then DOM ->
            frame is negative (no wait) and frame -> painted holds the time since that refresh
  painted   after the frame that painted it: the first task after that frame (the usual "after next
            paint" mark: a requestAnimationFrame, then a posted task; inserted by a frame's own animation
            callbacks (a render in requestAnimationFrame), the frame is that one and the task is posted at once)
Page times are performance.timeOrigin + now(), on the same clock as this process's. Percentiles are exact
nearest-rank samples with their counts (tests/bench/stats.py); a p99 needs 1,000 lines. The goal:
printed -> painted p99 within 2x of the commit -> SSE client p99 of the same run. The ingress and the
executor run as their own processes (as deployed); the SSE client and the listener share this process
with the browser's driver, and the machine may be shared: read the figures side by side (the load
average is printed), not as absolutes.
The floor: a second page in the same browser reads the same stream and shows each line's text as its
one plain <div> the moment its frame arrives, with nothing else on the page, marked the same way. Its
figures are the least any page could do here (the display's frame, the browser's own work); the app's
against the floor's is what the app's page adds.
With --partial the turn runs with --include-partial-messages: every token delta is journaled and sent
too (the page skips them), and their own journal and SSE latencies are printed beside the lines'.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psycopg
from playwright.async_api import Browser, Page

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared.threads import DEFAULT_THREAD_ID
from tests.bench import services, stats
from tests.harness import claude_bin
from tests.pg import DB, Cluster
from tests.web.test_web_client import DESKTOP, browser, page_at
from tests.served import sse_events

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


# The floor: the least a page can do with the same stream. It reads /api/stream the way the app does
# (fetch, Last-Event-ID) and shows each assistant text at once as the page's one plain <div> (replaced:
# always in view, no history, no scrolling). Served on the ingress's own origin (a route in the
# browser), so the same stream answers it.
FLOOR_PATH = "/bench-floor"
FLOOR_HTML = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>floor</title></head>
<body><div id="messages"></div><script>
window.floorStart = (after) => {
  const box = document.getElementById("messages");
  fetch("/api/stream", { headers: { accept: "text/event-stream", "Last-Event-ID": String(after) }, cache: "no-store" })
    .then(async (r) => {
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buf += decoder.decode(value, { stream: true }).replace(/\\r\\n?/g, "\\n");
        let i;
        while ((i = buf.indexOf("\\n\\n")) >= 0) {
          const frame = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let event = "", data = "";
          for (const l of frame.split("\\n")) {
            if (l.startsWith("event:")) event = l.slice(6).trim();
            else if (l.startsWith("data:")) data += l.slice(5).trim();
          }
          if (event !== "stream.assistant") continue;
          for (const b of JSON.parse(data).payload.message.content) {
            if (b.type !== "text") continue;
            const d = document.createElement("div");
            d.className = "step text";
            d.textContent = b.text;
            box.replaceChildren(d);
          }
        }
      }
    });
};
</script></body></html>"""


@contextlib.asynccontextmanager
async def floor_page(b: Browser, url: str, head: int) -> AsyncIterator[Page]:
    context = await b.new_context(viewport=DESKTOP)
    await context.route(url + FLOOR_PATH, lambda route: route.fulfill(
        status=200, content_type="text/html; charset=utf-8", body=FLOOR_HTML))
    page = await context.new_page()
    try:
        await page.goto(url + FLOOR_PATH)
        await page.evaluate(WATCH)
        await page.evaluate(f"window.floorStart({head})")
        yield page
    finally:
        await context.close()


def claude_with(tmp: Path, *args: str) -> str:
    """The CLI with extra flags, as a `claude` the executor runs (it takes its flags anywhere)."""
    script = tmp / "claude-with-flags"
    script.write_text(f"#!/bin/sh\nexec {shlex.quote(claude_bin())} {shlex.join(args)} \"$@\"\n")
    script.chmod(0o755)
    return str(script)


Marks = list[dict[str, float]]


async def run_turn(db: DB, model: ScriptedModelServer, tmp: Path, lines: int, partial: bool) -> tuple[
        int, Marks, Marks, list[float], dict[int, float], dict[int, float]]:
    """One turn printing `lines` lines, watched by the app's page and the floor page at once."""
    # --partial: the CLI also prints each token delta as its own line (stream.stream_event)
    claude = claude_with(tmp, "--include-partial-messages") if partial else None
    env = services.service_env(db, model, tmp, claude=claude)
    async with services.running(db, env) as svc, browser() as b, \
            httpx.AsyncClient(base_url=svc.url) as http:
        head = (await http.get("/api/info")).json()["journal_head"]
        stop = asyncio.Event()
        commits: dict[int, float] = {}
        arrived: dict[int, float] = {}
        side = [asyncio.create_task(listen_commits(db.admin_dsn, commits, stop)),
                asyncio.create_task(read_sse(svc.url, head, arrived, stop))]
        async with page_at(b, svc.url, DESKTOP) as page, floor_page(b, svc.url, head) as floor:
            await page.evaluate(WATCH)
            await page.fill("#composer-text", "bench")
            await page.click("#composer button")
            deadline = time.monotonic() + 60 + lines * 3
            while time.monotonic() < deadline:
                counts = [await p.evaluate("Object.keys(window.__paint).length") for p in (page, floor)]
                if min(counts) >= lines:
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(0.2)
            app_marks, floor_marks = [await p.evaluate(
                "[window.__rx, window.__dom, window.__frame, window.__paint, window.__long]") for p in (page, floor)]
        await asyncio.sleep(1)
        stop.set()
        for t in side:
            t.cancel()
        await asyncio.gather(*side, return_exceptions=True)
    return head, app_marks[:4], floor_marks[:4], app_marks[4], commits, arrived


def seconds(marks: Marks) -> list[dict[int, float]]:
    return [{int(k): v / 1000 for k, v in m.items()} for m in marks]


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
                head, app_marks, floor_marks, long_tasks, commits, arrived = await run_turn(
                    db, model, Path(tmp), lines, partial)
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
    rx, dom, frame, paint = seconds(app_marks)
    _, floor_dom, floor_frame, floor_paint = seconds(floor_marks)
    notified = sorted(commits)
    stages: dict[str, list[float]] = {name: [] for name in (
        "printed -> committed", "commit -> SSE client", "commit -> page received", "page received -> DOM",
        "DOM -> painted", "  DOM -> frame start", "  frame start -> painted", "printed -> DOM", "printed -> painted",
        "printed -> painted, less the frame wait", "commit -> painted", "printed -> SSE client",
        "floor: printed -> DOM", "floor: printed -> painted", "floor:   DOM -> frame start",
        "floor:   frame start -> painted")}

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
            # a frame the browser began before the text went in (its timestamp is the display's last
            # refresh: an idle page's frame comes at once) kept it waiting for nothing
            add("printed -> painted, less the frame wait", printed + max(0.0, frame[k] - dom[k]), paint.get(k))
        add("printed -> DOM", printed, dom.get(k))
        add("printed -> painted", printed, paint.get(k))
        add("commit -> painted", committed, paint.get(k))
        add("printed -> SSE client", printed, arrived.get(seq))
        add("floor: printed -> DOM", printed, floor_dom.get(k))
        add("floor: printed -> painted", printed, floor_paint.get(k))
        add("floor:   DOM -> frame start", floor_dom.get(k), floor_frame.get(k))
        add("floor:   frame start -> painted", floor_frame.get(k), floor_paint.get(k))
    print(json.dumps({"lines": lines, "received": len(rx), "in_dom": len(dom), "painted": len(paint),
                      "floor_painted": len(floor_paint)}))
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
    # the goal's figure is the painted one; "in the DOM" leaves out the wait for the next frame (up to
    # 16.7 ms at 60 Hz)
    for end in ("painted", "DOM"):
        ratio = stats.ratio(stages[f"printed -> {end}"], stages["commit -> SSE client"], 99)
        print(f"  p99 printed -> {end} / commit -> SSE client: {stats.fmt_ratio(ratio, 'goal <= 2')}")
        ratio = stats.ratio(stages[f"floor: printed -> {end}"], stages["commit -> SSE client"], 99)
        print(f"    the floor page's, the same way: {stats.fmt_ratio(ratio, 'the least any page can do')}")
        ratio = stats.ratio(stages[f"printed -> {end}"], stages[f"floor: printed -> {end}"], 99)
        print(f"    p99 the app's / the floor's: {stats.fmt_ratio(ratio, 'what the app adds')}")
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
