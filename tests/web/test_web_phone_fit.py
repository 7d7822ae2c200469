"""The page at phone size (390x844 and 360x640) against the real ingress and PostgreSQL, checked as seen
(inside the viewport, covered by nothing, the tab bar included): an opened docked question's options, Submit
and Dismiss are all reachable above the tab bar; the Routines form brings its refusal and its Edit form into
view and names the wrong field; a rejected upload is one compact line with its reason, Retry only where a
retry can succeed; the focused thread's name is readable in the picker on the bar that stays in view; every
placeholder fits its field; the hand-back is one line that expands."""

from __future__ import annotations

import psycopg
import pytest
from playwright.async_api import FilePayload, Page, ViewportSize, expect

from shared.threads import DEFAULT_THREAD_ID
from tests import tables
from tests.pg import DB
from tests.served import ingress_server
from tests.web.seen import seen
from tests.web.test_web_client import PHONE, browser, page_at, shot
from tests.web.test_web_phone import _insert_ask, _question

pytestmark = pytest.mark.timeout(300)

SMALL_PHONE: ViewportSize = {"width": 360, "height": 640}
SIZES = pytest.mark.parametrize("viewport", [PHONE, SMALL_PHONE], ids=["390x844", "360x640"])
LONG_NAME = "Quarterly plan for the shop site"
RESUME = ("cd /home/user/projects/shop && claude --resume 3a75e21f-5508-4f6e-8e92-3760c6a5c3b2 "
          "--setting-sources user --strict-mcp-config")

# every visible field's placeholder against the room its box gives text (its width less padding and border)
PLACEHOLDERS_CUT = """() => {
  const ctx = document.createElement('canvas').getContext('2d');
  const cut = [];
  for (const el of document.querySelectorAll('input[placeholder], textarea[placeholder]')) {
    if (!el.checkVisibility() || el.tagName === 'TEXTAREA') continue;  // a textarea wraps its placeholder
    const s = getComputedStyle(el);
    ctx.font = `${s.fontStyle} ${s.fontWeight} ${s.fontSize} ${s.fontFamily}`;
    const room = el.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
    const need = ctx.measureText(el.placeholder).width;
    if (need > room) cut.push(`${el.id || el.name || el.getAttribute('aria-label')}: "${el.placeholder}" needs ${Math.ceil(need)} px of ${Math.floor(room)}`);
  }
  return cut;
}"""


def _seed(admin_dsn: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO sessions (id, role, lifecycle, title, mode, resume_command) VALUES "
                     "(%s, 'orchestrator', 'running', %s, 'interactive', %s) ON CONFLICT (id) DO UPDATE SET "
                     "title = excluded.title, resume_command = excluded.resume_command",
                     [DEFAULT_THREAD_ID, LONG_NAME, RESUME])
        tables.insert(conn, "routines", name="Nightly", prompt="check", cron="0 9 * * *", tz="UTC")


async def _cut_placeholders(page: Page) -> list[str]:
    return await page.evaluate(PLACEHOLDERS_CUT)  # type: ignore[no-any-return]


@SIZES
async def test_an_opened_docked_question_has_every_option_and_action_reachable_above_the_tab_bar(
    db: DB, viewport: ViewportSize
) -> None:
    size = f"{viewport['width']}x{viewport['height']}"
    async with ingress_server(db.ingress_dsn) as url, browser() as b:
        for n in (1, 4):
            ask = _insert_ask(db.admin_dsn, [_question(i) for i in range(1, n + 1)])
            async with page_at(b, url, viewport) as page:
                card = page.locator(f"#pinned-asks .ask[data-ask-id='{ask}']")
                await card.locator(".bar .toggle").click()
                # every option, scrolled to as a user would, is seen: not under the tab bar, not off screen
                options = card.locator(".option label")
                await expect(options).to_have_count(4 * n)
                for i in range(4 * n):
                    await seen(options.nth(i), scroll=True)
                for action in ("button[type='submit']", ".actions button.dismiss"):
                    await seen(card.locator(action), scroll=True)
                # and without scrolling the page: the actions are where the card's scrolling leaves them
                await page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
                await seen(card.locator("button[type='submit']"))
                await seen(card.locator(".actions button.dismiss"))
                assert await _cut_placeholders(page) == [], f"the opened card at {size}"
                await shot(page, f"fit-ask-{n}q-{size}")


@SIZES
async def test_the_phone_layout_fits(db: DB, viewport: ViewportSize) -> None:
    _seed(db.admin_dsn)
    size = f"{viewport['width']}x{viewport['height']}"
    async with ingress_server(db.ingress_dsn, attachment_max_bytes=4096) as url, browser() as b, \
            page_at(b, url, viewport) as page:
        # the thread's whole name in the picker, on the header that stays in view
        picker = page.locator("#thread-picker")
        await seen(picker, LONG_NAME)
        fits = await picker.evaluate("""(el) => {
            const ctx = document.createElement('canvas').getContext('2d'); const s = getComputedStyle(el);
            ctx.font = `${s.fontWeight} ${s.fontSize} ${s.fontFamily}`;
            return ctx.measureText(el.selectedOptions[0].text).width + 24 <= el.clientWidth; }""")
        assert fits, f"{LONG_NAME!r} is cut in the picker at {size}"
        await page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
        await seen(picker)  # still in view at the conversation's end
        # the hand-back: one line, then the whole command
        handback = page.locator("#handback")
        await seen(handback.locator("#handback-cmd"), scroll=True)
        line = await page.locator("#handback-copy").bounding_box()
        box = await handback.bounding_box()
        assert box and line and box["height"] <= line["height"] + 8, f"the hand-back takes {box} at {size}"
        await page.locator("#handback-more").click()
        await expect(page.locator("#handback-more")).to_have_attribute("aria-expanded", "true")
        await seen(page.locator("#handback-cmd"), "--strict-mcp-config", scroll=True)
        assert await page.locator("#handback-cmd").evaluate("(el) => el.scrollWidth <= el.clientWidth + 1")
        await shot(page, f"fit-handback-{size}")
        # placeholders fit their fields, in every view that has them
        assert await _cut_placeholders(page) == [], f"chat at {size}"
        await page.click("#sessions-open")
        assert await _cut_placeholders(page) == [], f"sessions at {size}"
        await page.click("#sessions-close")
        for view in ("activity", "context"):
            await page.evaluate(f"location.hash = '#{view}'")
            await page.wait_for_timeout(300)
            assert await _cut_placeholders(page) == [], f"{view} at {size}"
        # rejected uploads: one line each, with the reason; no Retry where a retry cannot succeed
        await page.evaluate("location.hash = '#chat'")
        files: list[FilePayload] = [
            {"name": "big-report-from-the-quarterly-review.pdf", "mimeType": "application/pdf", "buffer": b"%PDF" * 2000},
            {"name": "tool.bin", "mimeType": "application/octet-stream", "buffer": b"\x7fELF\x02\x01" + b"\0" * 200}]
        await page.locator("#attach-files").set_input_files(files)
        failed = page.locator(".composer-files .draft.failed")
        await expect(failed).to_have_count(2, timeout=20_000)
        for i, why in ((0, "larger than 4 KiB"), (1, "files of type")):
            row = failed.nth(i)
            await seen(row.locator(".line"), why, scroll=True)
            height = (await row.bounding_box() or {"height": 999})["height"]
            assert height <= 48, f"a rejected upload takes {height} px at {size}"
            await expect(row.get_by_role("button", name="Retry")).to_have_count(0)
            await seen(row.get_by_role("button", name="Remove"), scroll=True)
        await shot(page, f"fit-uploads-{size}")
        # Routines: a refusal names its field, marks it, and is in view with it; Edit brings its form into view
        await page.evaluate("location.hash = '#routines'")
        form = page.locator("#routine-form")
        await form.locator("[name=name]").fill("Sweep")
        await form.locator("[name=prompt]").fill("sweep the logs")
        await form.locator("[name=cron]").fill("0 9 * * *")
        await form.locator("[name=tz]").fill("Mars/Olympus")
        await page.evaluate("window.scrollTo(0, 0)")
        await form.locator("button[type=submit]").click()
        await seen(page.locator("#routine-error"), "Time zone: unknown time zone")
        tz = form.locator("[name=tz]")
        await expect(tz).to_have_attribute("aria-invalid", "true")
        await expect(tz).to_be_focused()
        await seen(tz)
        await shot(page, f"fit-routine-error-{size}")
        await page.evaluate("window.scrollTo(0, 0)")
        await page.locator(".routine").first.get_by_role("button", name="Edit").click()
        await seen(page.locator("#routine-form h3"), "Edit Nightly")
        await expect(page.locator("#routine-form [name=name]")).to_be_focused()
        await shot(page, f"fit-routine-edit-{size}")

