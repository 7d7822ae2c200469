"""A terminal session on a phone, in a real Chromium against the real services: `petal-dispatch claude` run in
tmux (the real interactive CLI against the scripted model) is a thread "live in a terminal" on a 390x844 page;
what is typed at the desk and Claude's reply show in the conversation, a message sent from the page is typed
into the terminal and its reply shows on both screens, Stop and End session stay on screen wherever the conversation
is scrolled (docked with the composer), and End session ends it everywhere (the open Sessions picker too) — the bar goes, the
wrapper in the terminal exits, the thread says the session ended — with no CLI left behind."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import psutil
import pytest
from playwright.async_api import expect

from tests.e2e.test_terminal import _alive, desk, rows, started
from tests.pg import DB
from tests.wait import until
from tests.web.seen import seen
from tests.web.test_web_client import PHONE, browser, page_at, shot

pytestmark = [pytest.mark.web, pytest.mark.timeout(240)]


def _ours(tmp: Path, *, claude_only: bool) -> list[str]:
    """The processes (not this one) that belong to this test's desk: its directory in their command line, working
    directory or environment; with `claude_only`, those whose name or command line says claude (the CLI, the
    wrapper). A zombie is gone but for its parent."""
    mark, found = str(tmp), []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            said = f"{proc.info['name']} {cmdline}"
            if claude_only and "claude" not in said:
                continue
            if mark in cmdline or mark in proc.cwd() or any(mark in v for v in proc.environ().values()):
                found.append(f"{proc.pid} {said[:160]}")
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or not ours to read
    return found


async def test_a_terminal_session_is_followed_steered_and_ended_from_a_phone(db: DB, tmp_path: Path) -> None:
    sockets: list[Path] = []
    try:
        async with desk(db, tmp_path) as at_desk, browser() as b:
            h, http, tmux, env, cwd = at_desk[:5]  # (the services, the desk's terminal, its environment and folder)
            url = str(http.base_url).rstrip("/")
            async with page_at(b, url, PHONE) as page:
                # the phone is open when the user starts claude at the desk: the new thread comes to the picker live
                thread = await started(tmux, http, env, cwd)
                tid, task_id = thread["id"], thread["terminal"]["task_id"]
                # (tmux's kill-server, at the desk's end, leaves its socket file behind: removed at the end)
                sockets.append(Path((await tmux.run("display-message", "-p", "-t", "desk", "#{socket_path}")).strip()))
                picker = page.locator("#thread-picker")
                await expect(picker.locator(f"option[value='{tid}']")).to_have_count(1, timeout=20_000)
                await picker.select_option(tid)

                # the thread is live in a terminal, shown in the desk's terminal, and says where it runs
                bar = page.locator("#terminal-live")
                await expect(bar).to_be_visible(timeout=20_000)
                await seen(bar.locator(".chip.live"), "live in a terminal")
                await expect(bar).to_contain_text(re.compile(r"live in a terminal\s+shown in /dev/pts/\d+"))
                await expect(bar).to_contain_text("not sandboxed")  # the page says which
                await expect(bar).not_to_contain_text("null")
                await seen(page.locator("#terminal-end"), "End session")
                await expect(page.locator("#handback-cmd")).to_have_text(f"petal-dispatch attach {tid}")
                await expect(page.locator(".msg.note", has_text="Live in a terminal")).to_contain_text(f"in {cwd}")
                assert await page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]

                # typed at the desk: the prompt and Claude's reply are in the conversation on the phone
                await tmux.keys("desk", "hello from the desk", literal=True)
                await tmux.keys("desk", "Enter")
                await tmux.shows("desk", "echo: hello from the desk")
                await expect(page.locator(".msg.user", has_text="hello from the desk")).to_have_count(1, timeout=20_000)
                await seen(page.locator(".msg.assistant.terminal", has_text="echo: hello from the desk"),
                           "echo: hello from the desk", timeout=20, scroll=True)

                # sent from the phone's chat box: typed at the terminal's empty prompt as the user's own, answered there
                # and on the page, shown once (the pending bubble gives way to the terminal's echo)
                await page.fill("#composer-text", "from the phone")
                await page.click("#composer button[type='submit']")
                screen = await tmux.shows("desk", "echo: from the phone")
                typed = [line for line in screen.splitlines() if line.rstrip().endswith("from the phone")
                         and "echo:" not in line]
                assert typed, f"the page's message as a prompt on the terminal:\n{screen}"
                reply = page.locator(".msg.assistant.terminal", has_text="echo: from the phone")
                await seen(reply, "echo: from the phone", timeout=20, scroll=True)
                await expect(page.locator(".msg.user.pending")).to_have_count(0, timeout=20_000)
                await expect(page.locator(".msg.user", has_text="from the phone")).to_have_text(["from the phone"])
                assert await page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
                await shot(page, "terminal-live-phone")

                # the bar stays on screen while the conversation is followed: docked with the composer, as on a phone
                # whose keyboard is open (half the screen), read at its newest line
                await page.set_viewport_size({"width": PHONE["width"], "height": 420})
                await page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
                assert await page.evaluate("document.documentElement.scrollHeight") > 700  # the page does scroll
                for button in ("#terminal-end", "#terminal-stop"):  # whole, uncovered (the tabs are fixed), touch-sized
                    await expect(page.locator(button)).to_be_in_viewport(ratio=1)
                    await seen(page.locator(button))
                    assert ((await page.locator(button).bounding_box()) or {"height": 0})["height"] >= 44, button
                await expect(page.locator("#composer-text")).to_be_in_viewport()
                await page.evaluate("window.scrollTo(0, 0)")  # and at the top of the conversation
                await expect(page.locator("#terminal-end")).to_be_in_viewport(ratio=1)
                await seen(page.locator("#terminal-end"))
                await page.set_viewport_size({"width": PHONE["width"], "height": PHONE["height"]})

                # the Sessions picker, open, lists it first as live in the desk's terminal
                await page.click("#sessions-open")
                live_row = page.locator("#sessions-list .session.terminal")
                await expect(live_row).to_have_count(1, timeout=20_000)
                await expect(live_row).to_contain_text(re.compile(r"live in a terminal, shown in /dev/pts/\d+"))

                # End session, tapped on the phone: the bar goes, the wrapper at the desk exits, the thread says so
                [(pid,)] = await rows(h, "SELECT pid FROM tasks WHERE id = %s", uuid.UUID(task_id))
                assert pid is not None and _alive(pid)
                assert any(p.startswith(f"{pid} ") for p in _ours(tmp_path, claude_only=True))  # the check sees it
                await page.click("#terminal-end")
                await expect(bar).to_be_hidden(timeout=30_000)
                # the chat box goes back to the orchestrator (its turns continue the conversation)
                await expect(page.locator("#composer-text")).to_have_attribute("placeholder",
                                                                               "Tell the orchestrator what to do…")
                # and the picker, still open, follows: the session is no longer listed as live
                await expect(live_row).to_have_count(0, timeout=20_000)
                await until(lambda: tmux.exit_code("desk") is not None, "the wrapper in the terminal to exit", 30)
                assert tmux.exit_code("desk") in ("0", "129"), tmux.exit_code("desk")
                ended = page.locator(".msg.note", has_text="The terminal session ended")
                await seen(ended, "The terminal session ended (ended from the page", timeout=20, scroll=True)
                # the thread goes on with --resume: its header gives that command for a terminal
                await expect(page.locator("#handback-cmd")).to_contain_text("--resume")
                [(status, reason)] = await rows(h, "SELECT status, status_reason FROM tasks WHERE id = %s",
                                                uuid.UUID(task_id))
                assert (status, reason) == ("cancelled", "ended_from_the_page")
                await until(lambda: not _alive(pid), f"the session's CLI ({pid}) to be gone", 20)
                await until(lambda: _ours(tmp_path, claude_only=True) == [],
                            lambda: f"no claude of this desk left: {_ours(tmp_path, claude_only=True)}", 20)
                assert await page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
                await shot(page, "terminal-ended-phone")
    finally:
        for socket in sockets:
            socket.unlink(missing_ok=True)
    # the services stopped, the desk's terminal closed: nothing of this test runs on
    await until(lambda: _ours(tmp_path, claude_only=False) == [],
                lambda: f"no process of this test left: {_ours(tmp_path, claude_only=False)}", 30)
