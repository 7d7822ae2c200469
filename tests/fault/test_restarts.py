"""What the user did survives restarts, and one data directory has one `up` (the real CLI, a scripted model)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from tests.harness import claude_bin
from tests.pg import DB
from tests.wait import until_blocking
from tests.served import free_port

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PETAL_EXECUTOR_DSN", "PETAL_INGRESS_DSN",
                                                            "OPEN_MODE")}
    env.update({"PETAL_CLAUDE_BIN": claude_bin(), "PETAL_LOG_FORMAT": "json", "HOME": str(tmp_path),
                "ANTHROPIC_API_KEY": "sk-ant-fake", **extra})  # a login: a start refuses without one
    return env


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def _send(url: str, body: dict[str, Any], method: str = "POST") -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"},
                                 method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def _log_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


class Up:
    """One `petal-dispatch up` on a data directory, its stderr in a log file."""

    def __init__(self, tmp_path: Path, data: Path, *args: str, log: str = "up.log", **env: str):
        self.port, self.mcp_port = free_port(), free_port()
        self.log = tmp_path / log
        cmd = [sys.executable, "-m", "petal_dispatch.cli", "up", *args, "--port", str(self.port), "--mcp-port",
               str(self.mcp_port), "--data-dir", str(data)]
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(cmd, env=_env(tmp_path, **env), stdout=subprocess.PIPE, stderr=out, text=True)
        self.base = f"http://127.0.0.1:{self.port}"
        line = self.proc.stdout.readline()  # type: ignore[union-attr]  # stdout=PIPE: never None
        assert f"{self.base}/" in line, f"{line!r}\n{self.log.read_text()[-3000:]}"

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(90)
        self.proc.stdout.close()  # type: ignore[union-attr]  # stdout=PIPE: never None
        return rc


def test_a_second_up_or_executor_on_a_data_directory_in_use_is_refused_naming_the_holder(tmp_path: Path) -> None:
    data = tmp_path / "var"
    first = Up(tmp_path, data, OPEN_MODE="1")
    try:
        port, mcp_port = free_port(), free_port()
        # told at once, before the checks: with a CLI that does not exist, the refusal still names the holder
        # (the checks would have refused the CLI first; they take seconds, the sandbox probe among them)
        second = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "up", "--demo", "--port", str(port),
                                 "--mcp-port", str(mcp_port), "--data-dir", str(data)],
                                env=_env(tmp_path, PETAL_CLAUDE_BIN=str(tmp_path / "no-such-claude")),
                                capture_output=True, text=True, timeout=60)
        bare = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "executor"], capture_output=True, text=True,
                              timeout=60, env=_env(tmp_path, PETAL_DATA_DIR=str(data), PETAL_MCP_PORT=str(free_port()),
                                                   PETAL_EXECUTOR_DSN="postgresql://nobody@127.0.0.1:1/none"))
        time.sleep(3)  # a window in which a crash-looping executor would be restarted (it must not be)
        threads = _get(f"{first.base}/api/threads")["threads"]
        assert _get(f"{first.base}/readyz")["status"] == "ready"
    finally:
        rc = first.stop()
    assert second.returncode != 0, second.stderr
    line = second.stderr.strip()
    assert "\n" not in line and f"pid {first.proc.pid}" in line and f"127.0.0.1:{first.port}" in line, line
    assert "in use" in line and str(data.resolve()) in line
    assert bare.returncode != 0 and "in use by `petal-dispatch executor`" in bare.stderr, bare.stderr
    assert threads == []  # the refused `up --demo` wrote nothing
    events = _log_events(first.log)
    assert not [e for e in events if e.get("event") in ("service_died", "service_restarted")]
    assert rc == 0


ASKING = {
    "rules": [
        {"role": "orchestrator", "replies": [
            {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [
                {"question": "Which way should it go?", "header": "Way", "multiSelect": False,
                 "options": [{"label": "Left", "description": ""}, {"label": "Right", "description": ""}]}]}}},
            {"text": "noted"}]},
    ],
    "default": {"text": "ok"},
}


def test_an_archived_thread_stays_archived_across_restarts_runs_nothing_and_its_question_is_closed(
        tmp_path: Path) -> None:
    data = tmp_path / "var"
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps(ASKING))
    args = ("--demo", "--scenario", str(scenario))
    up = Up(tmp_path, data, *args)
    try:
        thread = _send(f"{up.base}/api/threads", {"title": "to archive", "mode": "autonomous"})["thread_id"]
        _send(f"{up.base}/api/chat", {"text": "ask me", "thread_id": thread})
        asked = until_blocking(lambda: _get(f"{up.base}/api/asks?status=pending&thread_id={thread}")["asks"],
                               "the question", timeout=120)
        question = asked[0]["id"]
        _send(f"{up.base}/api/threads/{thread}", {"archived": True}, method="PATCH")
        until_blocking(lambda: not _get(f"{up.base}/api/asks?status=pending")["asks"], "the question closed",
                       timeout=30)
        until_blocking(lambda: all(t["status"] not in ("pending", "running")
                                   for t in _get(f"{up.base}/api/tasks?thread_id={thread}")["tasks"]),
                       "the turn stopped", timeout=60)
        turns = {t["id"] for t in _get(f"{up.base}/api/tasks?thread_id={thread}")["tasks"]}
    finally:
        assert up.stop() == 0
    for _ in range(2):
        up = Up(tmp_path, data, *args)
        try:
            time.sleep(4)  # a window for the new executor's settler and threads passes: they must not run the thread
            listed = {t["id"]: t for t in _get(f"{up.base}/api/threads")["threads"]}
            tasks = _get(f"{up.base}/api/tasks?thread_id={thread}")["tasks"]
            pending = _get(f"{up.base}/api/asks?status=pending")["asks"]
            history = {a["id"]: a for a in _get(f"{up.base}/api/asks?thread_id={thread}")["asks"]}
        finally:
            assert up.stop() == 0
        assert listed[thread]["lifecycle"] == "archived"
        assert {t["id"] for t in tasks} == turns, "a turn was queued in the archived thread"
        assert all(t["status"] not in ("pending", "running") for t in tasks)
        assert pending == []
        assert history[question]["status"] == "cancelled" and history[question]["response"] == "thread archived"


def test_three_demo_restarts_keep_one_demo_thread_and_one_pending_question_per_tool_call(tmp_path: Path) -> None:
    data = tmp_path / "var"
    for _ in range(3):
        up = Up(tmp_path, data, "--demo")
        try:
            until_blocking(lambda: _get(f"{up.base}/api/asks?status=pending")["asks"], "the demo's question",
                           timeout=120)
            time.sleep(2)  # a duplicate would be asked by now
            threads = _get(f"{up.base}/api/threads")["threads"]
            pending = _get(f"{up.base}/api/asks?status=pending")["asks"]
        finally:
            assert up.stop() == 0
        assert [t["title"] for t in threads].count("Demo") == 1, threads
        by_content = Counter(json.dumps(a["questions"], sort_keys=True) for a in pending)
        assert max(by_content.values()) == 1, pending
        assert len({a["tool_use_id"] for a in pending}) == len(pending)


def test_up_warns_in_one_line_with_the_fix_when_the_auth_mode_refuses_a_plain_browser() -> None:
    from petal_dispatch import up
    from petal_dispatch.config import Settings

    base = Settings().model_copy(update={"open_mode": False, "ingress_host": "127.0.0.1"})
    warning = up.auth_warning(base.model_copy(update={"auth_mode": "proxy"}))
    assert warning is not None and "\n" not in warning
    assert "OPEN_MODE=1" in warning and "PETAL_AUTH_MODE=token" in warning
    assert up.auth_warning(base.model_copy(update={"auth_mode": "proxy"}), demo=True) is None
    assert up.auth_warning(base.model_copy(update={"auth_mode": "proxy", "open_mode": True})) is None
    assert up.auth_warning(base.model_copy(update={"auth_mode": "token"})) is None


def test_a_reasked_identical_question_takes_over_the_pending_row_and_a_rerun_gets_the_given_answer(db: DB) -> None:
    import uuid

    import psycopg
    from psycopg.types.json import Jsonb

    from executor.sql import queries
    from tests import tables

    adopt = queries["take_asked_question"]
    asked = [{"question": "Which way?", "header": "Way", "multiSelect": False,
              "options": [{"label": "A", "description": ""}, {"label": "B", "description": ""}]}]
    thread = uuid.uuid4()
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        tables.insert_thread(conn, thread)

        def task(status: str, retry_of: Any = None) -> Any:
            return tables.insert_task(conn, session_id=thread, role="orchestrator", status=status, retry_of=retry_of)

        def ask(task_id: Any, questions: Any = asked) -> Any:
            return conn.execute(adopt, {"questions": Jsonb(questions), "asked_by": "model", "session_id": thread,
                                        "task_id": task_id}).fetchone()

        cut = task("crashed")
        old = tables.ask(conn, asked, tool_use_id="toolu_old", source_session_uuid=thread, task_id=cut, asked_by="model")
        rerun = task("running", cut)
        taken = ask(rerun)
        other = ask(rerun, [{**asked[0], "question": "Another?"}])
        (owner,) = tables.row(conn, "questions", old, "task_id")
        # answered by the user, then that turn is cut off too: its re-run gets the answer, nothing is asked again
        tables.answer(conn, old, answered_by="u")
        tables.update(conn, "tasks", rerun, status="cancelled")
        answered = ask(task("running", rerun))
        unrelated = ask(task("running"))  # a later, unrelated turn asking the same is asked anew
    assert taken is not None and taken[0] == old and owner == rerun
    assert other is None
    assert answered is not None and answered[0] == old and answered[2] == "answered"
    assert unrelated is None
