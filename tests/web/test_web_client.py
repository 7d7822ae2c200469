"""The web client in a real headless Chromium (Debian's `chromium`, driven by Playwright) against the real
ingress, executor, PostgreSQL and claude CLI on the scripted model. Screenshots land in
var/test-artifacts/ (or $PETAL_TEST_ARTIFACTS)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, Playwright, ViewportSize, async_playwright, expect

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests.harness import running_executor
from tests import tables
from tests.pg import DB
from tests.wait import until
from tests.served import free_port, ingress_server
from tests.web.seen import seen

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("PETAL_TEST_ARTIFACTS", ROOT / "var" / "test-artifacts"))
PHONE: ViewportSize = {"width": 390, "height": 844}
DESKTOP: ViewportSize = {"width": 1280, "height": 800}
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'

pytestmark = pytest.mark.timeout(240)


def chromium() -> str:
    found = os.environ.get("PETAL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "the browser tests need Debian's chromium (apt-get install chromium); .ci/run installs it"
    return found


# This test process's browser, launched by its first browser test and closed at the end of the session
# (tests/conftest.py): a Playwright driver and a Chromium started per test cost about 3 s of CPU each time.
_shared: tuple[Playwright, Browser] | None = None


async def _launched() -> Browser:
    global _shared
    if _shared is not None and _shared[1].is_connected():
        return _shared[1]
    await close_browser()  # one that crashed: its driver goes too
    driver = await async_playwright().start()
    b = await driver.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
    _shared = (driver, b)
    return b


async def close_browser() -> None:
    global _shared
    if _shared is not None:
        driver, b, _shared = *_shared, None
        with contextlib.suppress(Exception):  # a browser that crashed cannot be closed
            await b.close()
        await driver.stop()


@asynccontextmanager
async def browser() -> AsyncIterator[Browser]:
    """The shared browser, for one test: every context (its pages, storage, service workers) the test opened is
    closed when it is done, so nothing of one test is seen by the next."""
    b = await _launched()
    before = set(b.contexts)
    try:
        yield b
    finally:
        for context in b.contexts:
            if context not in before:
                await context.close()


@asynccontextmanager
async def page_at(b: Browser, url: str, viewport: ViewportSize = PHONE) -> AsyncIterator[Page]:
    context = await b.new_context(viewport=viewport)
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    await page.goto(url + "/")
    await expect(page.locator("body[data-ready='1']")).to_have_count(1, timeout=20_000)
    try:
        yield page
    finally:
        await context.close()
    assert errors == [], errors


async def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=False)


async def no_script_ran(page: Page) -> None:
    assert await page.evaluate("window.__xss") is None


# ---- chat ----------------------------------------------------------------------------------------------

async def test_a_message_shows_pending_then_its_echo_then_the_reply_and_nothing_runs_as_html(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[
        {"stall": {"seconds": 3, "text": f"Done. **All good** {XSS}"}}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, browser() as b:
            async with page_at(b, url) as page:
                await expect(page.locator("#messages .empty")).to_be_visible()
                await page.fill("#composer-text", "first: tidy the repo")
                await page.click("#composer button")
                await expect(page.locator("#turn-status")).to_be_visible(timeout=30_000)
                # sent during the running turn: pending (from the queue) until the boundary delivers it
                await page.fill("#composer-text", f"second {XSS}")
                await page.press("#composer-text", "Control+Enter")
                pending = page.locator(".msg.user.pending")
                await expect(pending).to_have_count(1)
                await expect(pending).to_contain_text("second <img src=x")
                await shot(page, "chat-pending-390")
                # the echo replaces the pending bubble; the replies come in as markdown
                await expect(pending).to_have_count(0, timeout=60_000)
                await expect(page.locator(".msg.user")).to_have_count(2)
                await expect(page.locator(".msg.assistant")).to_have_count(2, timeout=60_000)
                await expect(page.locator(".msg.assistant strong").first).to_have_text("All good")
                await expect(page.locator(".msg.assistant").first).to_contain_text("<script>window.__xss=2</script>")
                await expect(page.locator("#turn-status")).to_be_hidden(timeout=30_000)
                await no_script_ran(page)
                await shot(page, "chat-390")
                for tab in ("chat", "tasks", "asks", "activity", "context"):  # nothing overflows a 360 px phone
                    await page.set_viewport_size({"width": 360, "height": 740})
                    await page.click(f"a[data-tab='{tab}']")
                    width = await page.evaluate("document.documentElement.scrollWidth")
                    assert width <= 360, f"the {tab} view is {width} px wide at 360"
            async with page_at(b, url, DESKTOP) as page:  # a fresh load renders the same conversation
                await expect(page.locator(".msg.user")).to_have_count(2)
                await expect(page.locator(".msg.user").nth(1)).to_have_text(f"second {XSS}")
                await expect(page.locator(".msg.assistant")).to_have_count(2)
                await no_script_ran(page)
                await shot(page, "chat-1280")


async def test_a_read_of_the_queue_older_than_the_echo_does_not_bring_the_delivered_message_back(
    db: DB, tmp_path: Path
) -> None:
    """A read of /api/queue answered while the message waited and applied after its echo came: the message shows
    once (the echo), not also as pending. The read is held in the browser until the echo shows; a marker row
    added to it proves the page applied it."""
    marker = {"id": "00000000-0000-4000-8000-00000000beef", "thread_id": None, "origin": "user",
              "text": "marker: the held read was applied", "created_at": "2026-01-01T00:00:00+00:00"}
    held, echoed = asyncio.Event(), asyncio.Event()

    async def hold_stale(route: Any) -> None:
        response = await route.fetch()
        body = await response.json()
        if any(q["text"].startswith("second") for q in body["pending"]):
            held.set()
            await echoed.wait()
            body["pending"].append(marker)
        await route.fulfill(response=response, json=body)

    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[
        {"stall": {"seconds": 6, "text": "first done"}}, {"text": "second done"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, browser() as b:
            async with page_at(b, url) as page:
                await page.route("**/api/queue?*", hold_stale)
                await page.fill("#composer-text", "first")
                await page.click("#composer button")
                await expect(page.locator("#turn-status")).to_be_visible(timeout=30_000)
                await page.fill("#composer-text", "second")
                await page.click("#composer button")
                await asyncio.wait_for(held.wait(), 30)  # the page read the queue while the message waited
                echo = page.locator(".msg.user:not(.pending)", has_text="second")
                await expect(echo).to_have_count(1, timeout=60_000)
                echoed.set()
                await expect(page.locator(".msg.user.pending", has_text="marker")).to_have_count(1)
                await expect(page.locator(".msg.user", has_text="second")).to_have_count(1)
                await page.unroute("**/api/queue?*")


# ---- asks ----------------------------------------------------------------------------------------------

QUESTIONS = [
    {"question": "Which way should the refactor go?", "header": "Direction", "multiSelect": False,
     "options": [{"label": "Left", "description": "split the module", "preview": f"## Plan\n\n- split it\n\n{XSS}"},
                 {"label": "Right", "description": "keep it whole"}]},
    {"question": "Which checks should run?", "header": "Checks", "multiSelect": True,
     "options": [{"label": "Lint", "description": ""}, {"label": "Types", "description": ""},
                 {"label": "Tests", "description": ""}]},
]


async def test_an_ask_is_a_card_that_survives_a_reload_and_its_answer_lets_the_run_continue(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[
        {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": QUESTIONS}}},
        {"text": "Going left, with the checks you chose."}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, \
                browser() as b, httpx.AsyncClient(base_url=url) as http:
            async with page_at(b, url) as page:
                await page.fill("#composer-text", "refactor the parser")
                await page.click("#composer button")
                # pinned above the composer in Chat, and counted on the Asks tab from every view
                await expect(page.locator("#pinned-asks .ask")).to_have_count(1, timeout=60_000)
                await expect(page.locator("#ask-count")).to_have_text("1")
                await seen(page.locator("#turn-status"), "waiting for your answer")
                await shot(page, "ask-pinned-390")
                await page.reload()
                await expect(page.locator("body[data-ready='1']")).to_have_count(1)
                await page.click("a[data-tab='asks']")
                card = page.locator("#ask-cards .ask")
                await expect(card).to_have_count(1)  # it survived the reload
                await card.locator("details.preview summary").click()
                await expect(card.locator("details.preview h2")).to_have_text("Plan")
                await expect(card.locator("details.preview")).to_contain_text("<script>window.__xss=2</script>")
                await no_script_ran(page)
                await shot(page, "asks-390")
                # the chat stays usable while the question waits
                await page.click("a[data-tab='chat']")
                await expect(page.locator("#composer-text")).to_be_editable()
                await page.click("a[data-tab='asks']")
                await card.locator(".option label", has_text="Left").click()
                await card.locator(".option label", has_text="Types").click()
                await card.locator("input.other").nth(1).fill("Benchmarks")
                await card.locator("button[type='submit']").click()
                await expect(card).to_have_count(0)
                await expect(page.locator("#ask-count")).to_be_hidden()
                await page.click("a[data-tab='chat']")
                await expect(page.locator(".msg.assistant")).to_contain_text("Going left", timeout=60_000)
                # the answer given shows in Chat, and in Asks history
                for where in ("#messages .msg.note.answered", "#ask-history li"):
                    if where.startswith("#ask"):
                        await page.click("a[data-tab='asks']")
                    for chosen in ("Left", "Types, Benchmarks"):
                        await expect(page.locator(f"{where} .answer", has_text=chosen)).to_have_count(1)
            answered = (await http.get("/api/asks", params={"status": "answered"})).json()["asks"]
    assert answered[0]["answers"] == {"Which way should the refactor go?": "Left",
                                      "Which checks should run?": ["Types", "Benchmarks"]}


# ---- tasks, stalls and reconnects ----------------------------------------------------------------------

async def test_a_stalled_worker_is_unmissable_and_a_restarted_ingress_is_caught_up_with_nothing_missing(
    db: DB, tmp_path: Path
) -> None:
    # stalled long enough for the page's checks below to find it stalled on busy cores (2 s after its last line)
    scenario = Scenario(rules=[Rule(role="worker", replies=[{"stall": {"seconds": 20, "text": "back, and done"}}])])
    port = free_port()
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, stall_timeout_s=2) as h, browser() as b:
            async with ingress_server(db.ingress_dsn, ingress_port=port) as url:
                context = await b.new_context(viewport=PHONE)
                page = await context.new_page()
                await page.goto(url + "/#tasks")
                await expect(page.locator("body[data-ready='1']")).to_have_count(1, timeout=20_000)
                await expect(page.locator("#task-list .empty")).to_be_visible()
                task_id = await h.dispatch("wait a while, then answer")
                await seen(page.locator("#task-list .chip.stalled"), "stalled", timeout=30, scroll=True)
                await seen(page.locator("#stalled-banner"))
                await seen(page.locator("#stalled-count"), "1")
                await shot(page, "tasks-stalled-390")
                await page.click("#task-list a")
                await seen(page.locator("#task-detail h2 .chip.stalled"), "stalled", scroll=True)
                await expect(page.locator("#task-detail button.danger")).to_be_visible()
                await page.set_viewport_size(DESKTOP)
                await shot(page, "task-detail-1280")
            # the ingress is gone: the page says so, and the task goes on without it
            await seen(page.locator("#conn[data-state='reconnecting']"), "reconnecting", timeout=20)
            await h.wait_final(task_id, timeout=60)
            async with ingress_server(db.ingress_dsn, ingress_port=port):
                await seen(page.locator("#conn[data-state='live']"), "live", timeout=30)
                # scrolled to: the live detail may have scrolled its heading under the sticky header
                await seen(page.locator("#task-detail h2 .chip.success"), "success", timeout=30, scroll=True)
                await expect(page.locator("#stalled-banner")).to_be_hidden()
                await expect(page.locator("#task-detail button.danger")).to_have_count(0)
                loose = "[...document.querySelector('#task-detail').childNodes].filter((n) => n.nodeType === 3)"
                assert "null" not in await page.evaluate(f"{loose}.map((n) => n.textContent).join('')")
                await page.click("a[data-tab='activity']")
                shown: list[int] = []
                in_db: list[int] = []

                async def caught_up() -> bool:
                    # the feed renders as it reads: it is compared once it holds as many lines as the journal
                    lines = await page.locator("#feed .seq").all_inner_texts()
                    shown[:] = [int(line.split()[0].lstrip("#")) for line in lines]
                    if not shown:
                        return False
                    in_db[:] = tables.shown_seqs(db.admin_dsn, since=min(shown))
                    return len(shown) >= len(in_db)

                await until(caught_up, lambda: f"the activity feed to show the journal: {shown} of {in_db}", 30)
            await context.close()
    assert sorted(shown) == in_db  # every event since the page's first, once, none missing after the restart


async def test_a_new_thread_approves_a_worker_from_its_pinned_card_and_the_worker_is_a_card_in_chat(
    db: DB, tmp_path: Path
) -> None:
    handoff = {"goal": "count the files", "current_state": "there are 3 files", "next_step": "none",
               "ruled_out": [], "status": "success", "artifacts": []}
    scenario = Scenario(rules=[
        # The approval's notice is a turn of its own; only the worker's report gets the final reply, so
        # the page is quiet once that reply shows (a click on a card the follow-scroll moves can miss).
        Rule(role="orchestrator", match_last="finished", replies=[{"text": "The worker counted 3 files."}]),
        Rule(role="orchestrator", match_last="[harness]", replies=[{"text": "Noted."}]),
        Rule(role="orchestrator", replies=[
            {"tool_use": {"name": "mcp__harness__dispatch_worker", "input": {"brief": "count the files here"}}},
            {"text": "A worker is counting."}]),
        Rule(role="worker", replies=[{"text": "3 files"}]),
        Rule(role="extractor", replies=[{"tool_use": {"name": "StructuredOutput", "input": handoff}}, {"text": "ok"}]),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True), ingress_server(db.ingress_dsn) as url, \
                browser() as b:
            async with page_at(b, url, DESKTOP) as page:
                page.once("dialog", lambda d: asyncio.ensure_future(d.accept("Files")))
                await page.click("#new-thread")
                await expect(page.locator("#thread-title")).to_have_text("Files", timeout=20_000)
                await expect(page.locator("#messages")).to_contain_text("Thread started (interactive)", timeout=20_000)
                await page.fill("#composer-text", "how many files?")
                await page.click("#composer button")
                diffs: list[str] = []
                page.on("request", lambda r: diffs.append(r.url) if r.url.endswith("/diff") else None)
                card = page.locator("#pinned-asks .ask")
                await expect(card.locator(".bar")).to_contain_text("count the files here", timeout=60_000)
                await card.locator(".bar .toggle").click()
                # the brief inline, Approve / Reject only
                await expect(card.locator(".brief-text")).to_contain_text("count the files here")
                await expect(card.locator("input")).to_have_count(0)
                await card.locator("button.approve").click()
                worker = page.locator(".msg.worker", has_text="count the files here")
                await expect(worker).to_have_count(1, timeout=30_000)
                await expect(page.locator(".msg.worker", has_text="there are 3 files")).to_have_count(1, timeout=90_000)
                await expect(page.locator(".msg.assistant").last).to_have_text("The worker counted 3 files.",
                                                                                timeout=60_000)
                await expect(worker.locator(".chip")).to_have_text("success")
                await shot(page, "chat-worker-1280")
                await worker.locator("a", has_text="open the task").click()
                await expect(page.locator("#task-detail h2")).to_contain_text("worker")
                await expect(page.locator("#task-detail dl").nth(1)).to_contain_text("there are 3 files")
                # the extractor shows what it derived, and for whom; titles come from briefs, not harness text
                await page.click("a[data-tab='tasks']")
                extractor = page.locator("#task-list li", has_text="extractor")
                await expect(extractor.locator(".brief")).to_contain_text("Handoff of worker")
                await expect(page.locator("#task-list .brief", has_text="[harness]")).to_have_count(0)
                await extractor.locator("a").click()
                await expect(page.locator("#task-detail .derived-for")).to_contain_text("The handoff of worker")
                await expect(page.locator("#task-detail dl").nth(1)).to_contain_text("there are 3 files")
                assert diffs == []  # no task here is in a project: no diff is asked for
                # the scripted model's costs are not dollars: the demo shows tokens only
                await page.locator("#task-detail .derived-for a").click()
                await expect(page.locator("#task-detail h2")).to_contain_text("worker")
                await expect(page.locator("#task-detail .usage")).to_contain_text("$")
                demo = {**(await (await page.request.get(url + "/api/info")).json()), "demo": True}
                await page.route("**/api/info", lambda route: asyncio.ensure_future(route.fulfill(json=demo)))
                await page.reload()
                await expect(page.locator("body[data-ready='1']")).to_have_count(1)
                await expect(page.locator("#demo")).to_be_visible()
                await expect(page.locator("#task-detail .usage")).to_contain_text("tokens")
                await expect(page.locator("#task-detail .usage")).not_to_contain_text("$")
                await page.click("a[data-tab='context']")
                await expect(page.locator("#context-body")).to_contain_text("there are 3 files")
                await page.click("a[data-tab='activity']")
                await page.fill("#filter-type", "handoff")
                await expect(page.locator("#feed li")).to_have_count(1)
                await expect(page.locator("#feed li")).to_contain_text("handoff")


async def _kill_running_turn(admin_dsn: str, model: ScriptedModelServer, n: int) -> None:
    """SIGKILL the n-th orchestrator turn once its request reached the model (a crash, no result line)."""
    import signal

    rows: list[tuple[Any, ...]] = []

    def running() -> bool:
        nonlocal rows
        rows = tables.tasks(admin_dsn, "id", "pid", "status", role="orchestrator")
        asked = sum(r.role == "orchestrator" for r in model.requests)
        return len(rows) >= n and rows[n - 1][2] == "running" and bool(rows[n - 1][1]) and asked >= n

    await until(running, lambda: f"turn {n} running at the model; the turns: {rows}", 60)
    turn, pid, _ = rows[n - 1]
    # mid-run: its first lines journaled, as a crash would find them
    await until(lambda: tables.count_events(admin_dsn, "stream.system.init", turn), f"turn {n}'s first lines", 30)
    os.kill(pid, signal.SIGKILL)


async def test_a_failed_turn_is_an_error_record_in_chat_whose_retry_runs_the_message_again(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"stall": {"seconds": None}}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, browser() as b:
            async with page_at(b, url, PHONE) as page:
                await page.fill("#composer-text", "list the open pull requests")
                await page.click("#composer button")
                await _kill_running_turn(db.admin_dsn, model, 1)
                await _kill_running_turn(db.admin_dsn, model, 2)
                failed = page.locator("#messages .turn-failed")
                await expect(failed).to_have_count(2, timeout=30_000)
                await expect(failed.first).to_contain_text("crashed")
                await expect(failed.first.locator("button")).to_have_count(0)  # the harness re-ran that one
                retry = failed.nth(1).locator("button", has_text="Retry")
                await expect(retry).to_have_count(1)
                await shot(page, "chat-turn-failed-390")
                model.scenario.rules[:] = [Rule(role="orchestrator", replies=[{"text": "Two pull requests are open."}])]
                await retry.click()
                await expect(page.locator(".msg.assistant").last).to_have_text("Two pull requests are open.",
                                                                                timeout=60_000)
                await expect(page.locator("#messages .msg.user", has_text="list the open pull requests")
                             ).to_have_count(1)  # the message stayed in the chat, once
