"""Review from the phone (390×844): tap a line of a worker's diff to comment, tap two lines for a range, remove a
comment, send the review; a follow-up worker continues on the reviewed commit, and the thread's chat keeps the
review. Real Chromium, the real CLI in its sandbox, real git."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
from playwright.async_api import expect

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests import tables
from tests.e2e.test_projects import _bash, _repo, _request
from tests.e2e.test_reviews import _recorded
from tests.harness import running_executor
from tests.pg import DB
from tests.served import ingress_server
from tests.wait import until
from tests.web.test_web_client import PHONE, browser, no_script_ran, page_at, shot

pytestmark = pytest.mark.timeout(240)


async def test_a_diff_is_reviewed_line_by_line_at_phone_size_and_sent_back_to_a_follow_up(
    db: DB, tmp_path: Path
) -> None:
    roots = tmp_path / "roots"
    repo = _repo(roots / "repo", {"app.py": "x = 1\n"})
    scenario = Scenario(rules=[
        Rule(role="worker", match="Revise the work on branch", replies=[{"text": "revised"}]),
        Rule(role="worker", match="set x", replies=[_bash("printf 'x = 2\\ny = 3\\nz = 4\\n' > app.py"),
                                                    {"text": "x is 2"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, project_roots=(roots,)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http, browser() as b:
            made = await _request(http, "/api/projects", {"slug": "demo", "workdir": str(repo)})
            thread = (await http.post("/api/threads", json={"title": "review"})).json()["thread_id"]
            await until(lambda: tables.count(db.admin_dsn, "sessions", id=thread), "the thread", 30)
            turn = tables.insert_task(db.admin_dsn, role="orchestrator", brief="hi", status="success",
                                      session_id=thread)
            reviewed = await h.dispatch("set x", project_id=uuid.UUID(made["result"]["project_id"]),
                                        parent_task_id=turn)
            await _recorded(h, reviewed)
            async with page_at(b, url, PHONE) as page:
                await page.goto(f"{url}/#task/{reviewed}")
                line = page.locator("#task-detail .diff .line[data-file='app.py']")
                await expect(line.first).to_be_visible(timeout=20_000)
                # one line, then a range of two (a second tap in the same file widens it), then one removed
                await line.and_(page.locator("[data-line='2']")).first.click()
                await page.get_by_label("Comment on app.py:2").fill("y should be 4")
                await page.get_by_role("button", name="Add comment").click()
                await line.and_(page.locator("[data-line='1']")).first.click()
                await line.and_(page.locator("[data-line='3']")).first.click()
                await page.get_by_label("Comment on app.py:1-3").fill("keep these in order")
                await page.get_by_role("button", name="Add comment").click()
                await line.and_(page.locator("[data-line='3']")).first.click()
                await page.get_by_label("Comment on app.py:3").fill("a typo, never mind")
                await page.get_by_role("button", name="Add comment").click()
                await page.get_by_role("button", name="Remove the comment on app.py:3").click()
                await expect(page.locator(".review-panel h4")).to_have_text("Your review: 2 comments")
                wide = await page.evaluate("document.scrollingElement.scrollWidth")
                await shot(page, "review-390")
                await page.get_by_label("A note for the worker").fill("Nearly there.")
                await page.get_by_role("button", name="Send to worker").click()
                await expect(page.locator(".review-sent")).to_contain_text("Sent: a follow-up worker continues")
                followup = await until(lambda: next(iter(tables.tasks(db.admin_dsn, "id", continues_task_id=reviewed)),
                                                    None), "the follow-up worker", 60)
                # the thread's chat keeps the review, linking the follow-up
                await page.goto(f"{url}/#chat/{thread}")
                kept = page.locator("#messages .msg.review")
                await expect(kept).to_contain_text("You reviewed petal/", timeout=20_000)
                await expect(kept).to_contain_text("2 comments")
                link = await kept.get_by_role("link").get_attribute("href")
                await no_script_ran(page)
    assert wide <= PHONE["width"]  # the diff scrolls in its box; the page does not
    brief = tables.task(db.admin_dsn, followup[0], "brief")[0]
    assert "app.py:2 — y should be 4" in brief and "app.py:1-3 — keep these in order" in brief
    assert "Nearly there." in brief and "never mind" not in brief
    assert link == f"#task/{followup[0]}"
