"""The page says so, standing, while any live executor runs its workers unsandboxed (PETAL_SANDBOX=off): read
from the executors' own rows through /api/info (real PostgreSQL, the real ingress, Debian's chromium)."""

from __future__ import annotations

import psycopg
from playwright.async_api import expect

from tests import tables
from tests.pg import DB
from tests.web.test_web_client import browser, page_at
from tests.served import ingress_server
from tests.web.seen import seen



async def test_the_page_warns_while_a_live_executor_runs_workers_unsandboxed(db: DB) -> None:
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        tables.insert_executor(conn, "sandboxed", version="test", sandbox="bwrap")
        async with ingress_server(db.ingress_dsn) as url, browser() as b:
            async with page_at(b, url) as page:
                await expect(page.locator("#unsandboxed")).to_be_hidden()
            tables.insert_executor(conn, "open-one", version="test", sandbox="off")
            async with page_at(b, url) as page:
                await seen(page.locator("#unsandboxed"), "Workers are not isolated")
            # gone once that executor has stopped
            tables.update_all(conn, "executors", {"name": "open-one"}, stopped_at=tables.NOW)
            async with page_at(b, url) as page:
                await expect(page.locator("#unsandboxed")).to_be_hidden()
