"""Accessibility in a real Chromium against the real ingress, executor, PostgreSQL and claude CLI on the
scripted model: axe-core (vendored in tests/vendor, injected by the test, never served) finds no serious
or critical violation on any view at phone or desktop size, and a screenshot of each view at both sizes
lands in the test artifacts. Every control of every view is reached by Tab (pressed, not focused from
script). Also: the keyboard alone answers a docked question, focus goes somewhere sensible when the card
leaves, and a new reply is announced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Locator, Page, expect

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


# A control as a person names it (the same words CONTROLS gives each key): a view that re-renders while the walk
# goes (the context view follows the store) replaces the marked elements with equal, unmarked ones.
LABEL = """(el) => `${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''} `
  + `"${(el.getAttribute('aria-label') || el.innerText || el.value || '').trim().slice(0, 40)}"`"""
# Every control the user can see, each marked with a key (data-kb); a radio group is one control (Tab
# reaches the group, the arrow keys move within it). A control is a control whatever its tabindex: one
# taken out of the tab order must fail the walk, not leave the list.
CONTROLS = """() => {
  const sel = 'a[href], button, input:not([type=hidden]), select, textarea, summary, [contenteditable], '
            + '[tabindex]:not([tabindex="-1"])';
  const seen = {};
  for (const [i, el] of [...document.querySelectorAll(sel)].entries()) {
    if (el.disabled || el.closest('[inert]') || !el.checkVisibility({visibilityProperty: true})) continue;
    el.dataset.kb = el.type === 'radio' ? `radio:${el.name}` : String(i);
    seen[el.dataset.kb] = (LABEL)(el);
  }
  return seen;
}""".replace("(LABEL)", f"({LABEL})")
FOCUSED = f"""(() => {{ const a = document.activeElement; if (!a || a === document.body) return null;
  return a.dataset.kb || a.type === 'radio' && `radio:${{a.name}}` || ({LABEL})(a); }})()"""


async def tab_walk(page: Page) -> list[str | None]:
    """From nowhere, Tab through the page until the focus comes round again (the page's every stop, in order)."""
    controls = await page.evaluate(CONTROLS)
    await page.evaluate("document.activeElement && document.activeElement.blur()")
    walk: list[str | None] = []
    first: str | None = None
    for _ in range(2 * len(controls) + 10):
        await page.keyboard.press("Tab")
        walk.append(await page.evaluate(FOCUSED))
        # past the last control the focus leaves the page (None) before it comes round: where the walk
        # starts depends on where the browser's navigation point was, so the round ends at the first control
        # seen again, not at the first "nowhere"
        if walk[-1] is None:
            continue
        if first is None:
            first = walk[-1]
        elif walk[-1] == first:
            break
    return walk


async def check_reached_by_tab(page: Page, where: str) -> None:
    controls = await page.evaluate(CONTROLS)
    walk = await tab_walk(page)
    # reached: the marked element itself, or (re-rendered meanwhile) one with its name
    missed = {k: label for k, label in controls.items() if k not in walk and label not in walk}
    assert controls and missed == {}, f"{where}: not reached by Tab: {missed} (the walk: {walk})"


async def tab_to(page: Page, target: Locator, limit: int = 80) -> None:
    """Press Tab until `target` has the focus (as a keyboard user gets there)."""
    for _ in range(limit):
        await page.keyboard.press("Tab")
        if await target.evaluate("(el) => el === document.activeElement"):
            return
    raise AssertionError(f"Tab never reached {target}")


async def check_views(page: Page, views: list[tuple[str, str, str]], size: str) -> None:
    for name, hash_, ready in views:
        await page.evaluate(f"location.hash = '{hash_}'")
        await expect(page.locator(ready).first).to_be_visible(timeout=20_000)
        assert await axe_violations(page) == [], f"{name} at {size}"
        await check_reached_by_tab(page, f"{name} at {size}")
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
                # the keyboard alone: Tab to the docked card, open it, every control of it reached by Tab,
                # choose, submit
                await page.evaluate("location.hash = '#chat'")
                await expect(card).to_be_visible()
                await page.evaluate("document.activeElement && document.activeElement.blur()")
                await tab_to(page, card.locator(".bar .toggle"))
                await page.keyboard.press("Enter")
                await expect(card.locator(".bar .toggle")).to_have_attribute("aria-expanded", "true")
                assert await axe_violations(page) == []  # opened, too
                await check_reached_by_tab(page, "chat with the card open")
                await page.evaluate("document.activeElement && document.activeElement.blur()")
                await tab_to(page, card.locator("input[type='radio']").first)
                await page.keyboard.press("Space")
                await expect(card.locator("input[type='radio']").first).to_be_checked()
                await tab_to(page, card.locator("button[type='submit']"))
                await page.keyboard.press("Enter")
                await expect(card).to_have_count(0)
                # the card left with the focus in it: the focus goes to the composer, not to nowhere
                await expect(page.locator("#composer-text")).to_be_focused()
                # the reply is announced
                await expect(page.locator("#announce")).to_contain_text("Reply: Going left.", timeout=60_000)
                await expect(page.locator(".msg.assistant")).to_have_count(1)
                assert await axe_violations(page) == []
