"""Token mode as the README's "Token mode" block starts it (PETAL_AUTH_MODE=token, PETAL_AUTH_TOKEN=<32 hex>,
`petal-dispatch up`), used from Chromium at phone size: the page sends to the sign-in form, the token typed and
submitted through that form signs in, a chat message gets its reply, and Claude's question is answered through
the docked card — the answer reaches the CLI and the turn goes on to its final reply.

The sign-in was refused (`403 cross-origin request refused (from 'null')`) while the page sent
`Referrer-Policy: no-referrer`: under it Chromium sends `Origin: null` with a form POST. The negative control
serves the same running `up` through a relay that puts that header back, and sees the browser's POST carry
`Origin: null` and be refused; with the page as shipped it carries the page's own origin and signs in."""

from __future__ import annotations

import http.client
import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Page, Request, expect

from tests.shipped._start import FAKE_KEY, fresh_home, scenario_file, scripted_model, up, user_env
from tests.web.seen import seen
from tests.web.test_web_client import PHONE, browser, shot

pytestmark = [pytest.mark.shipped, pytest.mark.timeout(300)]

ASKED = "Which colour should the button be?"
QUESTION = {"question": ASKED, "header": "Colour", "multiSelect": False,
            "options": [{"label": "Red", "description": "loud"}, {"label": "Blue", "description": "calm"},
                        {"label": "Green", "description": "fresh"}]}
HELLO = "Hello from the scripted model"
FINAL = "Painting it the colour you chose"
SCENARIO: dict[str, Any] = {
    "rules": [
        {"role": "orchestrator", "match_last": "say hello", "replies": [{"text": HELLO}]},
        {"role": "orchestrator", "match_last": "pick a colour", "replies": [
            {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [QUESTION]}}}]},
        # the same turn once the answer came back as the tool's result (the request's latest user message
        # carries only that result): its final reply
        {"role": "orchestrator", "replies": [{"text": "not asked"}, {"text": FINAL}]},
    ],
    "default": {"text": "ok"},
}


class _Relay(BaseHTTPRequestHandler):
    """Forwards to the ingress as it is (its own Host), and answers with `Referrer-Policy: no-referrer`."""

    ingress_port = 0

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._forward()

    def do_POST(self) -> None:  # noqa: N802
        self._forward()

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        conn = http.client.HTTPConnection("127.0.0.1", self.ingress_port, timeout=10)
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            answer = conn.getresponse()
            content = answer.read()
        finally:
            conn.close()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("referrer-policy", "transfer-encoding", "content-length", "connection"):
                self.send_header(name, value)
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)


@contextmanager
def _no_referrer_relay(ingress_port: int) -> Iterator[str]:
    handler = type("Relay", (_Relay,), {"ingress_port": ingress_port})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def _sign_in(page: Page, token: str) -> Request:
    """Type the token into the sign-in form and submit it as a user does; the form's POST request."""
    field, button = page.locator("input[name=token]"), page.get_by_role("button", name="Sign in")
    await seen(field)
    await seen(button)
    await field.fill(token)
    async with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/login")) as posted:
        await button.click()
    return await posted.value


async def test_token_mode_at_phone_size_signs_in_through_the_form_chats_and_answers_a_question(
        tmp_path: Path) -> None:
    token = secrets.token_hex(16)  # `openssl rand -hex 16`
    home, project = fresh_home(tmp_path), tmp_path / "project"
    project.mkdir()
    with scripted_model(scenario_file(tmp_path, SCENARIO)) as model:
        env = user_env(home, PETAL_AUTH_MODE="token", PETAL_AUTH_TOKEN=token, ANTHROPIC_API_KEY=FAKE_KEY,
                       ANTHROPIC_BASE_URL=model.url)
        with up(project, env, tmp_path / "up.log") as service:
            url = service.url
            # the boundary's side of the bug: a sign-in form POST whose Origin is `null` is refused, its own
            # origin's is not (the token right in both)
            # a client each: the refusal does not read the form, so the server closes that connection after it, and a
            # second request on it races the close ("Server disconnected without sending a response")
            async with httpx.AsyncClient(base_url=url) as http:
                null = await http.post("/login", data={"token": token}, headers={"Origin": "null"})
            async with httpx.AsyncClient(base_url=url) as http:
                own = await http.post("/login", data={"token": token}, headers={"Origin": url})
            assert null.status_code == 403 and "from 'null'" in null.text
            assert own.status_code == 303

            async with browser() as b:
                # negative control: the same `up` reached through a loopback relay that serves its pages under
                # `Referrer-Policy: no-referrer`, as they were served before the fix
                with _no_referrer_relay(service.port) as relay:
                    context = await b.new_context(viewport=PHONE)
                    page = await context.new_page()
                    await page.goto(f"{relay}/")
                    assert page.url == f"{relay}/login"
                    request = await _sign_in(page, token)
                    response = await request.response()
                    assert (await request.all_headers()).get("origin") == "null"
                    assert response is not None and response.status == 403
                    assert "cross-origin request refused (from 'null')" in await response.text()
                    await context.close()

                # as shipped
                context = await b.new_context(viewport=PHONE)
                page = await context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                console: list[str] = []
                page.on("console", lambda m: console.append(f"{m.type}: {m.text}"[:300]))
                await page.goto(f"{url}/")
                assert page.url == f"{url}/login"  # sent to the sign-in form
                assert (await page.request.get(f"{url}/login")).headers["referrer-policy"] == "same-origin"
                await shot(page, "shipped-token-sign-in-390")
                # a token mistyped: the form again, saying so, and it is typed again there
                wrong = await _sign_in(page, "not-" + token)
                assert (response := await wrong.response()) is not None and response.status == 401
                await seen(page.get_by_role("alert"), "Wrong token: try again.")
                request = await _sign_in(page, token)
                assert (await request.all_headers()).get("origin") == url
                response = await request.response()
                assert response is not None and response.status == 303
                await page.wait_for_url(f"{url}/")
                await expect(page.locator("body[data-ready='1']")).to_have_count(1, timeout=20_000)

                # a chat message, sent through the composer, gets its reply
                await seen(page.locator("#composer-text"))
                await page.fill("#composer-text", "say hello")
                await page.click("#composer button")
                await expect(page.locator(".msg.assistant", has_text=HELLO)).to_have_count(1, timeout=90_000)

                # Claude asks; the answer is given on the card docked above the composer
                await page.fill("#composer-text", "pick a colour")
                await page.click("#composer button")
                card = page.locator("#pinned-asks .ask")
                try:
                    await expect(card).to_have_count(1, timeout=90_000)
                except AssertionError as exc:  # once (under four workers) the message never reached the store
                    said = await page.evaluate(
                        "() => ({chat: [...document.querySelectorAll('#messages .msg')].map((m) => m.className + ': ' "
                        "+ m.textContent.slice(0, 200)), error: document.querySelector('#composer-error')"
                        "?.textContent, draft: document.querySelector('#composer-text')?.value})")
                    raise AssertionError(f"{exc}\nthe page: {said}\nits console: {console[-20:]}") from None
                await expect(card.locator(".bar")).to_contain_text(ASKED)
                if not await card.locator("fieldset").first.is_visible():
                    await card.locator(".bar .toggle").click()
                options = card.locator(".option label")
                await expect(options).to_have_count(3)
                # the card's actions above the tab bar as it opens (a tab's count badge once wrapped the bar taller
                # than the dock stands on, hiding Submit); each option once the card is scrolled to it, clear of
                # the sticky actions (at 390x844 the card's share of the screen ends above its first option)
                await seen(card.locator(".actions button", has_text="Submit"))
                buttons_bottom, tabs_top = await page.evaluate(
                    "() => [Math.max(...[...document.querySelectorAll('#pinned-asks .ask .actions button')]"
                    ".map((b) => b.getBoundingClientRect().bottom)), "
                    "document.querySelector('nav.tabs').getBoundingClientRect().top]")
                assert buttons_bottom <= tabs_top, (buttons_bottom, tabs_top)  # wholly above the tab bar
                for i in range(3):
                    await seen(options.nth(i), scroll=True)
                await shot(page, "shipped-token-ask-390")
                blue = options.filter(has_text="Blue")
                await seen(blue, scroll=True)
                await blue.click()
                submit = card.locator("button[type='submit']")
                await seen(submit)
                await submit.click()
                await expect(card).to_have_count(0)
                # the answer reached the CLI: the same turn went on to its final reply
                await expect(page.locator(".msg.assistant", has_text=FINAL)).to_have_count(1, timeout=90_000)
                await shot(page, "shipped-token-answered-390")
                assert errors == [], errors
                await context.close()

            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http:
                asks = (await http.get("/api/asks", params={"status": "answered"})).json()["asks"]
    assert len(asks) == 1, asks
    assert asks[0]["answered_by"] == "token" and asks[0]["answers"] == {ASKED: "Blue"}
    # what the model was sent back: the tool's result carries the answer
    results = [block for req in model.requests for block in req.user_blocks if block.get("type") == "tool_result"]
    assert any("Blue" in json.dumps(block) and ASKED in json.dumps(block) for block in results), results
