"""The page's layout in a real Chromium against the real ingress and PostgreSQL: a docked question keeps
its actions on screen (folded to a bar, the composer too), at phone and desktop sizes."""

from __future__ import annotations

import uuid

import pytest
from playwright.async_api import Page, ViewportSize, expect

from shared.threads import DEFAULT_THREAD_ID
from tests import tables
from tests.pg import DB
from tests.web.test_web_client import DESKTOP, PHONE, browser, page_at, shot
from tests.served import ingress_server

pytestmark = pytest.mark.timeout(240)


def _question(i: int) -> dict[str, object]:
    return {"question": f"Question {i}: which of these approaches should the worker take for part {i}?",
            "header": f"Part {i}", "multiSelect": i % 2 == 0,
            "options": [{"label": f"Option {k}", "description": "a longer description of what this option means " * 2}
                        for k in range(4)]}


def _ask(admin_dsn: str, n: int) -> uuid.UUID:
    return tables.only_ask(admin_dsn, [_question(i) for i in range(1, n + 1)], source_session_uuid=DEFAULT_THREAD_ID)


# the element itself is what the user sees at its centre: inside the viewport and covered by nothing
UNCOVERED = """(el) => {
  const r = el.getBoundingClientRect();
  const x = r.left + r.width / 2, y = r.top + r.height / 2;
  const top = document.elementFromPoint(x, y);
  const inside = r.top >= 0 && r.bottom <= innerHeight && r.left >= 0 && r.right <= innerWidth;
  return inside && (top === el || el.contains(top));
}"""


async def _reachable(page: Page, selector: str) -> None:
    el = page.locator(selector)
    await expect(el).to_be_visible()
    box = await el.bounding_box()
    assert await el.evaluate(UNCOVERED), f"{selector} is off screen or covered: {box}"


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390x844", "1280x800"])
async def test_a_docked_question_keeps_its_buttons_and_the_composer_on_screen(db: DB, viewport: ViewportSize) -> None:
    async with ingress_server(db.ingress_dsn) as url, browser() as b:
        for n in (1, 2, 4):
            ask = _ask(db.admin_dsn, n)
            async with page_at(b, url, viewport) as page:
                card = page.locator(f"#pinned-asks .ask[data-ask-id='{ask}']")
                await expect(card.locator("fieldset")).to_have_count(n)
                # docked as a bar: the bar's Answer and the composer on screen
                for selector in (f"#pinned-asks .ask[data-ask-id='{ask}'] .bar .toggle", "#composer-text",
                                 "#composer button"):
                    await _reachable(page, selector)
                # opened in place of the composer: its actions on screen, whatever its length
                await card.locator(".bar .toggle").click()
                for selector in (f"#pinned-asks .ask[data-ask-id='{ask}'] button[type='submit']",
                                 f"#pinned-asks .ask[data-ask-id='{ask}'] .actions button.dismiss",
                                 f"#pinned-asks .ask[data-ask-id='{ask}'] .bar .toggle"):
                    await _reachable(page, selector)
                await shot(page, f"ask-docked-{n}q-{viewport['width']}")
