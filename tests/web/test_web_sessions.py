"""The Sessions picker on a phone, in a real Chromium against the real services: a conversation begun in a
terminal is found by text, continued with one tap (a background read meanwhile neither closes the directory list
nor offers a second tap), its history shown in Chat, and the thread's header offers the command that hands it back
to a terminal."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

import pytest
from playwright.async_api import Route, expect

from executor.sessions.index import SessionsConfig
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import threads
from tests.e2e.test_sessions import Terminal, stored_conversation
from tests.harness import claude_bin, running_executor
from tests.pg import DB
from tests.served import ingress_server
from tests.web.test_web_a11y import axe_violations, check_reached_by_tab
from tests.web.test_web_client import PHONE, browser, page_at, shot

pytestmark = [pytest.mark.web, pytest.mark.timeout(240)]

# what a terminal event or the stream's resumption does to the open picker (app.js): the same module instance
RELOAD = "async () => (await import('/js/sessions.js')).reloadSessions()"


async def test_a_terminal_conversation_is_picked_and_continued_with_one_tap_on_a_phone(db: DB, tmp_path: Path) -> None:
    roots = tmp_path / "projects"
    with ScriptedModelServer(Scenario(rules=[Rule(replies=[{"text": "terminal reply"}])])) as model:
        term = Terminal(model, tmp_path / "desk", roots / "shop")
        async with running_executor(db, model, tmp_path, project_roots=(roots,),
                                    sessions=SessionsConfig(dirs=(term.config,), poll_s=0.2)), \
                ingress_server(db.ingress_dsn) as url, browser() as b:
            sid = stored_conversation(term.config, term.cwd, ("refactor the checkout page", "terminal reply"),
                                      ("and keep the tests green", "terminal reply"))
            other = stored_conversation(term.config, roots / "blog", ("write a post", "terminal reply"))
            async with page_at(b, url, PHONE) as page:
                await page.click("#sessions-open")
                panel = page.locator("#sessions-panel")
                await expect(panel.locator(f"[data-session-id='{other}']")).to_be_visible(timeout=20_000)
                await page.fill("#sessions-q", "checkout")
                await expect(panel.locator(".session")).to_have_count(1)
                row = panel.locator(f"[data-session-id='{sid}']")
                await expect(row.locator(".title")).to_have_text("refactor the checkout page")
                await expect(row.locator(".meta").first).to_contain_text(str(term.cwd))
                await expect(row.locator(".meta").first).to_contain_text("4 messages")
                # nothing wider than the phone
                assert await page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
                await shot(page, "sessions-picker-phone")
                assert await axe_violations(page) == []
                await check_reached_by_tab(page, "the Sessions picker")
                # read again in the background (as a terminal event does): the directory list, unchanged, is left
                # as it is (rebuilt, an open <select> closes on a phone)
                options = "[...document.querySelectorAll('#sessions-dir option')]"
                assert await page.evaluate(f"{options}.map((o) => {{ o.dataset.kept = 'yes'; return o; }}).length") == 3
                await page.evaluate(RELOAD)
                assert await page.evaluate(f"{options}.filter((o) => o.dataset.kept === 'yes').length") == 3
                # one tap continues; while it is on its way a background read gives no second button to tap
                released = asyncio.Event()

                async def held(route: Route) -> None:
                    if route.request.method == "POST":
                        await released.wait()
                    await route.continue_()

                await page.route("**/api/threads", held)
                await row.locator("button").click()
                await expect(row.locator("button")).to_be_disabled()
                await page.evaluate(RELOAD)
                await expect(row.locator("button")).to_be_disabled()
                await expect(panel.locator("button:enabled", has_text="Continue")).to_have_count(0)
                released.set()
                await expect(page.locator("#thread-title")).to_have_text("refactor the checkout page",
                                                                         timeout=20_000)
                await expect(panel).to_be_hidden()
                await expect(page.locator(".msg.user")).to_have_text(
                    ["refactor the checkout page", "and keep the tests green"], timeout=20_000)
                await expect(page.locator(".msg.assistant")).to_have_count(2)
                handback = page.locator("#handback-cmd")
                await expect(handback).to_have_text(
                    f"cd {term.cwd} && CLAUDE_CONFIG_DIR={term.config} {claude_bin()} --resume {sid} "
                    f"{shlex.join(threads.HANDBACK_FLAGS)}")
                await expect(page.locator("#handback-copy")).to_be_visible()
                assert await page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
                await shot(page, "sessions-handback-phone")
                assert await axe_violations(page) == []
