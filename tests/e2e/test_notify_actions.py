"""Answering from the notification: a question's Web Push (and ntfy's, on a topic that needs a token) carries its
options as buttons and a one-use token bound to that question; the token alone answers it once through the
ingress, as the user's answer from the notification, and is refused once the question is settled, used, expired
or unknown. The real CLI asks; the answer is what its tool returns."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from executor.notify.notifier import NotifyConfig
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests import tables
from tests.e2e.test_gates_e2e import _approved, _worker
from tests.e2e.test_notify import QUESTION, _loopback_push, _subscribe
from tests.harness import Harness, running_executor
from tests.pg import DB
from tests.push_standin import StandIn, Subscriber
from tests.scenarios import one_worker
from tests.served import ingress_server
from tests.wait import until


def _asking(question: dict[str, Any] = QUESTION) -> Scenario:
    return Scenario(rules=[Rule(role="orchestrator", replies=[
        {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [question]}}},
        {"text": "ok"}])])


async def _tool_result(h: Harness) -> dict[str, Any]:
    """What the CLI's ask_user_question returned to the model, from the ended turn's journal."""
    turn = (await h.ended_turns(1, timeout=120))[0]
    results = [b for e in await h.events(turn["id"]) if e.event_type == "stream.user"
               for b in e.payload["message"]["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    content = results[-1]["content"]
    parsed: dict[str, Any] = json.loads(content if isinstance(content, str) else content[0]["text"])
    return parsed


async def test_a_push_s_button_answers_its_question_once_with_its_token_alone(db: DB, tmp_path: Path) -> None:
    with StandIn() as push, ScriptedModelServer(_asking()) as model:
        phone = Subscriber(f"{push.url}/push/phone-1")
        async with running_executor(db, model, tmp_path, notify_config=_loopback_push(tmp_path)) as h, \
                ingress_server(db.ingress_dsn, open_mode=False, auth_mode="token", push_allow_loopback=True,
                               auth_token="user-secret-token-0123") as url, \
                httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer user-secret-token-0123"}) as user, \
                httpx.AsyncClient(base_url=url) as stranger:
            await _subscribe(user, phone)
            await user.post("/api/chat", json={"text": "ship it"})
            shown = phone.decrypt((await asyncio.to_thread(push.wait_for, 1))[0].body)
            token, qid = shown["token"], shown["question_id"]
            # no user credential: a made-up token, then a choice the question does not offer, change nothing
            forged = await stranger.post("/api/notify/act", json={"token": "x" * 43, "choice": "Yes"})
            wrong = await stranger.post("/api/notify/act", json={"token": token, "choice": "Deploy everything"})
            assert tables.row(db.admin_dsn, "questions", qid, "status") == ("pending",)
            pressed = await stranger.post("/api/notify/act", json={"token": token, "choice": "Yes"})
            result = await _tool_result(h)
            again = await stranger.post("/api/notify/act", json={"token": token, "choice": "Later"})
    assert shown["url"] == f"/#asks/{qid}"
    assert shown["actions"] == [{"action": "0", "title": "Yes"}, {"action": "1", "title": "Later"},
                                {"action": "reply", "title": "Reply"}]
    assert (forged.status_code, wrong.status_code) == (403, 422), (forged.text, wrong.text)
    assert pressed.status_code == 200, pressed.text
    assert result["answers"] == {"Deploy to staging now?": "Yes"}  # what the CLI's tool returned
    assert tables.row(db.admin_dsn, "questions", qid, "status", "answered_by") == ("answered", "notification (web push)")
    assert again.status_code == 409 and again.json()["answered_by"] == "notification (web push)"
    # stored hashed: the token itself is nowhere in the store
    stored = tables.rows(db.admin_dsn, "notification_actions", "token_sha256", "channel", "used_choice",
                         order=("created_at",), question_id=qid)
    assert [(bytes(s), c, u) for s, c, u in stored] == [(hashlib.sha256(token.encode()).digest(), "push", "Yes")]


async def test_a_button_pressed_after_the_page_answered_is_refused_naming_who_answered(db: DB, tmp_path: Path) -> None:
    with StandIn() as push, ScriptedModelServer(_asking()) as model:
        phone = Subscriber(f"{push.url}/push/phone-1")
        async with running_executor(db, model, tmp_path, notify_config=_loopback_push(tmp_path)) as h, \
                ingress_server(db.ingress_dsn, push_allow_loopback=True) as url, \
                httpx.AsyncClient(base_url=url) as http:
            await _subscribe(http, phone)
            await http.post("/api/chat", json={"text": "ship it"})
            shown = phone.decrypt((await asyncio.to_thread(push.wait_for, 1))[0].body)
            on_page = await http.post(f"/api/asks/{shown['question_id']}/answer",
                                      json={"answers": {"Deploy to staging now?": "Later"}})
            late = await http.post("/api/notify/act", json={"token": shown["token"], "choice": "Yes"})
            result = await _tool_result(h)
    assert on_page.status_code == 200, on_page.text
    assert late.status_code == 409 and late.json()["answered_by"] == "open", late.text  # the page's (open mode)
    assert result["answers"] == {"Deploy to staging now?": "Later"}
    assert tables.rows(db.admin_dsn, "notification_actions", "used_at", order=("created_at",)) == [(None,)]


async def test_an_expired_button_is_refused_and_changes_nothing(db: DB, tmp_path: Path) -> None:
    with StandIn() as push, ScriptedModelServer(_asking()) as model:
        phone = Subscriber(f"{push.url}/push/phone-1")
        async with running_executor(db, model, tmp_path, notify_config=_loopback_push(tmp_path)), \
                ingress_server(db.ingress_dsn, push_allow_loopback=True) as url, \
                httpx.AsyncClient(base_url=url) as http:
            await _subscribe(http, phone)
            await http.post("/api/chat", json={"text": "ship it"})
            shown = phone.decrypt((await asyncio.to_thread(push.wait_for, 1))[0].body)
            tables.update_all(db.admin_dsn, "notification_actions", {"question_id": shown["question_id"]},
                              expires_at=tables.from_now(seconds=-1))
            expired = await http.post("/api/notify/act", json={"token": shown["token"], "choice": "Yes"})
    assert expired.status_code == 410, expired.text
    assert tables.row(db.admin_dsn, "questions", shown["question_id"], "status") != ("answered",)
    assert tables.rows(db.admin_dsn, "notification_actions", "used_at", order=("created_at",)) == [(None,)]


async def test_a_multi_select_question_is_pushed_without_buttons_or_a_token(db: DB, tmp_path: Path) -> None:
    open_question = {"question": "Which environments?", "header": "Envs", "multiSelect": True,
                     "options": [{"label": "staging", "description": ""}, {"label": "prod", "description": ""}]}
    with StandIn() as push, ScriptedModelServer(_asking(open_question)) as model:
        phone = Subscriber(f"{push.url}/push/phone-1")
        async with running_executor(db, model, tmp_path, notify_config=_loopback_push(tmp_path)), \
                ingress_server(db.ingress_dsn, push_allow_loopback=True) as url, \
                httpx.AsyncClient(base_url=url) as http:
            await _subscribe(http, phone)
            await http.post("/api/chat", json={"text": "ship it"})
            shown = phone.decrypt((await asyncio.to_thread(push.wait_for, 1))[0].body)
    assert shown["body"] == "Which environments?" and shown["url"].startswith("/#asks/")
    assert "actions" not in shown and "token" not in shown  # its answer needs the page
    assert tables.count(db.admin_dsn, "notification_actions") == 0


def _ntfy(tmp_path: Path, url: str, token: str | None) -> NotifyConfig:
    return NotifyConfig(data_dir=tmp_path / "var", ntfy_url=f"{url}/petal-topic",
                        ntfy_token=SecretStr(token) if token else None, public_url="https://petal.example/")


async def test_ntfy_s_buttons_answer_through_the_ingress_on_a_topic_that_needs_a_token(db: DB, tmp_path: Path) -> None:
    with StandIn(statuses=[200]) as ntfy, ScriptedModelServer(_asking()) as model:
        async with running_executor(db, model, tmp_path, notify_config=_ntfy(tmp_path, ntfy.url, "tk_secret")) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            await http.post("/api/chat", json={"text": "ship it"})
            got = (await asyncio.to_thread(ntfy.wait_for, 1))[0]
            actions = json.loads(got.headers["actions"])
            # the ntfy app sends an http action as given (here to the test's ingress, not petal.example)
            pressed = await http.post("/api/notify/act", content=actions[0]["body"], headers=actions[0]["headers"])
            answers = (await _tool_result(h))["answers"]
    assert [(a["action"], a["label"]) for a in actions] == [("http", "Yes"), ("http", "Later"), ("view", "Reply")]
    assert actions[0]["url"] == "https://petal.example/api/notify/act" and actions[0]["method"] == "POST"
    assert actions[2]["url"] == got.headers["click"] and got.headers["click"].startswith("https://petal.example/#asks/")
    assert pressed.status_code == 200, pressed.text
    assert answers == {"Deploy to staging now?": "Yes"}
    assert tables.rows(db.admin_dsn, "notification_actions", "channel", "used_choice", order=("created_at",)) == [
        ("ntfy", "Yes")]
    assert tables.row(db.admin_dsn, "questions", actions[2]["url"].rsplit("/", 1)[1], "answered_by") == (
        "notification (ntfy)",)


async def test_ntfy_on_an_open_topic_gets_no_buttons_only_the_link_to_the_card(db: DB, tmp_path: Path) -> None:
    with StandIn(statuses=[200]) as ntfy, ScriptedModelServer(_asking()) as model:
        async with running_executor(db, model, tmp_path, notify_config=_ntfy(tmp_path, ntfy.url, None)), \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            await http.post("/api/chat", json={"text": "ship it"})
            got = (await asyncio.to_thread(ntfy.wait_for, 1))[0]
    assert "actions" not in got.headers and got.headers["click"].startswith("https://petal.example/#asks/")
    assert tables.count(db.admin_dsn, "notification_actions") == 0  # no token minted for what cannot carry it


async def test_a_gate_card_allowed_from_its_notification_runs_its_command_once_under_its_receipt(
    db: DB, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    (work / "sentinel").write_text("x")
    scenario = one_worker("gated run", {"tool_use": {"name": "Bash", "input": {"command": "rm -f sentinel"}}},
                          {"text": "done"})
    with StandIn() as push, ScriptedModelServer(scenario) as model:
        phone = Subscriber(f"{push.url}/push/phone-1")
        async with running_executor(db, model, tmp_path, notify_config=_loopback_push(tmp_path)) as h, \
                ingress_server(db.ingress_dsn, push_allow_loopback=True) as url, \
                httpx.AsyncClient(base_url=url) as http:
            await _subscribe(http, phone)
            thread = await _approved(http)  # the dispatch card, answered on the page
            pushes = await asyncio.to_thread(push.wait_for, 2)
            shown = [phone.decrypt(p.body) for p in pushes]
            card = next(s for s in shown if "rm -f sentinel" in s["body"])
            pressed = await http.post("/api/notify/act", json={"token": card["token"], "choice": "Allow once"})
            worker = await until(lambda: _worker(h), "the worker")
            assert worker is not None
            await h.wait_final(worker["id"], timeout=120)
            again = await http.post("/api/notify/act", json={"token": card["token"], "choice": "Allow once"})
            receipts = (await http.get("/api/receipts", params={"thread": thread})).text.splitlines()
            events = await h.events(worker["id"])
    assert [a["title"] for a in card["actions"]] == ["Allow once", "Deny", "Reply"]
    assert pressed.status_code == 200, pressed.text
    assert again.status_code == 409  # the second press: the card is settled, nothing runs again
    assert not (work / "sentinel").exists()
    decided = [(e.payload["decision"], e.payload["decided_by"], e.payload.get("answered_by")) for e in events
               if e.event_type == "gate.decided"]
    assert decided == [("allow", "user", "notification (web push)")]
    ran = [b for e in events if e.event_type == "stream.assistant" for b in e.payload["message"]["content"]
           if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") == "Bash"]
    assert len(ran) == 1  # the command ran once
    gate = json.loads(receipts[-1])
    assert (gate["kind"], gate["answered_by"], gate["matched"], gate["ran"]["matches_approved"]) == (
        "gate", "notification (web push)", True, True)
