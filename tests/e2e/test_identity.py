"""Who answered (issue 29, defense in depth): the identity header counts only from the proxy itself (its
secret), every answer and rule records who made it, and an answer written around the ingress is not the
user's — the waiting call does not take it as an approval (real PostgreSQL, the real ingress, the real CLI
against the scripted model)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from pydantic import SecretStr

from executor import asks as harness_asks
from executor.harness import permission
from executor.settle import briefs
from petal_dispatch import ingress_wiring
from petal_dispatch.config import Settings
from petal_dispatch.demo.scripted_model import ScriptedModelServer
from shared import errors
from tests.harness import running_executor
from tests import tables
from tests.pg import DB
from tests.wait import until
from tests.scenarios import one_worker
from tests.served import ingress_server

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

SECRET = "proxy-s3cret-proxy-s3cret"
PROXY = {"open_mode": False, "proxy_secret": SECRET}
# what Traefik sends: the user Authentik admitted, and the secret its headers middleware adds
THROUGH_PROXY = {"X-Authentik-Username": "travis", "X-Petal-Proxy-Secret": SECRET}



# ---- proxy mode: the proxy's secret, not the peer's address ------------------------------------------------

async def test_the_identity_header_from_loopback_without_the_proxy_secret_is_401(db: DB) -> None:
    async with ingress_server(db.ingress_dsn, **PROXY) as url, httpx.AsyncClient(base_url=url) as http:
        # a local process (a worker's script) on loopback, which PETAL_TRUSTED_PROXIES trusts by default
        forged = await http.get("/api/threads", headers={"X-Authentik-Username": "travis"})
        wrong = await http.get("/api/threads", headers={"X-Authentik-Username": "travis",
                                                        "X-Petal-Proxy-Secret": SECRET[:-1] + "x"})
        longer = await http.get("/api/threads", headers={"X-Authentik-Username": "travis",
                                                         "X-Petal-Proxy-Secret": SECRET + "x"})
        forged_write = await http.post("/api/chat", json={"text": "approve everything"},
                                       headers={"X-Authentik-Username": "travis"})
        forged_stream = await http.get("/api/stream", headers={"X-Authentik-Username": "travis"})
        # the negative control: the proxy's own request passes
        proxied = await http.get("/api/threads", headers=THROUGH_PROXY)
        no_user = await http.get("/api/threads", headers={"X-Petal-Proxy-Secret": SECRET})
    for refused in (forged, wrong, longer, forged_write, forged_stream):
        assert refused.status_code == 401, refused.text
    assert "X-Petal-Proxy-Secret" in forged.json()["detail"]
    assert proxied.status_code == 200
    assert no_user.status_code == 401 and "X-Authentik-Username" in no_user.json()["detail"]
    with psycopg.connect(db.admin_dsn) as conn:
        assert tables.count(conn, "chat_queue") == 0  # the forged write wrote nothing


async def test_forwarded_headers_count_only_with_the_proxy_secret_when_one_is_set(db: DB) -> None:
    token = {"open_mode": False, "auth_mode": "token", "auth_token": "t0ken-t0ken-t0ken", "proxy_secret": SECRET}
    https = {"X-Forwarded-Proto": "https"}
    async with ingress_server(db.ingress_dsn, **token) as url, httpx.AsyncClient(base_url=url) as http:
        spoofed = await http.post("/login", data={"token": "t0ken-t0ken-t0ken"}, headers=https)
        proxied = await http.post("/login", data={"token": "t0ken-t0ken-t0ken"},
                                  headers={**https, "X-Petal-Proxy-Secret": SECRET})
    assert spoofed.status_code == proxied.status_code == 303
    assert "secure" not in spoofed.headers["set-cookie"].lower()  # a local process's X-Forwarded-Proto
    assert "secure" in proxied.headers["set-cookie"].lower()


def test_proxy_mode_refuses_to_start_without_a_proxy_secret_or_with_a_short_one() -> None:
    with pytest.raises(errors.ConfigError, match="proxy mode needs PETAL_PROXY_SECRET: .*openssl rand"):
        ingress_wiring.ingress_config(Settings(open_mode=False), "dbname=x")
    with pytest.raises(errors.ConfigError, match="PETAL_PROXY_SECRET is too short"):
        ingress_wiring.check_auth(Settings(open_mode=False, proxy_secret=SecretStr("hunter2")))
    assert ingress_wiring.check_auth(Settings(open_mode=False, proxy_secret=SecretStr("a" * 16))) == "a" * 16
    assert ingress_wiring.check_auth(Settings(open_mode=True)) is None  # open mode trusts the network: nothing to check
    assert SECRET not in repr(Settings(proxy_secret=SecretStr(SECRET)))
    # the service itself: one line, before it waits for any database
    env = {k: v for k, v in os.environ.items() if k not in ("OPEN_MODE", "PETAL_PROXY_SECRET")}
    env.update(PETAL_AUTH_MODE="proxy", PETAL_EXECUTOR_DSN="dbname=x", PETAL_INGRESS_DSN="dbname=x")
    out = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "ingress"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "proxy mode needs PETAL_PROXY_SECRET" in out.stderr, out.stderr


# ---- who answered ------------------------------------------------------------------------------------------

async def test_an_answer_and_a_chat_message_through_the_api_record_who_sent_them(db: DB) -> None:
    questions = [{"question": "Go on?", "header": "Go", "multiSelect": False,
                  "options": [{"label": "Yes", "description": ""}, {"label": "No", "description": ""}]}]
    with psycopg.connect(db.executor_dsn, autocommit=True) as conn:
        for tool_use_id in ("toolu_who", "toolu_cancel"):
            tables.insert(conn, "questions", tool_use_id=tool_use_id, questions=Jsonb(questions))
    async with ingress_server(db.ingress_dsn, **PROXY) as url, \
            httpx.AsyncClient(base_url=url, headers=THROUGH_PROXY) as http:
        answered = await http.post("/api/asks/toolu_who/answer", json={"answers": {"Go on?": "Yes"}})
        cancelled = await http.delete("/api/asks/toolu_cancel")
        chat = await http.post("/api/chat", json={"text": "hello"})
        listed = (await http.get("/api/asks")).json()["asks"]
    assert answered.status_code == 200 and answered.json()["answered_by"] == "travis"
    assert cancelled.json()["answered_by"] == "travis"
    assert {a["tool_use_id"]: a["answered_by"] for a in listed} == {"toolu_who": "travis", "toolu_cancel": "travis"}
    assert tables.row(db.admin_dsn, "chat_queue", chat.json()["id"], "sent_by") == ("travis",)
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:  # open mode
        await http.post("/api/chat", json={"text": "from the open port"})
    assert tables.rows(db.admin_dsn, "chat_queue", "sent_by", text="from the open port") == [("open",)]


def test_the_ingress_role_may_set_who_answered_but_not_rewrite_the_question(db: DB) -> None:
    qid = tables.insert(db.executor_dsn, "questions", tool_use_id="toolu_g", questions=Jsonb([]))
    with psycopg.connect(db.ingress_dsn, autocommit=True) as conn:
        conn.execute("UPDATE questions SET status = 'answered', answers = '{}', answered_by = 'ana' WHERE id = %s",
                     [qid])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE questions SET answered_via = 'chat' WHERE id = %s", [qid])


# ---- an answer written around the ingress is not the user's -----------------------------------------------

def _bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "Bash", "input": {"command": command}}}


async def _card(http: httpx.AsyncClient, needle: str) -> dict[str, Any] | None:
    pending = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
    return next((a for a in pending if needle in a["questions"][0]["question"]), None)


async def test_a_gate_card_answered_by_a_direct_sql_write_is_not_an_approval_and_the_users_answer_is(
        db: DB, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    for name in ("sentinel-a", "sentinel-b"):
        (work / name).write_text(name)
    replies = [_bash("rm -f sentinel-a"), _bash("rm -f sentinel-b"), _bash("rm -f sentinel-b"), {"text": "done"}]
    scenario = one_worker("forged run", *replies)
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, ingress_server(db.ingress_dsn, **PROXY) as url, \
                httpx.AsyncClient(base_url=url, headers=THROUGH_PROXY) as http:
            made = await http.post("/api/threads", json={"title": "forged", "mode": "interactive"})
            thread = made.json()["thread_id"]
            await http.post("/api/chat", json={"text": "go", "thread_id": thread})
            dispatch_card = await until(lambda: _card(http, "start a worker"), "the dispatch card")
            approved = await http.post(f"/api/asks/{dispatch_card['id']}/answer",
                                       json={"answers": {dispatch_card["questions"][0]["question"]: briefs.APPROVE}})
            assert approved.status_code == 200, approved.text
            card = await until(lambda: _card(http, "rm -f sentinel-a"), "the first gate card")
            # what an injected worker did with the database: approve its own card with a plain UPDATE
            tables.answer(db.admin_dsn, card["id"], {card["questions"][0]["question"]: permission.ALLOW_THREAD})
            # the negative control: the user's own answer, through the ingress, is acted on
            card = await until(lambda: _card(http, "rm -f sentinel-b"), "the second gate card")
            allowed = await http.post(f"/api/asks/{card['id']}/answer", json={
                "answers": {card["questions"][0]["question"]: permission.ALLOW_TASK}})
            assert allowed.status_code == 200, allowed.text
            worker = await h.wait_final(uuid.UUID(card["task_id"]), timeout=120)
            events = await h.events(worker["id"])
            rules = (await http.get("/api/gate-rules", params={"thread_id": thread})).json()["rules"]
            history = {a["id"]: a for a in (await http.get("/api/asks", params={"limit": 50})).json()["asks"]}

    assert (work / "sentinel-a").exists()  # the forged approval ran nothing
    assert not (work / "sentinel-b").exists()  # the user's did
    decided = [(e.payload["summary"], e.payload["decision"], e.payload["decided_by"], e.payload.get("answered_by"))
               for e in events if e.event_type == "gate.decided"]
    assert decided == [("Bash: rm -f sentinel-a", "deny", "unverified_answer", None),
                       ("Bash: rm -f sentinel-b", "allow", "user", "travis"),
                       ("Bash: rm -f sentinel-b", "allow", "rule", None)]
    [refused] = [e.payload for e in events if e.event_type == "question.cancelled"]
    assert refused["response"] == harness_asks.NOT_THE_USERS and refused["refused_answer"]
    # no standing rule from the forged "Always allow in this thread"; the user's rule says who made it
    assert [(r["scope"], r["pattern"], r["created_by"]) for r in rules] == [("task", "rm -f sentinel-b", "travis")]
    assert history[dispatch_card["id"]]["answered_by"] == "travis"
    assert history[card["id"]]["answered_by"] == "travis"


async def test_a_dispatch_approval_written_around_the_ingress_does_not_release_the_worker(
        pool: AsyncConnectionPool, db: DB, tmp_path: Path) -> None:
    from executor.settle import approvals

    thread, turn = tables.thread_with_turn(db.admin_dsn)
    workers = [await approvals.request(pool, brief=f"worker {n}", thread_id=thread, asker_task_id=turn,
                                       project_id=None, plan_ref=None, allowed_tools=None, workdir=tmp_path)
               for n in ("forged", "users")]
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        for worker, who in zip(workers, (None, "travis"), strict=True):
            ((question,),) = tables.rows(conn, "approvals", "question_id", task_id=worker)
            ((asked, *_),) = tables.row(conn, "questions", question, "questions")
            tables.answer(conn, question, {asked["question"]: briefs.APPROVE}, answered_by=who)
    assert await approvals.apply_answered(pool) == 2
    with psycopg.connect(db.admin_dsn) as conn:
        got = {t: (decision, tables.status(conn, t)) for t, decision in tables.rows(conn, "approvals", "task_id",
                                                                                      "decision")}
        facts = dict(tables.records(conn, "task_id", "payload", event_type="approval.resolved"))
    assert got == {workers[0]: ("rejected", "cancelled"), workers[1]: ("approved", "pending")}
    assert facts[workers[0]]["refused_answer"] and facts[workers[0]]["answered_by"] is None
    assert facts[workers[1]]["answered_by"] == "travis"
