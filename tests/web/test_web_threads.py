"""Threads as a daily tool, in a real Chromium against the real ingress, executor and PostgreSQL: find a
thread by name, rename it (shown at once, refused names reverted with the server's reason), archive it,
and page a long thread's history back by seq."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
from playwright.async_api import Page, expect

from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from shared import journal
from shared.models import NewEvent
from tests import tables
from tests.harness import running_executor
from tests.pg import DB
from tests.web.test_web_client import DESKTOP, browser, page_at, shot
from tests.served import ingress_server
from tests.wait import until


async def _journal_has(admin_dsn: str, event_type: str, session_id: str) -> None:
    def has() -> bool:
        return tables.count_events(admin_dsn, event_type, session_id=session_id) > 0
    await until(has, f"{event_type} for {session_id} in the journal", 20)


async def _answer_prompt(page: Page, text: str) -> None:
    page.once("dialog", lambda d: asyncio.ensure_future(d.accept(text)))


async def test_threads_are_found_renamed_and_archived_and_a_long_history_pages_back_by_seq(
    db: DB, tmp_path: Path
) -> None:
    with ScriptedModelServer(Scenario(rules=[])) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, browser() as b, \
                httpx.AsyncClient(base_url=url) as http:
            made = (await http.post("/api/threads", json={"title": "Long"})).json()
            long_id = made["thread_id"]
            await _journal_has(db.admin_dsn, "thread.created", long_id)
            async with await psycopg.AsyncConnection.connect(db.executor_dsn) as conn:
                await journal.append_on(conn, [NewEvent("task.user_message", {"text": f"note {i}"},
                                                        session_id=uuid.UUID(long_id)) for i in range(150)])
                await conn.commit()
            # paging back by seq: strictly older, newest first within the page, returned oldest first
            newest = (await http.get(f"/api/threads/{long_id}/conversation", params={"limit": 5})).json()
            older = (await http.get(f"/api/threads/{long_id}/conversation",
                                    params={"limit": 5, "before_seq": newest["events"][0]["seq"]})).json()
            assert [e["payload"]["text"] for e in older["events"]] == [f"note {i}" for i in range(140, 145)]
            assert older["more"] is True
            assert (await http.get(f"/api/threads/{long_id}/conversation",
                                   params={"before_seq": "x"})).status_code == 400
            async with page_at(b, url, DESKTOP) as page:
                # the newest page, then "load older" reads the rest back, in order, without duplicates
                await expect(page.locator(".msg.user")).to_have_count(100)
                await page.click("#load-older")
                await expect(page.locator(".msg.user")).to_have_count(150)
                await expect(page.locator("#load-older")).to_be_hidden()
                texts = await page.locator(".msg.user").all_inner_texts()
                assert texts == [f"note {i}" for i in range(150)]
                for title in ("Alpha", "Beta"):
                    await _answer_prompt(page, title)
                    await page.click("#new-thread")
                    await expect(page.locator("#thread-title")).to_have_text(title, timeout=20_000)
                # find by part of a name
                await page.fill("#thread-search", "alp")
                await page.press("#thread-search", "Enter")
                await expect(page.locator("#thread-title")).to_have_text("Alpha")
                alpha = await page.locator("#thread-picker").input_value()
                # rename: at once, then confirmed by the thread's record
                await _answer_prompt(page, "Gamma")
                await page.click("#thread-rename")
                await expect(page.locator("#thread-title")).to_have_text("Gamma", timeout=1_000)
                await _journal_has(db.admin_dsn, "thread.renamed", alpha)
                await page.reload()
                await expect(page.locator("#thread-title")).to_have_text("Gamma", timeout=20_000)
                # a name the server refuses: reverted, with its reason
                await _answer_prompt(page, "x" * 201)
                await page.click("#thread-rename")
                await expect(page.locator("#thread-status")).to_contain_text("Not renamed")
                await expect(page.locator("#thread-title")).to_have_text("Gamma")
                await shot(page, "threads-1280")
                # archive: gone from the list, the page moves to another thread
                page.once("dialog", lambda d: asyncio.ensure_future(d.accept()))
                await page.click("#thread-archive")
                await expect(page.locator(f"#thread-picker option[value='{alpha}']")).to_have_count(0)
                await expect(page.locator("#thread-title")).not_to_have_text("Gamma")
                await _journal_has(db.admin_dsn, "thread.archived", alpha)
                await page.reload()
                await expect(page.locator("body[data-ready='1']")).to_have_count(1)
                await expect(page.locator(f"#thread-picker option[value='{alpha}']")).to_have_count(0)


async def test_older_threads_are_a_page_away_in_the_picker_and_the_thread_open_stays_open(
    db: DB, tmp_path: Path
) -> None:
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:  # 205 threads, one a minute: oldest is 'old 0'
        start = datetime(2026, 1, 1, tzinfo=UTC)
        ids = [tables.insert_thread(conn, title=f"old {i}", created_at=start + timedelta(minutes=i))
               for i in range(205)]
    with ScriptedModelServer(Scenario(rules=[])) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, browser() as b:
            async with page_at(b, url, DESKTOP) as page:
                picker = page.locator("#thread-picker")
                await expect(picker.locator("option", has_text="Older threads…")).to_have_count(1)
                await expect(picker.locator("option", has_text="old 0")).to_have_count(0)
                await picker.select_option(label="Older threads…")
                await expect(picker.locator("option", has_text="old 0")).to_have_count(1)
                await expect(picker.locator("option", has_text="Older threads…")).to_have_count(0)
                await picker.select_option(label="old 0")
                await expect(page.locator("#thread-title")).to_have_text("old 0")
                # a reload keeps the thread open, though it is older than the first page
                await page.reload()
                await expect(page.locator("#thread-title")).to_have_text("old 0")
                assert await picker.input_value() == str(ids[0])
