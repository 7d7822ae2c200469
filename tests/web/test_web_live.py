"""Live feel in a real Chromium against the real ingress, executor, PostgreSQL and claude CLI on the
scripted model: a running turn is watched as it happens, and a page that went offline or to sleep catches
up with exactly the journal."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import psycopg
import pytest
from playwright.async_api import Page, Route, expect

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import journal
from shared.models import NewEvent
from shared.threads import DEFAULT_THREAD_ID
from tests import tables
from tests.harness import running_executor
from tests.pg import DB
from tests.proxy import FreezableProxy
from tests.web.test_web_client import DESKTOP, browser, page_at, shot
from tests.served import free_port, ingress_server
from tests.wait import until
from tests.web.seen import seen

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

pytestmark = pytest.mark.timeout(300)

FINAL_TEXT = "Nothing has been handed off yet, so there is nothing to build on and I will start fresh."


ENDLESS_ANIMATIONS = """() => document.getAnimations()
  .filter((a) => a.effect.getComputedTiming().iterations === Infinity)
  .map((a) => `${a.animationName || "?"} on ${a.effect.target?.className || a.effect.target?.id}`)"""


def _results(dsn: str) -> int:
    """A turn's end in the journal."""
    return tables.count_events(dsn, "stream.result")


def _long_turn(label: str, lines: int, *, final_delay_s: float) -> Scenario:
    """One orchestrator turn of `lines` steps ("<label> k." and a harness tool call each), then FINAL_TEXT
    in slow tokens."""
    replies: list[dict[str, object]] = [
        {"text": f"{label} {k}.", "tool_use": {"name": "mcp__harness__get_handoffs",
                                               "input": {"scope_id": str(DEFAULT_THREAD_ID)}}}
        for k in range(lines)]
    replies.append({"text": FINAL_TEXT, "delay_s": final_delay_s})
    return Scenario(rules=[Rule(role="orchestrator", replies=replies)])


async def test_a_running_turn_shows_its_text_and_tool_calls_before_its_result_then_exactly_one_reply(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[
        {"text": "Let me look at the handoffs first.",
         "tool_use": {"name": "mcp__harness__get_handoffs", "input": {"scope_id": str(DEFAULT_THREAD_ID)}}},
        {"text": FINAL_TEXT, "delay_s": 0.4}])])  # slow tokens: the reply takes ~7 s to arrive
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, browser() as b:
            async with page_at(b, url) as page:
                await page.fill("#composer-text", "what is new?")
                await page.click("#composer button")
                live = page.locator("#messages .msg.live")
                await expect(live.locator(".step.text")).to_have_text("Let me look at the handoffs first.",
                                                                      timeout=60_000)
                # on screen while the turn has no result in the journal yet
                assert _results(db.admin_dsn) == 0
                await expect(live.locator(".step.tool")).to_have_text("reading handoffs")
                await expect(live.locator(".step.tool.done")).to_have_count(1, timeout=30_000)
                # the page animates nothing endlessly while a turn runs: it would render every display
                # frame for the whole turn, and make each live line wait for the next one
                await expect(page.locator("#turn-status")).to_be_visible()
                assert await page.evaluate(ENDLESS_ANIMATIONS) == []
                await shot(page, "chat-live-390")
                # a page opened mid-turn reads back what the turn already printed, once
                async with page_at(b, url, DESKTOP) as second:
                    await expect(second.locator("#messages .msg.live .step.text")).to_have_count(1)
                    assert _results(db.admin_dsn) == 0
                    await shot(second, "chat-live-1280")
                    await _one_final_reply(second)
                await _one_final_reply(page)
                # what it said before its tool call stays in the conversation past the turn's end, before the
                # reply, and a reload reads it back (only the final reply survived the turn's end before)
                said = "#messages .msg.assistant.said"
                for p in (page, await _reloaded(page)):
                    await expect(p.locator(said)).to_have_text(["Let me look at the handoffs first."])
                    await expect(p.locator(f"{said} ~ .msg.assistant:not(.said)")).to_have_text(FINAL_TEXT)
                    await seen(p.locator(said), "Let me look at the handoffs first.", scroll=True)


async def test_a_long_turn_keeps_its_newest_steps_in_view_folds_the_rest_once_each_and_follows_only_a_reader_at_the_bottom(
    db: DB, tmp_path: Path
) -> None:
    lines = 60
    # slow tokens at the end: time to read the folded card
    with ScriptedModelServer(_long_turn("step line", lines, final_delay_s=0.3)) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, browser() as b:
            async with page_at(b, url) as page:
                await page.fill("#composer-text", "go")
                await page.click("#composer button")
                live = page.locator("#messages .msg.live")
                shown = live.locator(":scope > ol.steps > .step")
                folded = live.locator("details.earlier")
                # a reader at the bottom is followed: the newest line is in view as it lands
                await expect(live.locator(".step.text", has_text="step line 5.")).to_be_in_viewport(timeout=60_000)
                # scrolled up (once the card is taller than the screen), the reader stays where they are
                # while lines keep landing
                await expect(folded).to_be_visible(timeout=60_000)
                await page.evaluate("window.scrollTo(0, 0)")
                at = await live.locator(".step.text").count()
                await expect(live.locator(".step.text", has_text=f"step line {at + 3}.")).to_have_count(1, timeout=60_000)
                assert await page.evaluate("window.scrollY") == 0
                # another view is not scrolled for Chat
                await page.click("a[data-tab='activity']")
                await page.evaluate("window.scrollTo(0, 0)")
                at = await live.locator(".step.text").count()
                await expect(live.locator(".step.text", has_text=f"step line {at + 3}.")).to_have_count(1, timeout=60_000)
                assert await page.evaluate("window.scrollY") == 0
                # back in Chat at the bottom, followed again
                await page.click("a[data-tab='chat']")
                await expect(page.locator("#messages")).to_be_visible()
                await page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
                await expect(live.locator(".step.text", has_text=f"step line {lines - 1}.")).to_be_in_viewport(
                    timeout=60_000)
                # the newest 40 steps in view, the rest folded, every line once and in order
                await expect(shown).to_have_count(40)
                await expect(folded.locator("summary")).to_have_text(f"{2 * lines - 40} earlier steps")
                await folded.locator("summary").click()
                texts = await live.locator(".step.text").all_inner_texts()
                assert texts == [f"step line {k}." for k in range(lines)]
                assert _results(db.admin_dsn) == 0
                await _one_final_reply(page)


async def test_a_press_holds_a_followed_chat_still_until_it_lifts_then_the_follow_catches_up(
    db: DB, tmp_path: Path
) -> None:
    at_bottom = "() => window.innerHeight + window.scrollY >= document.body.scrollHeight - 80"
    with ScriptedModelServer(_long_turn("held line", 60, final_delay_s=0.3)) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, browser() as b:
            async with page_at(b, url) as page:
                await page.fill("#composer-text", "go")
                await page.click("#composer button")
                live = page.locator("#messages .msg.live")
                texts = live.locator(".step.text")
                await page.wait_for_function("() => document.body.scrollHeight > 1.5 * window.innerHeight",
                                             timeout=60_000)
                await expect(texts.last).to_be_in_viewport()
                # a finger down on a line in view: the lines landing meanwhile (past the fold's threshold
                # too) do not move the page under it
                box = await texts.last.bounding_box()
                assert box is not None
                x, y = box["x"] + 4, box["y"] + box["height"] / 2
                under = """([x, y]) => { const s = document.elementFromPoint(x, y)?.closest(".step");
                                         return s ? `${s.dataset.seq} ${s.textContent}` : null; }"""
                await page.mouse.move(x, y)
                await page.mouse.down()
                pressed = await page.evaluate(under, [x, y])
                assert pressed, "the press did not land on a step"
                at = await texts.count()
                await expect(texts.filter(has_text=f"held line {at + 6}.")).to_have_count(1, timeout=60_000)
                assert await page.evaluate(under, [x, y]) == pressed
                assert not await page.evaluate(at_bottom)
                # lifted, the reader is still followed (the held scroll runs a moment later) and the
                # earlier steps fold again
                await page.mouse.up()
                await page.wait_for_function(at_bottom, timeout=10_000)
                await expect(live.locator("details.earlier")).to_be_visible()
                assert _results(db.admin_dsn) == 0
                await _one_final_reply(page)


async def test_the_task_view_tails_a_running_turn_in_order_once_each_and_follows_only_a_reader_at_the_bottom(
    db: DB, tmp_path: Path
) -> None:
    lines = 40
    with ScriptedModelServer(_long_turn("tail line", lines, final_delay_s=0.2)) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, browser() as b:
            async with page_at(b, url) as page:
                await page.fill("#composer-text", "go")
                await page.click("#composer button")
                (turn,) = await until(lambda: next(iter(tables.tasks(db.admin_dsn, "id", role="orchestrator",
                                                                     status="running")), None), "the turn running", 60)
                await page.evaluate(f"location.hash = '#task/{turn}'")
                events = page.locator("#task-detail ol.events")
                # opened mid-run, it reads what was printed so far, then tails: a reader at the bottom sees the
                # newest line as it lands, once the list is taller than the screen too
                await page.wait_for_function("() => document.body.scrollHeight > 2 * window.innerHeight",
                                             timeout=60_000)
                await expect(events.locator("li").last).to_be_in_viewport()
                # scrolled up, the reader stays where they are while lines keep landing
                await page.evaluate("window.scrollTo(0, 0)")
                at = await events.locator("li", has_text="tail line").count()
                await expect(events.locator("li", has_text=f"tail line {at + 3}.")).to_have_count(1, timeout=60_000)
                assert await page.evaluate("window.scrollY") == 0
                assert _results(db.admin_dsn) == 0
                # another view's reader is not moved for the task view, a reader who scrolls up in the very
                # frame Chat is shown (and scrolled to its bottom) too
                await page.evaluate("""() => {
                    addEventListener("hashchange", () => window.scrollTo(0, 0), { once: true });
                    document.querySelector("a[data-tab='chat']").click();
                }""")
                await expect(page.locator("#messages")).to_be_visible()
                at = await events.locator("li", has_text="tail line").count()
                await expect(events.locator("li", has_text=f"tail line {at + 3}.")).to_have_count(1, timeout=60_000)
                assert await page.evaluate("window.scrollY") == 0
                # back in the task view at the bottom, followed again to the end
                await page.evaluate(f"location.hash = '#task/{turn}'")
                await expect(page.locator("#task-detail")).to_be_visible()
                await page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
                await expect(events.locator("li", has_text="result: success")).to_be_in_viewport(timeout=60_000)
                await expect(page.locator("#task-detail h2 .chip")).to_have_text("success", timeout=30_000)
                await page.wait_for_timeout(500)  # a late duplicate would show up here
                in_db = tables.shown_seqs(db.admin_dsn, task_id=turn)
                kinds = [int(k.split()[0].lstrip("#")) for k in await events.locator(".kind").all_inner_texts()]
                shown = list(dict.fromkeys(kinds))  # an assistant line's text and tool call share its seq
                assert shown == in_db, "the task view is not the journal: a gap, a duplicate or out of order"
                texts = [t for t in await events.locator("li").all_inner_texts() if "tail line" in t]
                assert [t.split("\n")[-1].strip() for t in texts] == [f"tail line {k}." for k in range(lines)]


async def _reloaded(page: Page) -> Page:
    await page.reload()
    await expect(page.locator("body[data-ready='1']")).to_have_count(1, timeout=20_000)
    return page


async def _one_final_reply(page: Page) -> None:
    # the final reply once; what the turn said before its tool calls stays as messages of their own (.said)
    reply = page.locator("#messages .msg.assistant:not(.said)")
    await expect(reply).to_have_text(FINAL_TEXT, timeout=60_000)
    await expect(page.locator("#messages .msg.live")).to_have_count(0)
    await expect(page.locator("#turn-status")).to_be_hidden(timeout=30_000)
    await page.wait_for_timeout(500)  # a late duplicate would show up here
    await expect(reply).to_have_count(1)
    await expect(page.locator("#messages .msg.user")).to_have_count(1)


async def _feed_equals_journal(page: Page, admin_dsn: str, first_seq: int) -> None:
    await page.click("a[data-tab='activity']")
    in_db = []
    for _ in range(100):
        in_db = tables.shown_seqs(admin_dsn, since=first_seq)
        shown = [int(s.split()[0].lstrip("#")) for s in await page.locator("#feed .seq").all_inner_texts()]
        shown = [s for s in shown if s >= first_seq]
        if sorted(shown) == in_db:
            break
        await page.wait_for_timeout(200)
    assert len(shown) == len(set(shown)), "an event is shown twice"
    assert sorted(shown) == in_db  # none missing


async def test_offline_then_online_and_a_sleeping_page_woken_end_with_the_journal_no_gap_no_duplicate(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[Rule(role="worker", replies=[{"text": "done", "delay_s": 0.05}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, ingress_server(db.ingress_dsn) as url, browser() as b:
            async with page_at(b, url) as page:
                streams: list[str] = []
                page.on("request", lambda r: streams.append(r.url) if r.url.endswith("/api/stream") else None)
                await seen(page.locator("#conn[data-state='live']"), "live")
                async with httpx.AsyncClient(base_url=url) as http:
                    head = (await http.get("/api/info")).json()["journal_head"]
                # offline: the page says so; events keep being journaled meanwhile
                await page.context.set_offline(True)
                await seen(page.locator("#conn[data-state='offline']"), "offline")
                first = await h.dispatch("one while offline")
                await h.wait_final(first)
                await page.context.set_offline(False)
                await seen(page.locator("#conn[data-state='live']"), "live", timeout=10)
                await _feed_equals_journal(page, db.admin_dsn, head + 1)
                # asleep (a frozen, hidden page), then woken: it reconnects at once and catches up
                cdp = await page.context.new_cdp_session(page)
                before = len(streams)
                await cdp.send("Page.setWebLifecycleState", {"state": "frozen"})
                second = await h.dispatch("one while asleep")
                await h.wait_final(second)
                await cdp.send("Page.setWebLifecycleState", {"state": "active"})
                await page.evaluate("document.dispatchEvent(new Event('visibilitychange'))")
                for _ in range(50):
                    if len(streams) > before:
                        break
                    await page.wait_for_timeout(100)
                assert len(streams) > before, "waking the page did not reconnect the stream"
                await seen(page.locator("#conn[data-state='live']"), "live", timeout=10)
                await _feed_equals_journal(page, db.admin_dsn, head + 1)
                await page.click("a[data-tab='tasks']")
                await expect(page.locator("#task-list .chip.success")).to_have_count(2)


# ---- optimistic actions ---------------------------------------------------------------------------------

QUESTION = {"question": "Go ahead?", "header": "Go", "multiSelect": False,
            "options": [{"label": "Yes", "description": ""}, {"label": "No", "description": ""}]}


async def test_actions_show_at_once_unconfirmed_ones_offer_retry_and_refused_ones_revert_with_the_reason(
    db: DB, tmp_path: Path
) -> None:
    qid = tables.ask(db.admin_dsn, [QUESTION], tool_use_id="toolu_optimistic", source_session_uuid=DEFAULT_THREAD_ID)
    async with ingress_server(db.ingress_dsn) as url, browser() as b:
        async with page_at(b, url) as page:
            # a message shows at once, before the server has answered
            release = asyncio.Event()

            async def slow(route: Route) -> None:
                await release.wait()
                await route.continue_()

            await page.route("**/api/chat", slow)
            await page.fill("#composer-text", "hello there")
            await page.click("#composer button")
            bubble = page.locator(".msg.user.pending")
            await expect(bubble).to_contain_text("sending…", timeout=1_000)
            await expect(page.locator("#composer-text")).to_have_value("")
            release.set()
            # no executor runs here: the queued message says what it waits for (js/fleet.js)
            await expect(bubble).to_contain_text("no executor is running; delivered when one is back")
            await page.unroute("**/api/chat")
            # refused by the server: back in the composer with the server's reason, nothing left pending
            await page.fill("#composer-text", "x" * 100_001)
            await page.click("#composer button")
            await expect(page.locator("#composer-error")).to_contain_text("Not sent:")
            await expect(page.locator("#composer-text")).to_have_value("x" * 100_001)
            await expect(bubble).to_have_count(1)
            await page.fill("#composer-text", "")
            # an answer that gets no confirmation says so and offers Retry; the retry lands
            hung: list[Route] = []
            await page.route("**/api/asks/*/answer", lambda route: hung.append(route))
            card = page.locator(f"#pinned-asks .ask[data-ask-id='{qid}']")
            await card.locator(".bar .toggle").click()
            await card.locator(".option label", has_text="Yes").click()
            await card.locator("button[type='submit']").click()
            await expect(card.locator(".status")).to_have_text("Sending your answer…", timeout=1_000)
            await expect(card.locator(".status")).to_contain_text("No confirmation yet", timeout=15_000)
            await shot(page, "ask-unconfirmed-390")
            await hung[0].abort()
            await expect(card.locator(".error")).to_contain_text("Not sent")
            await page.unroute("**/api/asks/*/answer")
            await card.locator("button.retry").click()
            await expect(card).to_have_count(0)
    with psycopg.connect(db.admin_dsn) as conn:
        row = tables.row(conn, "questions", qid, "status", "answers")
        queued = tables.count(conn, "chat_queue")
    assert row == ("answered", {"Go ahead?": "Yes"})
    assert queued == 1  # the refused message wrote nothing


async def test_a_workers_activity_folds_under_its_dispatch_in_chat_and_in_the_turns_task_view(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[
        Rule(role="orchestrator", match_last="[harness]", replies=[{"text": "The worker counted 3 files."}]),
        Rule(role="orchestrator", replies=[
            {"tool_use": {"name": "mcp__harness__dispatch_worker", "input": {"brief": "count the files here"}}},
            {"text": "A worker is counting."}]),
        Rule(role="worker", replies=[{"text": "Counting now: there are 3 files.", "delay_s": 0.2}]),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, browser() as b, \
                httpx.AsyncClient(base_url=url) as http:
            made = (await http.post("/api/threads", json={"title": "Files", "mode": "autonomous"})).json()
            async def listed() -> bool:
                return any(t["id"] == made["thread_id"] for t in (await http.get("/api/threads")).json()["threads"])

            await until(listed, "the new thread listed", 30)
            async with page_at(b, url, DESKTOP) as page:
                await expect(page.locator("#thread-title")).to_have_text("Files")
                await page.fill("#composer-text", "how many files?")
                await page.click("#composer button")
                worker = page.locator(".msg.worker", has_text="count the files here")
                await expect(worker).to_have_count(1, timeout=60_000)
                await worker.locator("details.activity > summary").click()
                await expect(worker.locator("details.activity .step.text")).to_contain_text("there are 3 files",
                                                                                         timeout=60_000)
                await expect(worker.locator(".chip")).to_have_text("success", timeout=60_000)
                await shot(page, "chat-worker-folded-1280")
                tasks = (await http.get("/api/tasks", params={"thread_id": made["thread_id"]})).json()["tasks"]
                turn = next(t for t in reversed(tasks) if t["role"] == "orchestrator")
                await page.evaluate(f"location.hash = '#task/{turn['id']}'")
                child = page.locator("#task-detail .events .children a")
                await expect(child).to_have_count(1, timeout=20_000)
                await expect(child).to_contain_text("worker")
                await shot(page, "task-turn-folded-1280")


async def test_a_stream_gone_silent_without_closing_is_dropped_by_the_watchdog_and_resumed(db: DB) -> None:
    port = free_port()
    # a TCP proxy that can freeze its connections: the page's stream goes silent but stays open
    async with FreezableProxy(f"host=127.0.0.1 port={port} dbname=unused") as proxy:
        async with ingress_server(db.ingress_dsn, ingress_port=port, sse_heartbeat_s=1.0,
                                  allowed_hosts=f"127.0.0.1:{proxy.port}"), browser() as b:
            async with page_at(b, f"http://127.0.0.1:{proxy.port}") as page:
                await page.click("a[data-tab='activity']")
                info = await page.evaluate("fetch('/api/info').then((r) => r.json())")
                assert info["heartbeat_s"] == 1.0
                streams: list[str] = []
                page.on("request", lambda r: streams.append(r.url) if r.url.endswith("/api/stream") else None)
                await expect(page.locator("#conn")).to_have_attribute("data-state", "live")
                proxy.freeze_existing()
                async with await psycopg.AsyncConnection.connect(db.executor_dsn) as conn:
                    await journal.append_on(conn, [NewEvent("executor.started", {"probe": i}) for i in range(3)])
                    await conn.commit()
                # two silent heartbeat intervals later the page reconnects by itself and catches up (a
                # reconnect the browser puts on another frozen keep-alive socket is dropped the same way)
                await expect(page.locator("#feed")).to_contain_text('"probe":2', timeout=30_000)
                assert streams, "the watchdog never opened a new stream"
                await expect(page.locator("#conn")).to_have_attribute("data-state", "live")
