"""The Routines view in a real Chromium against the real ingress, executor and PostgreSQL: a bad cron
expression is refused with the server's reason, a routine is created (its fire token shown once), listed
with its next fire times, run now, and its history shows the run; it passes axe."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import expect

from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.harness import running_executor
from tests.pg import DB
from tests.served import ingress_server
from tests.web.test_web_a11y import axe_violations
from tests.web.test_web_client import DESKTOP, PHONE, browser, page_at, shot

pytestmark = pytest.mark.web


async def test_a_routine_is_made_in_the_page_refused_first_for_its_cron_then_run_now_and_its_run_listed(
    db: DB, tmp_path: Path
) -> None:
    with ScriptedModelServer(Scenario.single({"text": "swept"})) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, browser() as b:
            async with page_at(b, url, DESKTOP) as page:
                await page.click("a[data-tab='routines']")
                form = page.locator("#routine-form")
                await form.locator("[name=name]").fill("Sweep")
                await form.locator("[name=prompt]").fill("sweep the logs")
                await form.locator("[name=cron]").fill("61 * * * *")
                await form.locator("[name=tz]").fill("Europe/Berlin")
                await form.locator("button[type=submit]").click()
                await expect(page.locator("#routine-error")).to_contain_text("invalid cron expression")
                await form.locator("[name=cron]").fill("0 9 * * 1-5")
                await form.locator("button[type=submit]").click()
                await expect(page.locator(".routine-secrets")).to_contain_text("Fire token")
                routine = page.locator(".routine").first
                await expect(routine).to_contain_text("Sweep")
                await expect(routine.locator(".next")).to_contain_text(",")  # three next fire times
                # History first: a run re-renders the row with its "Last run" line, and a click racing that
                # re-render lands on whatever the shifted row puts under it
                await routine.get_by_role("button", name="History").click()
                await expect(routine.locator(".routine-runs")).to_contain_text("No runs yet.")
                await routine.get_by_role("button", name="Run now").click()
                await expect(routine.locator(".routine-runs .chip.succeeded")).to_have_count(1, timeout=60_000)
                # the run's thread is listed apart in the thread picker, not among the user's own threads
                await page.reload()
                picker = page.locator("#thread-picker")
                await expect(picker.locator("optgroup[label='Routine runs'] option")).to_have_count(1)
                await expect(picker.locator("optgroup option")).to_contain_text("Sweep · ")
                assert "Sweep · " not in " ".join(await picker.locator(":scope > option").all_inner_texts())
                assert await picker.input_value() != await picker.locator("optgroup option").get_attribute("value")
                await page.click("a[data-tab='routines']")
                assert await axe_violations(page) == []
                await shot(page, "view-routines-1280")
                await page.set_viewport_size(PHONE)
                assert await axe_violations(page) == []
                await shot(page, "view-routines-390")
