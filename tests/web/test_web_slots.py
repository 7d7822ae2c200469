"""A turn that waits for a slot says so where the user looks, in a real Chromium against the real ingress: Chat
says "waiting for a free slot — N of N busy" with the busy tasks linked (a task parked on its user is not one of
them), and Tasks shows the wait as a status of its own."""

from __future__ import annotations

import psycopg
import pytest
from playwright.async_api import ViewportSize, expect

from shared.threads import DEFAULT_THREAD_ID
from tests import tables
from tests.pg import DB
from tests.served import ingress_server
from tests.web.seen import seen
from tests.web.test_web_client import DESKTOP, PHONE, browser, page_at

pytestmark = pytest.mark.timeout(180)


def _seed(admin_dsn: str) -> tuple[list[str], str]:
    """A live executor of two slots, both busy, a third task parked on its user, and the Default thread's turn
    waiting for a slot: (the busy tasks' ids, the parked one's)."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        tables.insert_executor(conn, "ex-1", capacity=2)
        tables.ensure_thread(conn, DEFAULT_THREAD_ID, lifecycle="running", title="Default", mode="interactive")
        busy = [str(tables.insert_task(conn, status="running", activity="running", brief=f"busy {i}",
                                       executor_name="ex-1")) for i in range(2)]
        parked = str(tables.insert_task(conn, status="running", activity="awaiting_user", brief="parked",
                                        executor_name="ex-1"))
        tables.insert_task(conn, role="orchestrator", status="pending", activity="waiting_for_slot", brief="hello",
                           session_id=DEFAULT_THREAD_ID, chat=True)
    return busy, parked


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390x844", "1280x800"])
async def test_a_turn_waiting_for_a_slot_says_so_in_chat_and_in_tasks(db: DB, viewport: ViewportSize) -> None:
    busy, parked = _seed(db.admin_dsn)
    async with ingress_server(db.ingress_dsn) as url, browser() as b, page_at(b, url, viewport) as page:
        status = page.locator("#turn-status")
        await seen(status, "Waiting for a free slot — 2 of 2 busy", scroll=True, timeout=20)
        links = status.locator("a")
        assert sorted(await links.evaluate_all("(as) => as.map((a) => a.getAttribute('href'))")) == sorted(
            f"#task/{t}" for t in busy)  # the parked task holds no slot: not listed
        assert parked[:8] not in (await status.text_content() or "")
        await page.evaluate("location.hash = '#tasks'")
        chip = page.locator("#task-list .chip.waiting_for_slot")
        await expect(chip).to_have_count(1)
        await seen(chip, "waiting for slot", scroll=True)
