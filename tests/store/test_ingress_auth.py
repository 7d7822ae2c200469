from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest
from psycopg_pool import AsyncConnectionPool
from pydantic import SecretStr

from petal_dispatch import ingress_wiring
from petal_dispatch.config import Settings
from shared import errors, journal
from shared.models import NewEvent
from tests.pg import DB
from tests.served import collect, ingress_server

SECRET = "proxy-s3cret-proxy-s3cret"
PROXY = {"X-Petal-Proxy-Secret": SECRET}  # what the proxy adds to every request
USER = {"X-Authentik-Username": "travis"}


async def test_proxy_mode_needs_the_proxy_header_and_honours_the_allow_list(db: DB) -> None:
    async with ingress_server(db.ingress_dsn, open_mode=False, allowed_users="travis, ana", proxy_secret=SECRET) as url, \
            httpx.AsyncClient(base_url=url, headers=PROXY) as http:
        missing = await http.get("/api/threads")
        stranger = await http.get("/api/threads", headers={"X-Authentik-Username": "mallory"})
        allowed = await http.get("/api/threads", headers=USER)
        stream_denied = await http.get("/api/stream")
        health = await http.get("/healthz")
        post_denied = await http.post("/api/chat", json={"text": "x"})
    assert missing.status_code == 401 and "X-Authentik-Username" in missing.json()["detail"]
    assert stranger.status_code == 403
    assert allowed.status_code == 200
    assert stream_denied.status_code == 401
    assert health.status_code == 200
    assert post_denied.status_code == 401


async def test_token_mode_takes_a_bearer_token_or_the_login_cookie_which_also_opens_the_stream(
    db: DB, pool: AsyncConnectionPool
) -> None:
    async with ingress_server(db.ingress_dsn, open_mode=False, auth_mode="token", auth_token="s3cret-s3cret-s3cret") as url:
        async with httpx.AsyncClient(base_url=url) as http:
            wrong = await http.get("/api/threads", headers={"Authorization": "Bearer nope"})
            none = await http.get("/api/threads")
            page = await http.get("/", follow_redirects=False)
            bearer = await http.get("/api/threads", headers={"Authorization": "Bearer s3cret-s3cret-s3cret"})
            bad_login = await http.post("/login", data={"token": "nope"})
            bad_json = await http.post("/login", json={"token": "nope"})
            login = await http.post("/login", data={"token": "s3cret-s3cret-s3cret"}, follow_redirects=False)
        cookie = login.cookies.get("petal_session")
        async with httpx.AsyncClient(base_url=url, cookies={"petal_session": cookie or ""}) as http:
            with_cookie = await http.get("/api/threads")
            ready = asyncio.Event()
            reader = asyncio.create_task(collect(http, 2, ready=ready))
            await ready.wait()
            await journal.append(pool, [NewEvent("task.stderr", {"n": i}) for i in range(2)])
            streamed = await asyncio.wait_for(reader, 20)
    assert wrong.status_code == 401 and none.status_code == 401
    assert page.status_code == 303 and page.headers["location"] == "/login"
    assert bearer.status_code == 200
    # the browser's form gets the form back, saying so (a page of JSON left a phone with only its back button);
    # a JSON client, the problem
    assert bad_login.status_code == 401 and bad_login.headers["content-type"].startswith("text/html")
    assert "Wrong token: try again." in bad_login.text and 'name=token type=password' in bad_login.text
    assert bad_json.status_code == 401 and bad_json.json()["detail"] == "wrong token"
    assert login.status_code == 303 and cookie and cookie != "s3cret-s3cret-s3cret"
    set_cookie = login.headers["set-cookie"].lower()
    assert "httponly" in set_cookie and "samesite=strict" in set_cookie
    assert with_cookie.status_code == 200
    assert [e.id for e in streamed] == ["1", "2"]


async def test_open_mode_needs_no_credentials(db: DB) -> None:
    async with ingress_server(db.ingress_dsn, open_mode=True) as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/api/threads")).status_code == 200


def test_open_mode_on_a_non_loopback_address_refuses_to_start_unless_forced() -> None:
    with pytest.raises(errors.ConfigError, match="refusing open mode"):
        ingress_wiring.check_ingress_bind(Settings(open_mode=True, ingress_host="0.0.0.0"))
    ingress_wiring.check_ingress_bind(Settings(open_mode=True, ingress_host="0.0.0.0", force_open=True))
    ingress_wiring.check_ingress_bind(Settings(open_mode=True, ingress_host="127.0.0.1"))
    ingress_wiring.check_ingress_bind(Settings(open_mode=False, ingress_host="0.0.0.0", proxy_secret=SecretStr(SECRET)))

    env = {**os.environ, "OPEN_MODE": "1", "PETAL_INGRESS_HOST": "0.0.0.0", "PETAL_EXECUTOR_DSN": "dbname=x",
           "PETAL_INGRESS_DSN": "dbname=x"}
    out = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "ingress"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "refusing open mode" in out.stderr


def test_token_mode_without_a_token_refuses_to_start() -> None:
    with pytest.raises(errors.ConfigError, match="PETAL_AUTH_TOKEN"):
        ingress_wiring.ingress_config(Settings(auth_mode="token"), "dbname=x")


def test_token_mode_refuses_a_short_token() -> None:
    with pytest.raises(errors.ConfigError, match="PETAL_AUTH_TOKEN is too short"):
        ingress_wiring.ingress_config(Settings(auth_mode="token", auth_token=SecretStr("hunter2")), "dbname=x")
    ingress_wiring.ingress_config(Settings(auth_mode="token", auth_token=SecretStr("a" * 16)), "dbname=x")  # long enough: starts
