"""The page says so, standing, while any live executor runs its workers unsandboxed (PETAL_SANDBOX=off): read
from the executors' own rows through /api/info (real PostgreSQL, the real ingress, Debian's chromium)."""

from __future__ import annotations

import psycopg
from playwright.async_api import expect

from tests.pg import DB
from tests.web.test_web_client import browser, page_at
from tests.served import ingress_server
from tests.web.seen import seen

_LIVE = ("INSERT INTO executors (name, labels, capacity, lease_s, lease_until, version, sandbox) "
         "VALUES (%s, '{}', 4, 15, now() + interval '1 hour', 'test', %s)")


async def test_the_page_warns_while_a_live_executor_runs_workers_unsandboxed(db: DB) -> None:
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        conn.execute(_LIVE, ["sandboxed", "bwrap"])
        async with ingress_server(db.ingress_dsn) as url, browser() as b:
            async with page_at(b, url) as page:
                await expect(page.locator("#unsandboxed")).to_be_hidden()
            conn.execute(_LIVE, ["open-one", "off"])
            async with page_at(b, url) as page:
                await seen(page.locator("#unsandboxed"), "Workers are not isolated")
            # gone once that executor has stopped
            conn.execute("UPDATE executors SET stopped_at = now() WHERE name = 'open-one'")
            async with page_at(b, url) as page:
                await expect(page.locator("#unsandboxed")).to_be_hidden()
