"""The web client's side of the boundary in a real Chromium against the real ingress, executor, PostgreSQL
and claude CLI on the scripted model: hostile text in every place the page renders it runs nothing (with
the CSP bypassed, so the sanitiser alone must hold), the page works under its CSP, and a page from
another origin, or a rebound name, cannot use the API."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from playwright.async_api import Browser, Dialog, Page, Route, async_playwright, expect

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests import tables
from tests.harness import running_executor
from tests.pg import DB
from tests.scenarios import extractor
from tests.web.test_web_client import chromium
from tests.served import ingress_server

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

pytestmark = pytest.mark.timeout(300)

# each sets window.__xss (or opens a dialog) if it ever runs
PAYLOADS = ("[x](javascript:alert(1)) [y](javascript:window.__xss='link') [d](data:text/html,<script>alert(2)</script>) "
            "![i](javascript:alert(3)) [ok](https://example.com/ok) "
            "<img src=x onerror=\"window.__xss='img';alert(4)\"> "
            "<svg onload=\"window.__xss='svg-onload'\"><script>window.__xss='svg';alert(5)</script></svg>")
HTML_PREVIEW = ("<h1 id=mock>Mock-up</h1><p id=styled style=\"color: rgb(200, 0, 0)\">red</p>"
                "<img src=x onerror=\"document.body.dataset.ran='img';alert(6)\">"
                "<script>document.body.dataset.ran='script';alert(7)</script>"
                "<svg onload=\"document.body.dataset.ran='svg'\"></svg>"
                "<a id=jslink href=\"javascript:document.body.dataset.ran='link'\">click</a>")
QUESTIONS = [{"question": "Which design?", "header": "Design", "multiSelect": False, "options": [
    {"label": "Markdown", "description": "", "preview": f"## Plan\n\n{PAYLOADS}"},
    {"label": "Mockup", "description": "", "preview": HTML_PREVIEW}]}]
HANDOFF = {"goal": f"goal {PAYLOADS}", "current_state": f"state {PAYLOADS}", "next_step": f"next {PAYLOADS}",
           "ruled_out": [{"approach": PAYLOADS, "reason": PAYLOADS}], "status": "success", "artifacts": [PAYLOADS]}
# what the page must never contain outside a sandboxed frame
DANGEROUS = ('a[href^="javascript:" i], a[href^="data:" i], img[src^="javascript:" i], [onerror], [onload], '
             'svg, script:not([src]), iframe:not([sandbox]), iframe[sandbox*="allow-scripts"], '
             'iframe[sandbox*="allow-same-origin"]')
CSP_WATCH = """document.addEventListener("securitypolicyviolation",
  (e) => (window.__csp = window.__csp || []).push(`${e.violatedDirective} ${e.blockedURI}`));"""


async def _context(b: Browser, *, bypass_csp: bool) -> tuple[Any, Page, list[str], list[str]]:
    context = await b.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=bypass_csp)
    await context.add_init_script(CSP_WATCH)
    page = await context.new_page()
    dialogs: list[str] = []
    errors: list[str] = []

    async def dismiss(d: Dialog) -> None:
        dialogs.append(d.message)
        await d.dismiss()

    page.on("dialog", lambda d: asyncio.ensure_future(dismiss(d)))
    page.on("pageerror", lambda e: errors.append(str(e)))
    return context, page, dialogs, errors


async def _nothing_ran(page: Page, dialogs: list[str]) -> None:
    await asyncio.sleep(0.5)  # a window in which nothing may run: a broken image's onerror would fire in it
    assert dialogs == []
    assert await page.evaluate("window.__xss") is None
    assert await page.evaluate(f"document.querySelectorAll({json.dumps(DANGEROUS)}).length") == 0


async def test_hostile_text_in_every_rendered_field_runs_nothing_and_the_page_works_under_its_csp(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[
        Rule(role="orchestrator", replies=[
            {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": QUESTIONS}}},
            {"text": f"Reply: **bold** {PAYLOADS}"}]),
        Rule(role="worker", replies=[{"text": "done"}]),
        extractor(HANDOFF),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True) as h, ingress_server(db.ingress_dsn) as url, \
                async_playwright() as p:
            b = await p.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
            # the sanitiser alone (CSP bypassed), and the page as served (CSP enforced)
            bare, page, dialogs, errors = await _context(b, bypass_csp=True)
            served, strict, strict_dialogs, strict_errors = await _context(b, bypass_csp=False)
            for pg in (page, strict):
                await pg.goto(url + "/")
                await expect(pg.locator("body[data-ready='1']")).to_have_count(1, timeout=20_000)
            # a user message
            await page.fill("#composer-text", f"please {PAYLOADS}")
            await page.click("#composer button")
            await expect(page.locator(".msg.user")).to_have_count(1, timeout=30_000)
            await _nothing_ran(page, dialogs)
            await expect(page.locator(".msg.user")).to_contain_text("[x](javascript:alert(1))")
            # option previews: markdown stays sanitised markdown, HTML goes into a frame that runs nothing
            for pg, seen in ((page, dialogs), (strict, strict_dialogs)):
                card = pg.locator("#pinned-asks .ask")
                await expect(card).to_have_count(1, timeout=60_000)
                await card.locator(".bar .toggle").click()
                for summary in await card.locator("details.preview summary").all():
                    await summary.click()
                await _nothing_ran(pg, seen)
                md_preview = card.locator(".option", has_text="Markdown").locator("details.preview")
                await expect(md_preview.locator("h2")).to_have_text("Plan")
                await expect(md_preview).to_contain_text("[x](javascript:alert(1))")  # a link shown as text
                await expect(md_preview.locator('a[href="https://example.com/ok"]')).to_have_attribute(
                    "rel", "noopener noreferrer")
                frame_el = card.locator("iframe.html-preview")
                await expect(frame_el).to_have_attribute("sandbox", "")
                frame = card.frame_locator("iframe.html-preview")
                await expect(frame.locator("#mock")).to_have_text("Mock-up", timeout=10_000)
                await frame.locator("#jslink").click()
                await asyncio.sleep(0.5)  # a window in which the clicked javascript: link must not run
                assert await frame.locator("body").get_attribute("data-ran") is None
                srcdoc = await frame_el.get_attribute("srcdoc")
                assert srcdoc is not None and "Content-Security-Policy" in srcdoc and "default-src 'none'" in srcdoc
            # the mock-up keeps its inline style under the page's CSP
            styled = await strict.locator("#pinned-asks").frame_locator("iframe.html-preview").locator("#styled").evaluate(
                "e => getComputedStyle(e).color")
            assert styled == "rgb(200, 0, 0)"
            # the option's own control: its label's middle is the preview opened above, which selects nothing
            await page.locator("#pinned-asks .ask .option", has_text="Markdown").locator("input[type='radio']").check()
            await page.locator("#pinned-asks .ask button[type='submit']").click()
            await expect(page.locator("#pinned-asks .ask")).to_have_count(0)
            # a reply, to the answer given (not to the question's timeout)
            reply = page.locator(".msg.assistant", has_text="Reply:")
            await expect(reply).to_have_count(1, timeout=60_000)
            closed = [e for e in await h.events() if e.event_type in ("question.answered", "question.timed_out")]
            assert [(e.event_type, e.payload["answers"]) for e in closed] == [
                ("question.answered", {"Which design?": "Markdown"})]
            await _nothing_ran(page, dialogs)
            await expect(reply.locator("strong")).to_have_text("bold")
            await expect(reply).to_contain_text("[y](javascript:window.__xss='link')")
            await expect(reply).to_contain_text("<img src=x onerror=")
            await expect(strict.locator(".msg.assistant", has_text="Reply:")).to_have_count(1, timeout=30_000)
            # a handoff's fields
            task_id = await h.dispatch("a worker whose handoff is hostile")
            await h.wait_final(task_id, timeout=90)
            for pg, seen in ((page, dialogs), (strict, strict_dialogs)):
                await pg.goto(f"{url}/#task/{task_id}")
                await expect(pg.locator("body[data-ready='1']")).to_have_count(1, timeout=20_000)
                await expect(pg.locator("#task-detail dl").nth(1)).to_contain_text("state", timeout=30_000)
                await _nothing_ran(pg, seen)
                await expect(pg.locator("#task-detail dl").nth(1)).to_contain_text("state [x](javascript:alert(1))")
                await expect(pg.locator("#task-detail dl").nth(1)).to_contain_text("<svg onload=")
            for pg, seen in ((page, dialogs), (strict, strict_dialogs)):
                await _nothing_ran(pg, seen)
            violations = await strict.evaluate("window.__csp || []")
            await bare.close()
            await served.close()
            await b.close()
    assert dialogs == [] and strict_dialogs == []
    assert errors == [] and strict_errors == []
    assert violations == []  # the page itself needs nothing its CSP forbids


async def test_a_page_from_another_origin_or_a_rebound_name_cannot_use_the_api(db: DB) -> None:
    async with ingress_server(db.ingress_dsn) as url, async_playwright() as p:
        port = int(url.rsplit(":", 1)[1])
        # attacker.example resolves to this machine, as a rebinding DNS server would make it. Chromium's own
        # Private Network Access checks would stop these requests before they leave; other browsers have
        # none, so they are off here: the server has to refuse on its own.
        b = await p.chromium.launch(executable_path=chromium(), args=[
            "--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP attacker.example 127.0.0.1",
            "--disable-features=BlockInsecurePrivateNetworkRequests,PrivateNetworkAccessSendPreflights,"
            "PrivateNetworkAccessRespectPreflightResults,LocalNetworkAccessChecks"])
        context = await b.new_context()
        page = await context.new_page()
        seen: list[tuple[str, int]] = []
        page.on("response", lambda r: seen.append((r.url, r.status)) if "/api/" in r.url else None)

        async def attacker_page(route: Route) -> None:
            await route.fulfill(status=200, content_type="text/html", body="<!doctype html><title>cats</title>")

        # 1. a page on another origin writes to the API across origins
        await page.route("http://attacker.example:1/", attacker_page)
        await page.goto("http://attacker.example:1/")
        cross = await page.evaluate("""async (api) => {
          const out = {};
          for (const [name, init] of Object.entries({
            json: { method: "POST", headers: { "content-type": "application/json" }, body: '{"text":"rm -rf"}' },
            simple: { method: "POST", mode: "no-cors", headers: { "content-type": "text/plain" }, body: '{"text":"rm -rf"}' },
            read: { method: "GET" },
          })) {
            try { const r = await fetch(api + (name === "read" ? "/api/threads" : "/api/chat"), init);
                  out[name] = r.type === "opaque" ? "opaque" : String(r.status) + " " + (await r.text()).slice(0, 80); }
            catch (e) { out[name] = "blocked"; }
          }
          return out;
        }""", url)
        # 2. the same port under the attacker's name: same-origin for the browser, refused by Host
        await page.unroute("http://attacker.example:1/")
        rebound_url = f"http://attacker.example:{port}"
        await page.route(f"{rebound_url}/", attacker_page)
        await page.goto(f"{rebound_url}/")
        rebound = await page.evaluate("""async () => {
          const out = {};
          for (const [name, path, init] of [
            ["chat", "/api/chat", { method: "POST", headers: { "content-type": "application/json" }, body: '{"text":"rm -rf"}' }],
            ["threads", "/api/threads", {}],
            ["stream", "/api/stream", { headers: { accept: "text/event-stream" } }],
            ["page", "/app.js", {}],
          ]) {
            try { const r = await fetch(path, init); out[name] = r.status; } catch (e) { out[name] = "blocked"; }
          }
          return out;
        }""")
        await b.close()
        async with httpx.AsyncClient(base_url=url) as http:
            own = await http.get("/api/queue")
    assert cross["json"] == "blocked"  # the preflight fails: no CORS, and the write never reaches a route
    assert cross["simple"] == "opaque" and cross["read"] == "blocked"
    assert all(status in (403, 405, 415, 421) for u, status in seen if "attacker.example:1" not in u), seen
    assert (f"{url}/api/chat", 403) in seen  # the no-cors write reached the server and was refused there
    assert rebound == {"chat": 421, "threads": 421, "stream": 421, "page": 421}
    assert own.json()["pending"] == []
    with psycopg.connect(db.admin_dsn) as conn:
        assert tables.count(conn, "chat_queue") == 0
