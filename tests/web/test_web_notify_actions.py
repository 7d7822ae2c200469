"""The service worker's side of answering from a notification, in a real Chromium: a push with a question's
buttons shows them; pressing one sends the choice with the notification's token (no cookie, no user token) and
replaces the notification with one saying it was answered, or, pressed again, who answered; the notification's
link opens the page at that question's card."""

from __future__ import annotations

import asyncio
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
from tests.web.test_web_client import PHONE, browser

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
