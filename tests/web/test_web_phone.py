"""The page at phone and desktop sizes against the real ingress and PostgreSQL: a waiting question docks as
a one-line bar that opens in place and leaves the conversation half the screen, every action on screen; an
approval shows its brief with Approve / Reject only; an answer shows in Asks history and in Chat; a harness
report is a compact note; the toolbar's controls are touch-sized and labelled; a terminal session's bar beside an
open question keeps one line and the conversation its half; no console errors."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest
from playwright.async_api import Browser, Page, ViewportSize, expect

from shared import journal
from shared.models import NewEvent
from shared.threads import DEFAULT_THREAD_ID
from tests import tables
from tests.pg import DB
from tests.web.test_web_client import DESKTOP, PHONE, browser, page_at, shot
from tests.web.test_web_layout import UNCOVERED
from tests.served import ingress_server

pytestmark = pytest.mark.timeout(240)

SIZES = pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390x844", "1280x800"])


def _question(i: int) -> dict[str, object]:
    return {"question": f"Question {i}: which of these approaches should the worker take for part {i}?",
            "header": f"Part {i}", "multiSelect": i % 2 == 0,
            "options": [{"label": f"Option {k}", "description": "a longer description of what this option means " * 2}
                        for k in range(4)]}


def _insert_ask(admin_dsn: str, questions: list[dict[str, object]], asked_by: str = "model") -> uuid.UUID:
    return tables.only_ask(admin_dsn, questions, source_session_uuid=DEFAULT_THREAD_ID, asked_by=asked_by)


@asynccontextmanager
async def watched(b: Browser, url: str, viewport: ViewportSize) -> AsyncIterator[Page]:
    """page_at, and no console error (a failed request included) on the way."""
    async with page_at(b, url, viewport) as page:
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        yield page
        await asyncio.sleep(0.3)  # a window in which a late error (a request still in flight) would be logged
        assert errors == [], errors


# the conversation's share of the screen: what the bars that stay on screen (the header and the tabs,
# above or below) and the dock leave of the viewport's height
CONVERSATION = """() => {
  const bars = [...document.querySelectorAll('.top, .tabs')].map((el) => el.getBoundingClientRect().height);
  const dock = document.querySelector('.dock').getBoundingClientRect().height;
  return (innerHeight - bars.reduce((a, b) => a + b, 0) - dock) / innerHeight;
}"""


async def _on_screen(page: Page, selector: str) -> None:
    el = page.locator(selector)
    await expect(el).to_be_visible()
    assert await el.evaluate(UNCOVERED), f"{selector} is off screen or covered: {await el.bounding_box()}"
    box = await el.bounding_box()
    assert box is not None and box["height"] >= 44, f"{selector} is {box} (a touch target is at least 44 px)"


async def _half_the_screen(page: Page) -> None:
    await page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    share = await page.evaluate(CONVERSATION)
    if share < 0.5:
        await shot(page, "phone-half-the-screen-failed")
    assert share >= 0.5, f"the conversation keeps {share:.0%} of the screen"


@SIZES
async def test_a_four_question_ask_docks_as_a_bar_that_opens_in_place_and_the_answer_is_in_asks_history(
    db: DB, viewport: ViewportSize
) -> None:
    size = viewport["width"]
    async with ingress_server(db.ingress_dsn) as url, browser() as b:
        ask = _insert_ask(db.admin_dsn, [_question(i) for i in range(1, 5)])
        async with watched(b, url, viewport) as page:
            card = page.locator(f"#pinned-asks .ask[data-ask-id='{ask}']")
            bar = card.locator(".bar")
            await expect(bar).to_contain_text("Claude asks: Question 1")
            await expect(bar.locator(".more")).to_have_text("+3 more")
            await expect(card.locator("fieldset").first).to_be_hidden()
            await _half_the_screen(page)
            for selector in (f"#pinned-asks .ask[data-ask-id='{ask}'] .bar .toggle", "#composer-text",
                             "#composer button"):
                await _on_screen(page, selector)
            await shot(page, f"phone-ask-bar-{size}")
            # opened in place: still half the screen, every action on screen without scrolling the card
            await bar.locator(".toggle").click()
            await expect(card.locator("fieldset")).to_have_count(4)
            await expect(card.locator("fieldset").first).to_be_visible()
            await _half_the_screen(page)
            assert await page.locator("#pinned-asks").evaluate("(el) => el.scrollTop") == 0
            base = f"#pinned-asks .ask[data-ask-id='{ask}']"
            for selector in (f"{base} .bar .toggle", f"{base} button[type='submit']", f"{base} button.dismiss",
                             f"{base} input.reply"):
                await _on_screen(page, selector)
            await shot(page, f"phone-ask-open-{size}")
            # folded again, and opened to answer
            await bar.locator(".toggle").click()
            await expect(card.locator("fieldset").first).to_be_hidden()
            await expect(page.locator("#composer-text")).to_be_visible()
            await bar.locator(".toggle").click()
            for i in range(4):
                q = card.locator("fieldset").nth(i)
                await q.scroll_into_view_if_needed()
                await q.locator(".option label", has_text="Option 2").click()
            await card.locator("button[type='submit']").click()
            await expect(card).to_have_count(0)
            await expect(page.locator("#composer-text")).to_be_visible()
            await page.click("a[data-tab='asks']")
            history = page.locator(f"#ask-history li[data-ask-id='{ask}']")
            await expect(history).to_contain_text("Question 1: which of these approaches")
            await expect(history.locator(".answer")).to_have_count(4)
            await expect(history.locator(".answer").first).to_have_text("Option 2")
            await shot(page, f"phone-asks-history-{size}")


@SIZES
async def test_an_approval_shows_its_brief_inline_with_approve_and_reject_only(
    db: DB, viewport: ViewportSize
) -> None:
    brief = "Count the files in the repository\n" + "\n".join(f"- step {i}: look at part {i} closely"
                                                              for i in range(12))
    approval = [{"question": "The orchestrator wants to start a worker with this brief. Start it?",
                 "header": "Dispatch", "multiSelect": False,
                 "options": [{"label": "Approve", "description": "start the worker now", "preview": brief},
                             {"label": "Reject", "description": "do not start it"}]}]
    async with ingress_server(db.ingress_dsn) as url, browser() as b:
        ask = _insert_ask(db.admin_dsn, approval, asked_by="harness")
        async with watched(b, url, viewport) as page:
            card = page.locator(f"#pinned-asks .ask[data-ask-id='{ask}']")
            await expect(card.locator(".bar")).to_contain_text("Count the files in the repository")
            await card.locator(".bar .toggle").click()
            text = card.locator(".brief-text")
            await expect(text).to_be_visible()
            await expect(text).to_contain_text("Count the files in the repository")
            clamped = await text.evaluate("(el) => el.scrollHeight > el.clientHeight + 2")
            assert clamped, "a long brief is clamped"
            await card.locator("button.show-all").click()
            assert await text.evaluate("(el) => el.scrollHeight <= el.clientHeight + 2")
            await card.locator("button.show-all").click()
            await expect(card.locator("input.other")).to_have_count(0)
            await expect(card.locator("input")).to_have_count(0)
            names = await card.locator(".actions button:visible").all_inner_texts()
            assert names == ["Approve", "Reject"], names
            await _half_the_screen(page)
            for name in ("approve", "reject"):
                await _on_screen(page, f"#pinned-asks .ask[data-ask-id='{ask}'] button.{name}")
            await shot(page, f"phone-approval-{viewport['width']}")
            await card.locator("button.approve").click()
            await expect(card).to_have_count(0)
    assert tables.row(db.admin_dsn, "questions", ask, "status", "answers") == (
        "answered", {approval[0]["question"]: "Approve"})


@SIZES
async def test_a_harness_report_is_a_compact_note_and_an_answer_shows_in_chat_and_the_toolbar_is_touch_sized(
    db: DB, viewport: ViewportSize
) -> None:
    worker = uuid.uuid4()
    report = f"[harness] Worker {worker} finished. Its handoff:\ngoal: count\nstate: there are 3 files"
    with psycopg.connect(db.admin_dsn) as conn:
        tables.ensure_thread(conn, DEFAULT_THREAD_ID, mode="interactive")
    async with await psycopg.AsyncConnection.connect(db.executor_dsn) as aconn:
        await journal.append_on(aconn, [
            NewEvent("thread.harness_message",
                     {"text": report, "thread_id": str(DEFAULT_THREAD_ID), "origin": "harness"},
                     session_id=DEFAULT_THREAD_ID),
            NewEvent("question.answered",
                     {"question_id": str(uuid.uuid4()), "response": None,
                      "answers": {"Which way?": "Left", "Which checks?": ["Lint", {"other": "Bench"}]}},
                     session_id=DEFAULT_THREAD_ID)])
        await aconn.commit()
    tables.insert(db.admin_dsn, "chat_queue", thread_id=DEFAULT_THREAD_ID, origin="harness",
                  text=(f"[harness] Worker {worker} ended failed; the harness skipped it (x). "
                        "It left no output to extract:\n(nothing)"))
    async with ingress_server(db.ingress_dsn) as url, browser() as b:
        async with watched(b, url, viewport) as page:
            notes = page.locator("#messages .msg.note.harness")
            await expect(notes).to_have_count(2)
            await expect(page.locator("#messages .msg.user")).to_have_count(0)
            for i in range(2):
                note = notes.nth(i)
                await expect(note).to_contain_text(f"Worker {str(worker)[:8]}")
                await expect(note).not_to_contain_text(str(worker))
                await expect(note.locator(f"a[href='#task/{worker}']")).to_have_count(1)
            await expect(notes.first.locator("details pre")).to_contain_text("there are 3 files")
            answered = page.locator("#messages .msg.note.answered")
            await expect(answered).to_contain_text("Which way?")
            await expect(answered.locator(".answer")).to_have_text(["Left", "Lint, Bench"])
            # the toolbar: touch targets with visible labels; the search's placeholder fits, and focusing it
            # moves nothing
            for selector in ("#thread-picker", "#new-thread", "#notify-button", "#thread-rename", "#thread-archive",
                             "#thread-search", "#thread-mode"):
                box = await page.locator(selector).bounding_box()
                assert box is not None and box["height"] >= 44, f"{selector}: {box}"
            await expect(page.locator(".picker .label")).to_be_visible()
            await expect(page.locator(".picker .label")).to_have_text("Thread")
            await expect(page.locator(".mode .label")).to_be_visible()
            fits = await page.locator("#thread-search").evaluate("""(el) => {
              const s = getComputedStyle(el); const c = document.createElement('canvas').getContext('2d');
              c.font = `${s.fontSize} ${s.fontFamily}`;
              const room = el.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
              return c.measureText(el.placeholder).width <= room;
            }""")
            assert fits, "the search's placeholder is cut"
            boxes = ("() => ['#thread-rename', '#thread-archive', '#thread-search', '#thread-mode', '#thread-picker']"
                     ".map((s) => JSON.stringify(document.querySelector(s).getBoundingClientRect()))")
            before = await page.evaluate(boxes)
            await page.focus("#thread-search")
            await asyncio.sleep(0.2)  # a window in which focusing the search would shift the bar (it must not)
            assert await page.evaluate(boxes) == before
            await shot(page, f"phone-notes-{viewport['width']}")
            # no view logs an error
            for tab in ("tasks", "asks", "activity", "context", "chat"):
                await page.click(f"a[data-tab='{tab}']")
                await expect(page.locator(f"#view-{tab}")).to_be_visible()


async def test_a_terminal_threads_bar_and_an_open_question_leave_the_conversation_half_a_phone(db: DB) -> None:
    # a thread live in a terminal (its bar at its longest: shown on a tty, not sandboxed, a message waiting) and a
    # question of it opened in place: the bar stays one line of touch-sized buttons, the card gives way to it
    with psycopg.connect(db.admin_dsn) as conn:
        tables.ensure_thread(conn, DEFAULT_THREAD_ID, mode="interactive")
        turn = tables.insert_task(conn, session_id=DEFAULT_THREAD_ID, role="orchestrator", brief="at the desk",
                                  status="running", activity="running")
        tables.add(conn, "terminal_sessions", task_id=turn, thread_id=DEFAULT_THREAD_ID, executor_name="desk",
                   cli_session_id=str(uuid.uuid4()), cwd="/home/someone/projects/a-rather-long-directory-name",
                   sandboxed=False, held_by="/dev/pts/12", input_waiting=True)
    ask = _insert_ask(db.admin_dsn, [_question(i) for i in range(1, 3)])
    async with ingress_server(db.ingress_dsn) as url, browser() as b:
        async with watched(b, url, PHONE) as page:
            bar = page.locator("#terminal-live")
            await expect(bar.locator(".where")).to_have_attribute("title",
                                                               "shown in /dev/pts/12 · not sandboxed (your own session)")
            await expect(bar.locator(".chip.waiting")).to_have_text("message waits")
            # the chat box says where a message goes (typed into the session), not "Tell the orchestrator"
            await expect(page.locator("#composer-text")).to_have_attribute(
                "placeholder", "Type to the terminal session (at its next empty prompt)…")
            for selector in ("#terminal-stop", "#terminal-end"):
                await _on_screen(page, selector)
            lines = await bar.evaluate("(el) => el.getBoundingClientRect().height")
            assert lines < 60, f"the bar wraps: {lines} px high"
            card = page.locator(f"#pinned-asks .ask[data-ask-id='{ask}']")
            await card.locator(".bar .toggle").click()
            await expect(card.locator("fieldset").first).to_be_visible()
            await _half_the_screen(page)
            assert await page.locator("#pinned-asks").evaluate("(el) => el.scrollTop") == 0  # from its question
            base = f"#pinned-asks .ask[data-ask-id='{ask}']"
            for selector in ("#terminal-stop", "#terminal-end", f"{base} .bar .toggle", f"{base} button[type='submit']"):
                await _on_screen(page, selector)
            await shot(page, "phone-terminal-and-ask")
