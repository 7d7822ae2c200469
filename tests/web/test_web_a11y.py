"""Accessibility in a real Chromium against the real ingress, executor, PostgreSQL and claude CLI on the
scripted model: axe-core (vendored in tests/vendor, injected by the test, never served) finds no serious
or critical violation on any view at phone or desktop size, and a screenshot of each view at both sizes
lands in the test artifacts. Also: the keyboard alone answers a docked question, focus goes somewhere
sensible when the card leaves, and a new reply is announced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, expect

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests.harness import running_executor
from tests.pg import DB
from tests.web.test_web_client import DESKTOP, PHONE, browser, page_at, shot
from tests.served import ingress_server

pytestmark = pytest.mark.timeout(300)

AXE = (Path(__file__).parents[1] / "vendor" / "axe.min.js").read_text()
QUESTIONS = [{"question": "Which way should the refactor go?", "header": "Direction", "multiSelect": False,
              "options": [{"label": "Left", "description": "split the module", "preview": "## Plan\n\n- split it"},
                          {"label": "Right", "description": "keep it whole"}]}]


async def axe_violations(page: Page) -> list[dict[str, Any]]:
    # evaluated over CDP, so the page's CSP (no inline script) does not stop it
    if not await page.evaluate("typeof window.axe !== 'undefined'"):
        await page.evaluate(AXE)
    result = await page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    return [{"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"]][:5]}
            for v in result["violations"] if v["impact"] in ("serious", "critical")]


async def check_views(page: Page, views: list[tuple[str, str, str]], size: str) -> None:
    for name, hash_, ready in views:
        await page.evaluate(f"location.hash = '{hash_}'")
        await expect(page.locator(ready).first).to_be_visible(timeout=20_000)
        assert await axe_violations(page) == [], f"{name} at {size}"
        await shot(page, f"view-{name}-{size}")


async def test_every_view_passes_axe_at_both_sizes_and_a_question_is_answered_by_keyboard(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[
        Rule(role="orchestrator", replies=[
            {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": QUESTIONS}}},
            {"text": "Going **left**."}]),
        Rule(role="worker", replies=[{"text": "3 files"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, ingress_server(db.ingress_dsn) as url, browser() as b:
            worker = await h.dispatch("count the files here")
            await h.wait_final(worker)
            async with page_at(b, url, DESKTOP) as page:
                await page.fill("#composer-text", "refactor the parser")
                await page.click("#composer button")
                card = page.locator("#pinned-asks .ask")
                await expect(card).to_have_count(1, timeout=60_000)
                # the engine is live: a nameless button is caught
                await page.evaluate("document.body.insertAdjacentHTML('beforeend', '<button id=axe-probe></button>')")
                assert "button-name" in [v["id"] for v in await axe_violations(page)]
                await page.evaluate("document.getElementById('axe-probe').remove()")
                views = [("chat", "#chat", "#pinned-asks .ask"), ("tasks", "#tasks", "#task-list li"),
                         ("task", f"#task/{worker}", "#task-detail .events li"), ("asks", "#asks", "#ask-cards .ask"),
                         ("activity", "#activity", "#feed li"), ("context", "#context", "#context-body h3")]
                for size, viewport in (("1280", DESKTOP), ("390", PHONE)):
                    await page.set_viewport_size(viewport)
                    await check_views(page, views, size)
                # the keyboard alone: open the docked card, choose, submit
                await page.evaluate("location.hash = '#chat'")
                await expect(card).to_be_visible()
                await card.locator(".bar .toggle").focus()
                await page.keyboard.press("Enter")
                await expect(card.locator(".bar .toggle")).to_have_attribute("aria-expanded", "true")
                assert await axe_violations(page) == []  # opened, too
                await card.locator("input[type='radio']").first.focus()
                await page.keyboard.press("Space")
                await expect(card.locator("input[type='radio']").first).to_be_checked()
                await card.locator("button[type='submit']").focus()
                await page.keyboard.press("Enter")
                await expect(card).to_have_count(0)
                # the card left with the focus in it: the focus goes to the composer, not to nowhere
                await expect(page.locator("#composer-text")).to_be_focused()
                # the reply is announced
                await expect(page.locator("#announce")).to_contain_text("Reply: Going left.", timeout=60_000)
                await expect(page.locator(".msg.assistant")).to_have_count(1)
                assert await axe_violations(page) == []
