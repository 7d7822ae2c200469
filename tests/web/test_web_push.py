"""Push from the phone (390×844): the diff card of a project with a push remote has Push; it sends the reviewed
commit to the remote and the card says it was pushed, or why it failed. Real Chromium, the real CLI in its sandbox,
real git."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path

import httpx
import pytest
from playwright.async_api import expect

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests.e2e.test_projects import _bash, _repo, _request
from tests.e2e.test_push import _bare, _refs
from tests.e2e.test_reviews import _recorded
from tests.harness import running_executor
from tests.pg import DB
from tests.served import ingress_server
from tests.web.test_web_client import PHONE, browser, no_script_ran, page_at, shot

pytestmark = pytest.mark.timeout(240)


async def test_push_on_the_diff_card_at_phone_size_says_pushed_or_why_not(db: DB, tmp_path: Path) -> None:
    roots = tmp_path / "roots"
    repo = _repo(roots / "repo", {"app.py": "x = 1\n"})
    bare = _bare(tmp_path / "a-remote-with-a-rather-long-name-to-wrap-on-a-phone.git")
    scenario = Scenario(rules=[Rule(role="worker", match="set x", replies=[_bash("printf 'x = 2\\n' > app.py"),
                                                                         {"text": "x is 2"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, project_roots=(roots,)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http, browser() as b:
            made = await _request(http, "/api/projects", {"slug": "demo", "workdir": str(repo),
                                                          "push_remote": str(bare)})
            task_id = await h.dispatch("set x", project_id=uuid.UUID(made["result"]["project_id"]))
            row = await _recorded(h, task_id)
            async with page_at(b, url, PHONE) as page:
                page.on("dialog", lambda d: asyncio.ensure_future(d.accept()))
                await page.goto(f"{url}/#task/{task_id}")
                button = page.locator("#task-detail .changes .push").get_by_role("button", name="Push")
                await expect(button).to_be_visible(timeout=20_000)
                # the remote gone first: the card says the push failed, and why
                moved = bare.with_name("moved.git")
                bare.rename(moved)
                await button.click()
                await expect(page.locator(".changes .push .push-failed")).to_contain_text("Push failed",
                                                                                         timeout=30_000)
                shutil.move(moved, bare)
                await page.locator(".changes .push").get_by_role("button", name="Push").click()
                await expect(page.locator(".changes .push .pushed")).to_contain_text("Pushed", timeout=30_000)
                await expect(page.locator(".changes .push .pushed")).to_contain_text(row["branch"])
                wide = await page.evaluate("document.scrollingElement.scrollWidth")
                await shot(page, "push-390")
                await no_script_ran(page)
            diff = (await http.get(f"/api/tasks/{task_id}/diff")).json()
    assert wide <= PHONE["width"]
    assert _refs(bare) == {f"refs/heads/{row['branch']}": diff["head_commit"]}
