"""Files from the page in a real Chromium against the real ingress and PostgreSQL (and, for the turn, the
executor with the real CLI on the scripted model): attach from the file input at phone size, see the
thumbnail and the upload's end, send, see the image in Chat as the model got it; an interrupted upload is
shown as such and holds the message back until it is retried; an image pasted into the composer on a desktop
goes with its message (a dropped one is added the same way), and a reload shows the waiting message with its
image."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
from pathlib import Path

import psycopg
import pytest
from PIL import Image
from playwright.async_api import FilePayload, Page, Route, expect

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests.harness import running_executor
from tests.pg import DB
from tests.served import ingress_server
from tests.web.test_web_client import DESKTOP, PHONE, browser, page_at, shot

pytestmark = pytest.mark.timeout(240)


def _png(colour: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), colour).save(out, format="PNG")
    return out.getvalue()


def _queued(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT text, cardinality(attachment_ids) FROM chat_queue ORDER BY created_at")]


async def _loaded(page: Page, selector: str) -> None:
    """The image under `selector` was served and decoded (not a broken image)."""
    img = page.locator(selector).first
    await expect(img).to_be_visible(timeout=60_000)
    await page.wait_for_function("(el) => el.complete && el.naturalWidth > 0", arg=await img.element_handle())


async def test_a_photo_attached_at_phone_size_uploads_shows_and_reaches_the_model_and_a_failed_upload_holds_the_message(
    db: DB, tmp_path: Path
) -> None:
    photo = _png((10, 120, 200))
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "I see a blue screen."}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, browser() as b:
            async with page_at(b, url, PHONE) as page:
                # the network drops the upload: the file says so and the message is not sent without it
                async def drop(route: Route) -> None:
                    await route.abort("connectionreset")

                await page.route("**/api/attachments", drop)
                payload: FilePayload = {"name": "screen.png", "mimeType": "image/png", "buffer": photo}
                await page.set_input_files("#attach-files", files=[payload])
                failed = page.locator(".composer-files .draft.failed")
                await expect(failed).to_contain_text("screen.png: the upload was interrupted")
                await page.fill("#composer-text", "what is wrong here?")
                await page.click("#composer button[type=submit]")
                await expect(page.locator("#composer-error")).to_contain_text("screen.png did not upload")
                assert _queued(db.admin_dsn) == []
                await shot(page, "attach-failed-390")
                # back online: Retry uploads it, the thumbnail shows, and the message goes with the file
                await page.unroute("**/api/attachments", drop)
                await failed.get_by_role("button", name="Retry").click()
                await expect(page.locator(".composer-files .draft.stored img")).to_be_visible(timeout=30_000)
                await expect(page.locator("#composer-error")).to_be_empty()  # nothing holds the message now
                await shot(page, "attach-thumbnail-390")
                await page.click("#composer button[type=submit]")
                await expect(page.locator(".composer-files")).to_be_hidden()
                await expect(page.locator(".msg.assistant")).to_contain_text("I see a blue screen.", timeout=60_000)
                await _loaded(page, ".msg.user:not(.pending) .sent-files img")
                width = await page.evaluate("document.documentElement.scrollWidth")
                await shot(page, "attach-sent-390")
    assert width <= 390
    assert _queued(db.admin_dsn) == [("what is wrong here?", 1)]
    images = [blk for r in model.requests if r.role == "orchestrator" for blk in r.user_blocks
              if blk.get("type") == "image"]
    assert images, "the model got no image"
    with psycopg.connect(db.admin_dsn) as conn:
        stored = conn.execute("SELECT sha256 FROM attachments").fetchall()
    assert [hashlib.sha256(base64.b64decode(images[0]["source"]["data"])).digest()] == [bytes(s[0]) for s in stored]


PASTE = """async (b64) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], "image.png", { type: "image/png" }));
  const box = document.querySelector("#composer-text");
  box.focus();
  box.dispatchEvent(new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true }));
}"""


DROP = """async (b64) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], "dropped.png", { type: "image/png" }));
  const zone = document.querySelector("#view-chat");
  for (const type of ["dragover", "drop"]) {
    zone.dispatchEvent(new DragEvent(type, { dataTransfer: data, bubbles: true, cancelable: true }));
  }
}"""


async def test_an_image_pasted_on_a_desktop_goes_with_its_message_and_a_reload_shows_it_waiting(db: DB) -> None:
    async with ingress_server(db.ingress_dsn) as url, browser() as b:  # no executor: the message waits
        async with page_at(b, url, DESKTOP) as page:
            await page.evaluate(PASTE, base64.b64encode(_png((200, 30, 30))).decode())
            await expect(page.locator(".composer-files .draft.stored img")).to_be_visible(timeout=30_000)
            assert await page.locator("#composer-text").input_value() == ""  # the file, not its name as text
            await page.locator(".composer-files .remove").click()  # removed: it does not go
            await expect(page.locator(".composer-files .draft")).to_have_count(0)
            await page.evaluate(DROP, base64.b64encode(_png((0, 0, 200))).decode())  # a drop on Chat adds it too
            # an upload re-encodes the image: on busy cores that outlasts the default 5 s
            await expect(page.locator(".composer-files .draft.stored img")).to_have_attribute("alt", "dropped.png",
                                                                                              timeout=30_000)
            await page.locator(".composer-files .remove").click()
            await expect(page.locator(".composer-files .draft")).to_have_count(0)
            # a slow network: the upload shows its progress, and Send waits for it
            async def slow(route: Route) -> None:
                await asyncio.sleep(2)  # not a wait: a slow network, which is what is tested
                await route.continue_()

            await page.route("**/api/attachments", slow)
            await page.evaluate(PASTE, base64.b64encode(_png((30, 200, 30))).decode())
            await expect(page.locator(".composer-files .draft.uploading progress")).to_be_visible()
            await page.fill("#composer-text", "this red banner")
            await page.press("#composer-text", "Control+Enter")
            await expect(page.locator("#composer-error")).to_contain_text("a file is still uploading")
            await expect(page.locator(".composer-files .draft.stored")).to_have_count(1, timeout=30_000)
            await expect(page.locator("#composer-error")).to_be_empty()
            assert _queued(db.admin_dsn) == []
            await page.press("#composer-text", "Control+Enter")
            await expect(page.locator(".msg.user.pending")).to_have_count(1)
            await _loaded(page, ".msg.user.pending .sent-files img")
        async with page_at(b, url, DESKTOP) as page:  # a fresh load reads the waiting message from the store
            await _loaded(page, ".msg.user.pending .sent-files img")
            await shot(page, "attach-pending-1280")
    assert _queued(db.admin_dsn) == [("this red banner", 1)]
    with psycopg.connect(db.admin_dsn) as conn:
        sent = conn.execute("SELECT count(*) FILTER (WHERE chat_message_id IS NOT NULL), count(*) FROM attachments").fetchone()
    assert sent == (1, 3)  # the removed uploads stay unsent (the purge takes them later)
