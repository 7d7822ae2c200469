"""Worker isolation end to end: a worker of an autonomous thread runs a hostile script planted in its tree
(tests/data/attack.py) while a sibling spawn runs, and reads the data directory with its own Grep tool. Sandboxed,
every channel is shut and the script still ran; with the sandbox off (the negative control), the same channels
are open — so the test can fail. What the attack reaches for is the test's own (a decoy process holding a secret,
a listening port and socket standing for a database), so both outcomes hold whatever else the machine runs. Real
PostgreSQL, the real CLI, the scripted model, the real ingress."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from psycopg.conninfo import conninfo_to_dict

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests import tables
from tests.harness import Harness, running_executor
from tests.pg import DB
from tests.wait import until, until_blocking
from tests.scenarios import STALL_FOREVER, one_worker
from tests.served import ingress_server

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

ATTACK = Path(__file__).parents[1] / "data" / "attack.py"
# a system PostgreSQL's sockets, where the machine has one: tried too, but the negative control judges the channel
# by the test's own socket (_listeners), not by what the machine happens to run
SYSTEM_PG_SOCKETS = ["/run/postgresql/.s.PGSQL.5432", "/var/run/postgresql/.s.PGSQL.5432"]


@contextlib.contextmanager
def _decoy() -> Iterator[tuple[int, str]]:
    """A process of the test's own holding a secret in its environment (as PETAL_AUTH_TOKEN, what the attack looks
    for in every process) and in its argv: the reach into other processes is judged by it, whatever else the
    machine runs (another service's token would be found, and used, too)."""
    secret = f"decoy-{uuid.uuid4().hex}"
    lives = "import time; time.sleep(3600)"  # not a wait: the decoy lives until the test ends it
    proc = subprocess.Popen([sys.executable, "-c", lives, secret],
                            env={"PATH": os.environ["PATH"], "PETAL_AUTH_TOKEN": secret})
    try:
        # exec'd: until then its /proc holds the forked test's argv and environment
        until_blocking(lambda: secret.encode() in Path(f"/proc/{proc.pid}/cmdline").read_bytes(), "the decoy", 30)
        yield proc.pid, secret
    finally:
        proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def _listeners() -> Iterator[tuple[int, str]]:
    """A loopback TCP port and a Unix socket of the test's own, listening (the kernel completes a connection to
    either without an accept): what the attack tries for a database, so neither answer depends on whether the
    machine runs a PostgreSQL of its own on 5432 (the test's embedded server listens on a Unix socket only)."""
    with socket.socket() as tcp, socket.socket(socket.AF_UNIX) as unix, tempfile.TemporaryDirectory() as d:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(8)
        path = os.path.join(d, ".s.PGSQL.5432")
        unix.bind(path)
        unix.listen(8)
        yield tcp.getsockname()[1], path


def _tool(name: str, **input: Any) -> dict[str, Any]:
    return {"tool_use": {"name": name, "input": input}}


async def _worker(h: Harness, brief: str) -> dict[str, Any] | None:
    cur = await (await h._conn()).execute("SELECT id FROM tasks WHERE brief LIKE %s LIMIT 1", [f"%{brief}%"])
    row = await cur.fetchone()
    return await h.task(row[0]) if row else None


def _tool_results(events: list[Any]) -> list[str]:
    out = []
    for e in events:
        content = (e.payload.get("message") or {}).get("content") if e.event_type == "stream.user" else None
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                out.append(json.dumps(block.get("content")))
    return out


async def _attack(db: DB, tmp: Path, *, sandboxed: bool) -> dict[str, Any]:
    work = tmp / "work"
    work.mkdir(parents=True)
    shutil.copy(ATTACK, work / "attack.py")
    mcp_dir = tmp / "run" / "mcp"
    scenario = one_worker(
        "attack run",
        _tool("Bash", command="python3 attack.py"),
        _tool("Grep", pattern="Bearer", path=str(mcp_dir), output_mode="content"),
        _tool("Read", file_path="/proc/self/environ"),
        _tool("Read", file_path=str(tmp / "claude-config" / "settings.json")),
        {"text": "done"},
        before=[Rule(role="worker", match="sibling", replies=[STALL_FOREVER])])  # the sibling dispatched directly
    pg = conninfo_to_dict(db.admin_dsn)
    extra: dict[str, Any] = {} if sandboxed else {"sandbox": None}  # Any: running_executor's **config_kw
    with _decoy() as (decoy_pid, decoy_secret), _listeners() as (db_tcp_port, db_socket), \
            ScriptedModelServer(scenario) as model:
        # the test's own socket, its database's when that is a socket, then the machine's
        sockets = [db_socket, *SYSTEM_PG_SOCKETS]
        if str(pg.get("host", "")).startswith("/"):
            sockets.insert(1, f"{pg['host']}/.s.PGSQL.{pg.get('port', 5432)}")
        async with running_executor(db, model, tmp, **extra) as h, ingress_server(db.ingress_dsn) as url, \
                httpx.AsyncClient(base_url=url) as http:
            # the sibling runs (its MCP config and process exist) for as long as the attack does
            sibling_id = await h.dispatch("a sibling with a secret brief: the launch code is 0000")
            sibling = await h.wait_task(sibling_id, lambda r: r["pid"] is not None and r["status"] == "running")
            await h.wait_event(sibling_id, "stream.system.init")
            made = await http.post("/api/threads", json={"title": "attack", "mode": "autonomous"})
            thread_id = made.json()["thread_id"]
            (work / "targets.json").write_text(json.dumps({
                "outside": str(tmp / "outside" / "pwned"),
                "ingress_port": httpx.URL(url).port, "thread_id": thread_id,
                "db_tcp_port": db_tcp_port, "pg_sockets": sockets, "decoy_pid": decoy_pid,
                "sibling_mcp_config": str(mcp_dir / f"mcp-{sibling_id}.json"),
                "sibling_pid": sibling["pid"], "data_dir": str(tmp / "run"),
                "terminal_socket": str(tmp / "run" / "terminals.sock"),
                "terminal_socket_real": os.path.realpath(tmp / "run" / "terminals.sock"),
                "claude_config": str(tmp / "claude-config"),
            }))
            await http.post("/api/chat", json={"text": "run the attack", "thread_id": thread_id})
            worker = await until(lambda: _worker(h, "attack run"), "the attack worker", timeout=120)
            final = await h.wait_final(worker["id"], timeout=120)
            events = await h.events(worker["id"])
            ready = (await http.get("/readyz")).status_code
            info = (await http.get("/api/info")).json()
            injected = [text for (text,) in tables.rows(db.admin_dsn, "chat_queue", "text",
                                                        text=tables.Like("injected%"))]
    report_path = work / "attack-report.json"
    return {"final": final, "events": events, "ready": ready, "info": info, "injected": injected, "tmp": tmp,
            "report": json.loads(report_path.read_text()) if report_path.exists() else None, "sibling": str(sibling_id), "sibling_session": str(sibling["session_id"]),
            "sockets": sockets, "own_sockets": sockets[:len(sockets) - len(SYSTEM_PG_SOCKETS)],
            "decoy_secret": decoy_secret}


async def test_a_sandboxed_worker_reaches_nothing_but_its_own_tree(db: DB, tmp_path: Path) -> None:
    got = await _attack(db, tmp_path, sandboxed=True)
    report = got["report"]
    assert report is not None and report["ran"], "the script did not run: the sandbox must keep the tree usable"
    # its two denied reads are listed: the run ends gated, not success
    assert got["final"]["status"] == "gated" and got["final"]["status_reason"] == "permission_denials"
    # no capability, no mount, the kernel's knobs read-only (bubblewrap run by root keeps root's otherwise)
    assert int(report["capabilities"]["value"], 16) == 0
    assert report["kernel_knobs"]["value"] == {"/proc/sys/kernel/core_pattern": False, "/proc/sysrq-trigger": False}
    assert report["mount"]["value"] is False
    # nothing written outside the tree, whatever the script believed; nor in its gateway's sockets directory
    assert not (tmp_path / "outside" / "pwned").exists()
    assert not report["gateway_dir_write"]["ok"] and "Read-only" in report["gateway_dir_write"]["error"]
    # the ingress: no connection, no message, no token found
    assert not report["ingress_tcp"]["ok"] and not report["ingress_chat_open"]["ok"]
    assert report["tokens"]["value"] == [] and "ingress_chat_token" not in report
    assert not report["ingress_via_proxy"]["ok"] and "403" in report["ingress_via_proxy"]["error"]
    assert got["injected"] == []
    # the database: neither TCP nor any socket
    assert not report["postgres_tcp"]["ok"]
    assert all(not report[f"postgres_unix_{i}"]["ok"] for i in range(len(got["sockets"])))
    # nor the executor's terminal sessions (whoever connects there can type into a user's session)
    assert not report["terminal_socket"]["ok"] and not report["terminal_socket_real"]["ok"]
    # the sibling: its credential, its argv and environment, its very process are out of sight
    assert not report["sibling_mcp_config"]["ok"]
    assert not report["sibling_cmdline"]["ok"] and not report["sibling_environ"]["ok"]
    # nor is any other process of the machine (the test's decoy holds a secret in its argv and environment)
    assert not report["decoy_cmdline"]["ok"]
    # of the data directory, it sees its own MCP config and nothing else
    assert report["data_dir_listing"]["value"] == [str(tmp_path / "run" / "mcp" / f"mcp-{got['final']['id']}.json")]
    # of the CLI's conversations, only its own (the sibling runs in the same directory)
    assert report["conversations"]["value"] == [f"{got['final']['session_id']}.jsonl"]
    # only the sandbox's own processes are visible (its init, the forwarders, the CLI and the script's shell)
    assert all(p < 100 for p in report["processes"]["value"]), report["processes"]
    # the model's own Grep of the data directory finds its own credential, never the sibling's
    grep = _tool_results(got["events"])[1]
    assert str(got["final"]["id"]) in grep
    assert got["sibling"] not in grep
    # the CLI's own Read tool is denied /proc (its environment holds the API key) and its config directory
    environ, settings = _tool_results(got["events"])[2:4]
    assert "sk-ant-fake" not in environ and "denied" in environ.lower(), environ
    assert "denied" in settings.lower(), settings
    assert got["ready"] == 200
    assert got["info"]["workers_isolated"] is True and got["info"]["unsandboxed_executors"] == []


async def test_with_the_sandbox_off_the_same_channels_are_open(db: DB, tmp_path: Path) -> None:
    """The negative control: the same attack, unsandboxed, gets through — the assertions above can fail."""
    got = await _attack(db, tmp_path, sandboxed=False)
    report = got["report"]
    assert report is not None and report["ran"]
    assert (tmp_path / "outside" / "pwned").read_text() == "pwned"
    if os.geteuid() == 0:  # root unsandboxed: every capability, the kernel's knobs writable
        assert int(report["capabilities"]["value"], 16) != 0
        assert report["kernel_knobs"]["value"]["/proc/sys/kernel/core_pattern"] is True
    assert report["ingress_tcp"]["ok"] and report["ingress_chat_open"]["value"] == 202
    assert got["injected"].count("injected by the repository") == 1
    # another process's secrets: the test's decoy's token found in its environment, its argv read
    assert got["decoy_secret"] in report["tokens"]["value"]
    assert got["decoy_secret"] in report["decoy_cmdline"]["value"]
    # the opt-out is visible: the executor's own row says so, and /api/info (the page's banner) reads it
    assert got["info"]["workers_isolated"] is False and len(got["info"]["unsandboxed_executors"]) == 1
    assert report["postgres_tcp"]["ok"]  # the test's own listening port
    assert all(report[f"postgres_unix_{i}"]["ok"] for i in range(len(got["own_sockets"])))
    assert report["terminal_socket"]["ok"] and report["terminal_socket_real"]["ok"]
    assert "Bearer" in report["sibling_mcp_config"]["value"]
    assert "PETAL_TASK_ID" in report["sibling_environ"]["value"]
    assert f"{got['sibling_session']}.jsonl" in report["conversations"]["value"]
    # even unsandboxed, a brief never travels in argv
    assert "launch code" not in report["sibling_cmdline"]["value"]
    assert got["sibling"] in _tool_results(got["events"])[1]


# ---- what a sandboxed worker can still do ----------------------------------------------------------------

_TESTS = '''import unittest


class Calc(unittest.TestCase):
    def test_adds(self):
        self.assertEqual(1 + 1, 2)
'''
# a download through the sandbox's proxy (the proxy variables are the sandbox's own)
_FETCH = '''import sys, urllib.request
url, out = sys.argv[1], sys.argv[2]
try:
    with urllib.request.urlopen(url, timeout=10) as res:
        open(out, "wb").write(res.read())
    print("fetched", url)
except Exception as exc:
    print("refused", url, exc)
'''
# what a hostile repository would do to the project's repository through git's files
_GIT_ATTACK = '''import subprocess, pathlib, sys
marker = sys.argv[1]
run = lambda *a: subprocess.run(list(a), check=True, capture_output=True, text=True).stdout.strip()
common = pathlib.Path(run("git", "rev-parse", "--git-common-dir"))
gitdir = pathlib.Path(run("git", "rev-parse", "--git-dir"))
# a nested repository whose own config runs a command when the executor's git status recurses into it
ident = ["-c", "user.name=A", "-c", "user.email=a@example.invalid"]
run("git", "init", "-q", "sub")
run("git", "-C", "sub", "config", "core.fsmonitor", f"touch {marker}")
run("git", "-C", "sub", *ident, "commit", "-q", "--allow-empty", "-m", "x")
run("git", "update-index", "--add", "--cacheinfo", f"160000,{run('git', '-C', 'sub', 'rev-parse', 'HEAD')},sub")
pathlib.Path("left-uncommitted.txt").write_text("for the executor to commit")
for what, fn in [
    ("point HEAD at main", lambda: (gitdir / "HEAD").write_text("ref: refs/heads/main\\n")),
    ("plant alternates", lambda: (common / "objects" / "info" / "alternates").write_text("/nonexistent\\n")),
    ("move main", lambda: subprocess.run(["git", "update-ref", "refs/heads/main", "HEAD"], check=True, capture_output=True)),
    ("plant a hook", lambda: (common / "hooks" / "post-merge").write_text("#!/bin/sh\\ntouch /tmp/owned\\n")),
    ("set fsmonitor", lambda: subprocess.run(["git", "config", "core.fsmonitor", "touch /tmp/owned"], check=True, capture_output=True)),
    ("relink the worktree", lambda: pathlib.Path(".git").write_text("gitdir: /tmp/evil\\n")),
]:
    try:
        fn()
        print("DONE", what)
    except Exception as exc:
        print("REFUSED", what, type(exc).__name__)
'''


class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _file_server(root: Path) -> Iterator[int]:
    """A plain HTTP server on 127.0.0.2 (loopback, but not an address the sandbox forwards): the stand-in for
    an allowlisted registry."""
    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), functools.partial(_Files, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


async def test_a_sandboxed_worker_still_tests_commits_and_downloads_from_the_allowlist(db: DB, tmp_path: Path
                                                                                      ) -> None:
    roots = tmp_path / "roots"
    repo = roots / "repo"
    repo.mkdir(parents=True)
    files = {"test_calc.py": _TESTS, "fetch.py": _FETCH, "gitattack.py": _GIT_ATTACK}
    for name, text in files.items():
        (repo / name).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=T", "-c", "user.email=t@example.invalid"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "start"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    main_before = subprocess.run([*git, "rev-parse", "main"], check=True, capture_output=True, text=True).stdout
    served = tmp_path / "served"
    served.mkdir()
    (served / "pkg.txt").write_text("a package\n")
    with _file_server(served) as port, _file_server(served) as other:
        replies = [
            _tool("Bash", command="python3 -m unittest -q 2>&1"),
            _tool("Bash", command=f"python3 fetch.py http://127.0.0.2:{port}/pkg.txt pkg.txt"),
            _tool("Bash", command=f"python3 fetch.py http://127.0.0.2:{other}/pkg.txt other.txt"),
            _tool("Bash", command=f"python3 gitattack.py {tmp_path / 'fsmonitor-ran'}"),
            _tool("Bash", command="git add pkg.txt && git -c user.name=W -c user.email=w@example.invalid "
                                  "commit -qm 'add the package' && git log --oneline | head -1"),
            {"text": "done"}]
        scenario = Scenario(rules=[Rule(role="worker", match="use the tree", replies=replies)])
        with ScriptedModelServer(scenario) as model:
            async with running_executor(db, model, tmp_path, project_roots=(roots,)) as h, \
                    ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http_client:
                # the project widens its workers' allowlist by its "registry" (the operator's list is empty)
                made = await http_client.post("/api/projects", json={
                    "slug": "tree", "workdir": str(repo), "sandbox_allow": [f"127.0.0.2:{port}"]})
                request_id = made.json()["id"]
                project = await until(lambda: _project_done(http_client, request_id), "the project")
                bad = await http_client.post("/api/projects", json={
                    "slug": "bad", "workdir": str(repo), "sandbox_allow": ["registry.example.org:https"]})
                refused = await until(lambda: _request_ended(http_client, bad.json()["id"]), "the refusal")
                task_id = await h.dispatch("use the tree", project_id=uuid.UUID(project["result"]["project_id"]))
                final = await h.wait_task(task_id, lambda r: r["changes_recorded_at"] is not None
                                          and r["status"] not in ("pending", "running"), 120)
                events = await h.events(task_id)
    results = _tool_results(events)
    assert final["status"] == "success", results
    assert project["result"]["sandbox_allow"] == [f"127.0.0.2:{port}"]  # recorded with the project
    assert refused["status"] == "failed" and "registry.example.org:https" in refused["error"]
    assert "OK" in results[0] and "Ran 1 test" in results[0]
    assert "fetched" in results[1]
    assert "refused" in results[2] and "403" in results[2]
    assert all(f"REFUSED {what}" in results[3] for what in
               ("move main", "plant a hook", "set fsmonitor", "relink the worktree", "point HEAD at main",
                "plant alternates")), results[3]
    # the executor's own git, run after the worker in the tree it wrote, ran nothing the tree chose
    assert not (tmp_path / "fsmonitor-ran").exists()
    assert not (repo / ".git" / "objects" / "info" / "alternates").exists()
    assert "add the package" in results[4]
    changes = next(e.payload for e in events if e.event_type == "task.changes")
    assert "add the package" in [c["subject"] for c in changes["commits"]]
    assert "pkg.txt" in [f["path"] for f in changes["files"]]
    main_after = subprocess.run([*git, "rev-parse", "main"], check=True, capture_output=True, text=True).stdout
    assert main_after == main_before
    assert not (repo / ".git" / "hooks" / "post-merge").exists()


async def _project_done(http_client: httpx.AsyncClient, request_id: str) -> dict[str, Any] | None:
    row = (await http_client.get(f"/api/project-requests/{request_id}")).json()
    assert row["status"] != "failed", row
    return row if row["status"] == "done" else None


async def _request_ended(http_client: httpx.AsyncClient, request_id: str) -> dict[str, Any] | None:
    row = (await http_client.get(f"/api/project-requests/{request_id}")).json()
    return row if row["status"] in ("done", "failed") else None


async def test_the_clis_model_traffic_goes_through_the_sandboxs_proxy_when_its_api_is_not_on_loopback(
        db: DB, tmp_path: Path) -> None:
    """The production path: the model API is not a forwarded loopback port, so the CLI reaches it through the
    gateway's proxy (HTTPS_PROXY), which admits the API's host. A model on 127.0.0.2 stands in for it."""
    scenario = Scenario(rules=[Rule(role="worker", replies=[{"text": "through the proxy"}])])
    with ScriptedModelServer(scenario, host="127.0.0.2") as model:
        async with running_executor(db, model, tmp_path) as h:
            task_id = await h.dispatch("say it")
            final = await h.wait_final(task_id)
            events = await h.events(task_id)
    assert final["status"] == "success", [e.payload for e in events if e.event_type == "task.stderr"]
    assert any(e.event_type == "stream.assistant" for e in events)
    assert model.requests, "the model was never asked"


async def test_a_data_directory_with_a_long_path_still_spawns_sandboxed(db: DB, tmp_path: Path) -> None:
    """A Unix socket's path holds at most 108 bytes: the gateways' sockets live in a short directory of their
    own, not under the data directory."""
    deep = tmp_path / ("a-long-directory-name-" * 6) / ("and-another-one-" * 4)
    deep.mkdir(parents=True)
    with ScriptedModelServer(Scenario(rules=[Rule(role="worker", replies=[{"text": "fine"}])])) as model:
        async with running_executor(db, model, deep) as h:
            final = await h.wait_final(await h.dispatch("say it"))
    assert len(str(deep / "run")) > 108
    assert final["status"] == "success"


_PLANT_HOOK = '''import json, pathlib
pathlib.Path(".claude").mkdir(exist_ok=True)
hook = {"type": "command", "command": "touch hook-ran"}
pathlib.Path(".claude/settings.json").write_text(json.dumps({"hooks": {
    "SessionStart": [{"hooks": [hook]}], "UserPromptSubmit": [{"hooks": [hook]}]}}))
'''


async def test_settings_a_worker_plants_in_a_shared_directory_do_not_run_in_the_next_task(db: DB, tmp_path: Path
                                                                                          ) -> None:
    """Orchestrator turns and workers outside a project share a working directory: hooks one of them writes into
    its .claude/settings.json must not run in the next (they would run with that task's credential)."""
    work = tmp_path / "work"
    work.mkdir(parents=True)
    (work / "plant.py").write_text(_PLANT_HOOK)
    scenario = Scenario(rules=[
        Rule(role="worker", match="plant", replies=[_tool("Bash", command="python3 plant.py"), {"text": "planted"}]),
        Rule(role="worker", match="next", replies=[{"text": "next one done"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h:
            planted = await h.wait_final(await h.dispatch("plant the hooks"))
            following = await h.wait_final(await h.dispatch("the next task"))
    assert planted["status"] == "success" and (work / ".claude" / "settings.json").exists()
    assert following["status"] == "success"
    assert not (work / "hook-ran").exists()
