"""Notifications: Web Push (encrypted, decrypted here with the subscriber's keys), gone subscriptions,
ntfy, the rate limit and digests, and the page's opt-in in a real Chromium."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
from playwright.async_api import expect
from pydantic import SecretStr

from executor.notify.notifier import Notifier, NotifyConfig
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import journal
from shared.database import Database
from shared.models import NewEvent
from tests import tables
from tests.harness import running_executor
from tests.pg import DB
from tests.push_standin import StandIn, Subscriber
from tests.web.test_web_client import browser
from tests.served import ingress_server
from tests.wait import until

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

QUESTION = {"question": "Deploy to staging now?", "header": "Deploy", "multiSelect": False,
            "options": [{"label": "Yes", "description": ""}, {"label": "Later", "description": ""}]}


def _loopback_push(tmp_path: Path) -> NotifyConfig:
    # the push stand-in listens on loopback, which a real deployment refuses (SSRF)
    return NotifyConfig(data_dir=tmp_path / "var", allow_loopback_push=True)


async def _subscribe(http: httpx.AsyncClient, sub: Subscriber) -> None:
    async def subscribed() -> bool:
        r = await http.post("/api/push/subscriptions", json=sub.json())
        assert r.status_code in (201, 409), r.text  # 409 until the executor has published its key
        return r.status_code == 201
    await until(subscribed, "the subscription to be accepted (the executor publishes its key as it starts)", 30)


def _rows(db: DB, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db.admin_dsn) as conn:
        return conn.execute(sql, params).fetchall()


async def test_a_question_reaches_a_subscribed_browser_as_an_encrypted_push_naming_it(db: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[
        {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [QUESTION]}}},
        {"text": "ok"}])])
    with StandIn() as push, ScriptedModelServer(scenario) as model:
        phone = Subscriber(f"{push.url}/push/phone-1")
        async with running_executor(db, model, tmp_path, notify_config=_loopback_push(tmp_path)), \
                ingress_server(db.ingress_dsn, push_allow_loopback=True) as url, \
                httpx.AsyncClient(base_url=url) as http:
            await _subscribe(http, phone)
            info = (await http.get("/api/push", params={"endpoint": phone.endpoint})).json()
            await http.post("/api/chat", json={"text": "ship it"})
            got = await asyncio.to_thread(push.wait_for, 1)
    assert info["subscribed"] is True and len(info["public_key"]) > 80
    request = got[0]
    assert request.path == "/push/phone-1"
    assert request.headers["content-encoding"] == "aes128gcm"
    assert request.headers["authorization"].startswith("vapid t=") and f"k={info['public_key']}" in \
        request.headers["authorization"]
    shown = phone.decrypt(request.body)
    assert shown["title"] == "Claude asks" and shown["body"] == "Deploy to staging now?"
    assert shown["url"] == f"/#asks/{shown['question_id']}"  # the page at the card
    # small: no transcript; the question's answer buttons and their one-use token (tests/e2e/test_notify_actions.py)
    assert set(shown) == {"title", "body", "url", "tag", "actions", "token", "question_id", "choices"}


async def test_a_subscription_the_push_service_says_is_gone_is_removed(db: DB, tmp_path: Path) -> None:
    with StandIn(statuses=[410]) as push, ScriptedModelServer(Scenario()) as model:
        phone = Subscriber(f"{push.url}/push/old-phone")
        async with running_executor(db, model, tmp_path, notify_config=_loopback_push(tmp_path)), \
                ingress_server(db.ingress_dsn, push_allow_loopback=True) as url, \
                httpx.AsyncClient(base_url=url) as http:
            await _subscribe(http, phone)
            assert (await http.post("/api/push/test", json={})).status_code == 202
            await asyncio.to_thread(push.wait_for, 1)
            await until(lambda: not tables.count(db.admin_dsn, "push_subscriptions"),
                        "the gone subscription to be removed", 30)
            info = (await http.get("/api/push", params={"endpoint": phone.endpoint})).json()
    assert info["subscribed"] is False and info["subscriptions"] == 0


async def test_ntfy_gets_the_same_events_with_a_click_through_link(db: DB, tmp_path: Path) -> None:
    with StandIn(statuses=[200]) as ntfy, ScriptedModelServer(Scenario()) as model:
        config = NotifyConfig(data_dir=tmp_path / "var", ntfy_url=f"{ntfy.url}/petal-topic",
                              ntfy_token=SecretStr("tk_secret"),
                              public_url="https://petal.example/")
        async with running_executor(db, model, tmp_path, notify_config=config), \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/api/push")).json()["ntfy"] is True
            await http.post("/api/push/test", json={})
            got = await asyncio.to_thread(ntfy.wait_for, 1)
    assert got[0].path == "/petal-topic"
    assert got[0].headers["title"] == "petal-dispatch" and got[0].headers["click"] == "https://petal.example/#chat"
    assert got[0].headers["authorization"] == "Bearer tk_secret"
    assert got[0].body.decode().startswith("Notifications work.")


async def test_bad_subscriptions_are_refused_with_a_reason_and_change_nothing(db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path), ingress_server(db.ingress_dsn) as url, \
                httpx.AsyncClient(base_url=url) as http:
            good = Subscriber("https://push.example/abc").json()
            answers = [await http.post("/api/push/subscriptions", json=body) for body in (
                {**good, "endpoint": "http://push.example/abc"},  # plain http off this machine
                {**good, "endpoint": "file:///etc/passwd"},
                {**good, "keys": {"p256dh": "short", "auth": good["keys"]["auth"]}},
                {**good, "keys": {"p256dh": good["keys"]["p256dh"], "auth": "!!notbase64!!"}},
            )]
    assert [a.status_code for a in answers] == [422] * 4
    assert "https" in answers[0].text and "p256dh" in answers[2].text
    assert tables.count(db.admin_dsn, "push_subscriptions") == 0


# ---- the rate limit and digests ------------------------------------------------------------------------

async def test_one_notification_per_task_and_kind_per_minute_and_a_digest_for_a_burst(db: DB, tmp_path: Path) -> None:
    tasks = [uuid.uuid4() for _ in range(6)]
    with psycopg.connect(db.admin_dsn) as conn:
        for t in tasks:
            conn.execute("INSERT INTO tasks (id, role, brief, status) VALUES (%s, 'worker', 'a job', 'running')", [t])
    with StandIn() as ntfy:
        config = NotifyConfig(data_dir=tmp_path / "var", ntfy_url=f"{ntfy.url}/t", rate_limit_s=60, digest_after=3)
        async with Database(db.executor_dsn, name="test-notifier") as database:
            notifier = Notifier(database.pool, config)
            await notifier.start()

            async def stalled(*task_ids: uuid.UUID) -> list[Any]:
                async with database.pool.connection() as conn:
                    await journal.append_on(conn, [NewEvent("task.stalled", {"silent_s": 200, "threshold_s": 180},
                                                            task_id=t) for t in task_ids])
                return await notifier.pass_once()

            first = await stalled(tasks[0])
            again = await stalled(tasks[0], tasks[0])  # the same task stalls again within the minute
            burst = await stalled(*tasks[1:6])  # five at once
    outcomes = _rows(db, "SELECT kind, task_id, outcome FROM notifications ORDER BY created_at, kind")
    assert [n.kind for n in first] == ["stalled"] and again == []
    assert [(k, o) for k, t, o in outcomes if t == tasks[0]] == [("stalled", "sent"), ("stalled", "rate_limited"),
                                                                  ("stalled", "rate_limited")]
    assert sorted(o for k, t, o in outcomes if t in tasks[1:]) == ["digested"] * 5
    digests = [r for r in outcomes if r[0] == "digest"]
    assert len(digests) == 1 and digests[0][2] == "sent" and len(burst) == 5
    bodies = [r.headers["title"] for r in ntfy.received]
    assert bodies == ["A worker stalled", "5 things need you"]  # two phone buzzes, not seven


async def test_a_finished_turn_is_pushed_only_when_no_page_watches_its_thread(db: DB, tmp_path: Path) -> None:
    watched, unwatched = uuid.uuid4(), uuid.uuid4()
    turns = {}
    with psycopg.connect(db.admin_dsn) as conn:
        for thread in (watched, unwatched):
            conn.execute("INSERT INTO sessions (id, role, lifecycle) VALUES (%s, 'orchestrator', 'idle')", [thread])
            turns[thread] = conn.execute("INSERT INTO tasks (role, brief, status, session_id) VALUES"
                                         " ('orchestrator', 'hi', 'success', %s) RETURNING id", [thread]).fetchone()[0]  # type: ignore[index]
        conn.execute("INSERT INTO client_presence (client_id, thread_id) VALUES ('phone-in-hand', %s)", [watched])
    with StandIn() as ntfy:
        # digest_s=0: a finished turn alone goes out in the pass that saw it (tests/e2e/test_notify_when_needed.py)
        config = NotifyConfig(data_dir=tmp_path / "var", ntfy_url=f"{ntfy.url}/t", digest_s=0)
        async with Database(db.executor_dsn, name="test-notifier") as database:
            notifier = Notifier(database.pool, config)
            await notifier.start()
            async with database.pool.connection() as conn:
                await journal.append_on(conn, [NewEvent("task.exited", {"status": "success"}, task_id=turns[t],
                                                        session_id=t) for t in (watched, unwatched)])
            sent = await notifier.pass_once()
    assert [(n.kind, n.thread_id, n.url) for n in sent] == [("turn_finished", unwatched, f"/#chat/{unwatched}")]
    assert [r.headers["title"] for r in ntfy.received] == ["Reply ready"]


# ---- the page ------------------------------------------------------------------------------------------

STUB_PUSH = """
(() => {
  const sub = %s;
  let current = null;
  const make = () => ({ endpoint: sub.endpoint, expirationTime: null, toJSON: () => sub,
                        unsubscribe: async () => { current = null; return true; } });
  // Chromium's own push service is not reachable here: the subscription the page receives is the
  // test's, pointing at the loopback stand-in, with keys the test can decrypt with.
  PushManager.prototype.subscribe = async function (options) {
    window.__subscribeOptions = { userVisibleOnly: options.userVisibleOnly, keyLength: options.applicationServerKey.byteLength };
    current = make(); return current;
  };
  PushManager.prototype.getSubscription = async function () { return current; };
})();
"""


async def test_the_page_opts_in_by_button_its_service_worker_registers_and_a_test_push_arrives(
    db: DB, tmp_path: Path
) -> None:
    import json

    with StandIn() as push, ScriptedModelServer(Scenario()) as model:
        phone = Subscriber(f"{push.url}/push/browser")
        async with running_executor(db, model, tmp_path, notify_config=_loopback_push(tmp_path)), \
                ingress_server(db.ingress_dsn, push_allow_loopback=True) as url, browser() as b:
            context = await b.new_context(viewport={"width": 390, "height": 844}, permissions=["notifications"])
            await context.add_init_script(STUB_PUSH % json.dumps(phone.json()))
            page = await context.new_page()
            await page.goto(url + "/")
            await expect(page.locator("body[data-notify='off']")).to_have_count(1, timeout=20_000)
            assert tables.count(db.admin_dsn, "push_subscriptions") == 0  # never on load
            worker = await page.evaluate("navigator.serviceWorker.ready.then(r => r.active.scriptURL)")
            await page.click("#notify-button")
            await page.click("#notify-enable")
            await expect(page.locator("#notify-state")).to_have_text("on", timeout=20_000)
            options = await page.evaluate("window.__subscribeOptions")
            await page.click("#notify-test")
            got = await asyncio.to_thread(push.wait_for, 1)
            await page.click("#notify-disable")
            await expect(page.locator("#notify-state")).to_have_text("off")
            await context.close()
    assert worker == f"{url}/sw.js"
    assert options == {"userVisibleOnly": True, "keyLength": 65}
    assert phone.decrypt(got[0].body)["body"].startswith("Notifications work.")
    assert tables.count(db.admin_dsn, "push_subscriptions") == 0  # turned off: removed
