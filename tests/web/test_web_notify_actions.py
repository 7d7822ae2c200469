"""The service worker's side of answering from a notification, in a real Chromium: a push with a question's
buttons shows them; pressing one sends the choice with the notification's token (no cookie, no user token) and
replaces the notification with one saying it was answered, or, pressed again, who answered; the notification's
link opens the page at that question's card."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import expect

from petal_dispatch.demo.scripted_model import ScriptedModelServer
from tests import tables
from tests.e2e.test_notify import _loopback_push, _subscribe
from tests.e2e.test_notify_actions import _asking
from tests.pg import DB
from tests.harness import running_executor
from tests.push_standin import StandIn, Subscriber
from tests.served import ingress_server
from tests.wait import until
from tests.web.test_web_client import PHONE, browser, page_at

pytestmark = pytest.mark.timeout(240)

# a label longer than a button's title (40 characters): the whole label is what the button answers with
LONG = "Yes, deploy to staging and run the smoke tests there"
QUESTION = {"question": "Deploy to staging now?", "header": "Deploy", "multiSelect": False,
            "options": [{"label": LONG, "description": ""}, {"label": "Later", "description": ""}]}
NOTIFICATIONS = "self.registration.getNotifications().then(ns => ns.map(n => [n.title, n.body, n.tag]))"


async def test_a_notification_s_button_answers_in_the_service_worker_and_its_link_opens_the_card(
    db: DB, tmp_path: Path
) -> None:
    with StandIn() as push, ScriptedModelServer(_asking(QUESTION)) as model:
        phone = Subscriber(f"{push.url}/push/phone-1")
        async with running_executor(db, model, tmp_path, notify_config=_loopback_push(tmp_path)), \
                ingress_server(db.ingress_dsn, push_allow_loopback=True) as url, \
                httpx.AsyncClient(base_url=url) as http, browser() as b:
            await _subscribe(http, phone)
            await http.post("/api/chat", json={"text": "ship it"})
            payload: dict[str, Any] = phone.decrypt((await asyncio.to_thread(push.wait_for, 1))[0].body)
            qid = payload["question_id"]
            context = await b.new_context(viewport=PHONE, permissions=["notifications"])
            page = await context.new_page()
            await page.goto(f"{url}/#asks/{qid}")  # the notification's link
            await expect(page.locator("body[data-ready='1']")).to_have_count(1, timeout=20_000)
            card = page.locator(f"#ask-cards form[data-ask-id='{qid}']")
            await expect(card).to_be_focused(timeout=20_000)
            sw = context.service_workers[0] if context.service_workers else \
                await context.wait_for_event("serviceworker")
            shown = await sw.evaluate("(p) => shown(p)", payload)
            data = shown["data"]
            first = await sw.evaluate("([d, tag]) => self.act(d, '0', tag)", [data, payload["tag"]])
            after_first = await sw.evaluate(NOTIFICATIONS)
            second = await sw.evaluate("([d, tag]) => self.act(d, '1', tag)", [data, payload["tag"]])
            after_second = await sw.evaluate(NOTIFICATIONS)
            # the page's history says where the answer came from
            await expect(page.locator(f"#ask-history li[data-ask-id='{qid}']")).to_contain_text(
                "from a notification (web push)", timeout=20_000)
            await context.close()
    assert [a["title"] for a in shown["actions"]] == [LONG[:39] + "…", "Later", "Reply"]
    assert data["choices"] == [LONG, "Later"] and data["url"] == f"/#asks/{qid}"
    assert (first, second) == ("answered", "settled")
    assert after_first == [["Answered", f"You answered “{LONG}”.", payload["tag"]]]
    assert after_second == [["Already answered", "Answered by notification (web push).", payload["tag"]]]
    assert tables.row(db.admin_dsn, "questions", qid, "answers", "answered_by") == (
        {"Deploy to staging now?": LONG}, "notification (web push)")


async def test_the_settings_say_what_notifies_mute_the_open_thread_and_the_page_says_when_it_is_in_view(
    db: DB, tmp_path: Path
) -> None:
    def presence() -> list[tuple[Any, ...]]:
        return tables.rows(db.admin_dsn, "client_presence", "visible", order=("seen_at",))

    with ScriptedModelServer(_asking()) as model:
        async with running_executor(db, model, tmp_path, notify_config=_loopback_push(tmp_path)), \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http, browser() as b:
            thread = (await http.post("/api/threads", json={"title": "Night build"})).json()["thread_id"]
            async with page_at(b, url) as page:
                await page.goto(f"{url}/#chat/{thread}")
                await expect(page.locator("#thread-title")).to_contain_text("Night build", timeout=20_000)
                await until(lambda: presence() == [(True,)], "the page to say it is in view", 20)
                await page.click("#notify-button")
                await expect(page.locator("#notify-policy li")).to_have_count(4)
                policy = await page.locator("#notify-policy li").all_inner_texts()
                await expect(page.locator("#notify-mute-title")).to_have_text(" (Night build)")
                await page.check("#notify-mute")
                await expect(page.locator("#notify-result")).to_have_text("This thread is muted.")
                muted = tables.rows(db.admin_dsn, "notify_mutes", "thread_id", "muted_by", order=("muted_at",))
                await page.uncheck("#notify-mute")
                await expect(page.locator("#notify-result")).to_have_text("This thread notifies again.")
                # hidden (another tab, the phone locked): the page says so at once
                await page.evaluate("""() => { Object.defineProperty(document, 'visibilityState', {value: 'hidden'});
                                               document.dispatchEvent(new Event('visibilitychange')); }""")
                await until(lambda: presence() == [(False,)], "the page to say it is hidden", 20)
    assert any("digest, at most every 2 minutes" in p for p in policy) and any("No quiet hours" in p for p in policy)
    assert muted == [(uuid.UUID(thread), "open")]
    assert tables.count(db.admin_dsn, "notify_mutes") == 0
