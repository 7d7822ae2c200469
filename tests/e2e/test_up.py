"""`petal-dispatch up` on the embedded default: one command, both services, a clean stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from tests.harness import claude_bin
from tests.wait import until_blocking
from tests.served import free_port


def test_up_starts_both_services_on_the_embedded_server_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PETAL_EXECUTOR_DSN", "PETAL_INGRESS_DSN")}
    env.update(OPEN_MODE="1", PETAL_CLAUDE_BIN=claude_bin(), PETAL_LOG_FORMAT="json", HOME=str(tmp_path),
               ANTHROPIC_API_KEY="sk-ant-fake")  # a login: `up` refuses to start without one
    mcp_port = free_port()
    cmd = [sys.executable, "-m", "petal_dispatch.cli", "up", "--port", str(port), "--mcp-port", str(mcp_port),
           "--data-dir", str(tmp_path / "var")]
    err = (tmp_path / "up.err").open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]  # stdout=PIPE: never None
        assert f"http://127.0.0.1:{port}/" in line, line
        family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            assert json.load(r)["status"] == "ready"
        # the executor hosts the harness MCP on the port given
        until_blocking(lambda: _listens(mcp_port), "the harness MCP listening on --mcp-port", 30)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/chat", data=b'{"text": "hi"}',
                                     headers={"content-type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 202
        # the page's line is set apart (a blank line after it; the one before is on stderr) and printed again once
        # the services' start-up lines have settled (at most children.SETTLE_MAX_S), so it is the last on the screen
        again = [proc.stdout.readline() for _ in range(3)]  # type: ignore[union-attr]  # stdout=PIPE: never None
        assert again == ["\n", line, "\n"], again
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(60)
        proc.stdout.close()  # type: ignore[union-attr]  # stdout=PIPE: never None
    assert rc == 0
    err.close()
    # one log style: every line the services and their libraries wrote is a JSON record (hypercorn's and the MCP
    # SDK's own handlers would print "[…] [INFO] Running on …" and rich console lines)
    lines = [ln for ln in (tmp_path / "up.err").read_text().splitlines() if ln.strip()]
    assert lines and all(ln.startswith("{") for ln in lines), [ln for ln in lines if not ln.startswith("{")][:5]
    running = [json.loads(ln) for ln in lines if "Running on" in ln]
    assert len(running) == 2 and {r["logger"] for r in running} == {"hypercorn.error"}
    until_blocking(lambda: not any(_alive(p) for p in family), "every child of up gone", 20)
    # the data stays: a second run reuses it
    assert (tmp_path / "var" / "pgdata" / "PG_VERSION").exists()


def test_up_without_the_claude_cli_refuses_and_names_the_install_command(tmp_path: Path) -> None:
    env = {**os.environ, "PETAL_CLAUDE_BIN": "no-such-claude-binary", "OPEN_MODE": "1"}
    out = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "up", "--data-dir", str(tmp_path / "var")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "npm install -g @anthropic-ai/claude-code" in out.stderr


def test_a_scenario_needs_the_demo_and_a_real_file_and_a_bad_one_starts_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "OPEN_MODE": "1"}
    base = [sys.executable, "-m", "petal_dispatch.cli", "up", "--data-dir", str(tmp_path / "var")]
    alone = subprocess.run([*base, "--scenario", str(tmp_path / "s.json")], env=env, capture_output=True, text=True,
                           timeout=60)
    missing = subprocess.run([*base, "--demo", "--scenario", str(tmp_path / "s.json")], env=env, capture_output=True,
                             text=True, timeout=60)
    assert alone.returncode == 2 and "--scenario goes with --demo" in alone.stderr
    assert missing.returncode == 2 and "no scenario file" in missing.stderr
    assert not (tmp_path / "var" / "pgdata").exists()  # refused before the database started


def test_up_demo_runs_the_whole_loop_to_an_ask_waiting_in_the_panel_and_stops_cleanly(tmp_path: Path) -> None:
    port, mcp_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PETAL_EXECUTOR_DSN", "PETAL_INGRESS_DSN",
                                                            "OPEN_MODE")}
    env.update(PETAL_CLAUDE_BIN=claude_bin(), PETAL_LOG_FORMAT="json", HOME=str(tmp_path))
    cmd = [sys.executable, "-m", "petal_dispatch.cli", "up", "--demo", "--port", str(port), "--mcp-port", str(mcp_port),
           "--data-dir", str(tmp_path / "var")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]  # stdout=PIPE: never None
        assert "demo" in line and f"{base}/" in line, line
        family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        asks = until_blocking(lambda: _get(f"{base}/api/asks?status=pending")["asks"],
                              "the demo loop to reach its question", 120, every=0.5)
        with urllib.request.urlopen(f"{base}/api/info", timeout=5) as r:
            assert json.load(r)["demo"] is True
        with urllib.request.urlopen(f"{base}/", timeout=5) as r:
            assert "Demo:" in r.read().decode()
        with urllib.request.urlopen(f"{base}/api/events?tier=derived", timeout=5) as r:
            derived = json.load(r)["events"]
        with urllib.request.urlopen(f"{base}/api/tasks", timeout=5) as r:
            roles = sorted(t["role"] for t in json.load(r)["tasks"])
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        proc.stdout.close()  # type: ignore[union-attr]  # stdout=PIPE: never None
    assert "no tests" in asks[0]["questions"][0]["question"]
    assert [e["event_type"] for e in derived] == ["handoff", "policy.decision"]
    assert roles == ["extractor", "orchestrator", "orchestrator", "worker"]
    assert rc == 0
    until_blocking(lambda: not any(_alive(p) for p in family), "every child of up --demo gone", 20)


# ---- up as a supervisor ------------------------------------------------------------------------------

INTERRUPTED_SCENARIO = {
    "rules": [
        {"role": "orchestrator", "match_last": "[harness]", "replies": [{"text": "heard"}]},
        {"role": "orchestrator", "replies": [
            {"tool_use": {"name": "mcp__harness__dispatch_worker", "input": {"brief": "do the two-step job"}}},
            {"text": "dispatched"}]},
        # the first attempt does step one, then blocks in a long Bash call: it is running when the executor dies
        {"role": "worker", "sessions": 1, "replies": [
            {"tool_use": {"name": "Bash", "input": {"command": "echo one > step-one.txt && sleep 300"}}},
            {"text": "done"}]},
        {"role": "worker", "replies": [{"text": "step one was done already; finished the job"}]},
        {"role": "extractor", "replies": [
            {"tool_use": {"name": "StructuredOutput", "input": {
                "goal": "the two-step job", "current_state": "done", "next_step": "none", "ruled_out": [],
                "status": "success", "artifacts": []}}},
            {"text": "Handoff provided."}]},
    ],
    "default": {"text": "ok"},
}


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"},
                                 method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)



def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _task_procs(task_id: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("PETAL_TASK_ID") == task_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            pass
    return found


def _log_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def _up_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PETAL_EXECUTOR_DSN", "PETAL_INGRESS_DSN",
                                                            "OPEN_MODE")}
    env.update(PETAL_CLAUDE_BIN=claude_bin(), PETAL_LOG_FORMAT="json", HOME=str(tmp_path), ANTHROPIC_API_KEY="sk-ant-fake")
    return env


def test_the_executor_killed_under_up_is_restarted_its_worker_dies_with_it_and_the_retry_is_told(
        tmp_path: Path) -> None:
    port, mcp_port = free_port(), free_port()
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps(INTERRUPTED_SCENARIO))
    data = tmp_path / "var"
    cmd = [sys.executable, "-m", "petal_dispatch.cli", "up", "--demo", "--scenario", str(scenario), "--port", str(port),
           "--mcp-port", str(mcp_port), "--data-dir", str(data)]
    with (tmp_path / "up.log").open("w") as log:
        proc = subprocess.Popen(cmd, env=_up_env(tmp_path), stdout=subprocess.PIPE, stderr=log, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert f"{base}/" in proc.stdout.readline()  # type: ignore[union-attr]  # stdout=PIPE: never None
        thread = _post(f"{base}/api/threads", {"title": "t", "mode": "autonomous"})["thread_id"]
        _post(f"{base}/api/chat", {"text": "start the job", "thread_id": thread})

        def workers() -> list[dict[str, Any]]:
            return sorted((t for t in _get(f"{base}/api/tasks?thread_id={thread}")["tasks"] if t["role"] == "worker"),
                          key=lambda t: t["attempt"])

        # the demo's project: petal's own directory beside the default working directory (HOME is tmp_path)
        project = tmp_path / ".local" / "share" / "petal-dispatch" / "demo-project"
        until_blocking(lambda: (project / "step-one.txt").exists(), "the worker's Bash call")
        first = workers()[0]
        claude, bash = first["pid"], [p for p in _task_procs(first["id"]) if p != first["pid"]]
        assert _alive(claude) and bash, "the worker and its Bash child run"
        executor = next(p for p in psutil.Process(proc.pid).children()
                        if p.cmdline()[-2:] == ["petal_dispatch.cli", "executor"])
        os.kill(executor.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        # the worker's claude and its Bash child go with the executor, before any new executor could sweep them
        try:
            until_blocking(lambda: not any(_alive(p) for p in [claude, *bash]), "the worker to die with the executor",
                   timeout=5)
        except AssertionError:
            left = [(p, psutil.Process(p).status(), psutil.Process(p).cmdline()) for p in [claude, *bash] if _alive(p)]
            raise AssertionError(f"still running: {left}") from None
        gone_after = time.monotonic() - killed_at

        def second() -> dict[str, Any] | None:
            found = workers()
            return found[1] if len(found) > 1 else None

        retry = until_blocking(second, "the retry")
        crashed = _get(f"{base}/api/tasks/{first['id']}/events")["events"]
        postmaster = int((data / "pgdata" / "postmaster.pid").read_text().split()[0])
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(60)
        proc.stdout.close()  # type: ignore[union-attr]  # stdout=PIPE: never None
    events = _log_events(tmp_path / "up.log")
    assert any(e["event"] == "service_died" and e["service"] == "executor" for e in events)
    assert any(e["event"] == "service_restarted" and e["service"] == "executor" for e in events)
    assert gone_after < 5
    # the new executor's sweep found nothing of the dead worker left to kill
    reconciled = [e["payload"] for e in crashed if e["event_type"] == "task.crashed"]
    assert reconciled and reconciled[0]["killed_pids"] == []
    assert retry["attempt"] == 2 and retry["retry_of"] == first["id"]
    assert "An earlier attempt was interrupted" in retry["brief"]
    assert "echo one > step-one.txt && sleep 300" in retry["brief"]
    assert rc == 0
    until_blocking(lambda: not _alive(postmaster), "the embedded PostgreSQL to stop", timeout=20)


def test_up_restarts_the_embedded_postgresql_when_it_dies(tmp_path: Path) -> None:
    port, mcp_port = free_port(), free_port()
    data = tmp_path / "var"
    env = {**_up_env(tmp_path), "OPEN_MODE": "1"}
    cmd = [sys.executable, "-m", "petal_dispatch.cli", "up", "--port", str(port), "--mcp-port", str(mcp_port),
           "--data-dir", str(data)]
    with (tmp_path / "up.log").open("w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    pidfile = data / "pgdata" / "postmaster.pid"
    try:
        # stdout=PIPE: never None
        assert f"http://127.0.0.1:{port}/" in proc.stdout.readline()  # type: ignore[union-attr]
        first = int(pidfile.read_text().split()[0])
        os.kill(first, signal.SIGKILL)

        def restarted() -> int | None:
            try:
                pid = int(pidfile.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                return None
            return pid if pid != first and _alive(pid) else None

        second = until_blocking(restarted, "PostgreSQL to be started again", timeout=60)

        def ready() -> bool:
            try:
                status: str = _get(f"http://127.0.0.1:{port}/readyz")["status"]
                return status == "ready"
            except OSError:
                return False

        until_blocking(ready, "the ingress to be ready again", timeout=60)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(60)
        proc.stdout.close()  # type: ignore[union-attr]  # stdout=PIPE: never None
    assert any(e["event"] == "database_restarted" for e in _log_events(tmp_path / "up.log"))
    assert rc == 0
    until_blocking(lambda: not _alive(second), "the restarted PostgreSQL to stop", timeout=20)


def test_a_clean_stop_stops_postgresql_even_after_an_earlier_up_was_killed(tmp_path: Path) -> None:
    data = tmp_path / "var"
    env = {**_up_env(tmp_path), "OPEN_MODE": "1"}

    def start() -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "petal_dispatch.cli", "up", "--port", str(free_port()), "--mcp-port", str(free_port()),
               "--data-dir", str(data)]
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert "is up" in p.stdout.readline()  # type: ignore[union-attr]  # stdout=PIPE: never None
        return p

    first = start()
    services = [c.pid for c in psutil.Process(first.pid).children()]
    first.kill()  # SIGKILL: no clean-up at all; its pid stays in the server's handle list
    first.wait()
    first.stdout.close()  # type: ignore[union-attr]  # stdout=PIPE: never None
    until_blocking(lambda: not any(_alive(p) for p in services), "its services to die with it", timeout=10)
    postmaster = int((data / "pgdata" / "postmaster.pid").read_text().split()[0])
    assert _alive(postmaster)  # left running by the killed up
    second = start()
    assert int((data / "pgdata" / "postmaster.pid").read_text().split()[0]) == postmaster  # reused
    second.send_signal(signal.SIGINT)
    assert second.wait(60) == 0
    second.stdout.close()  # type: ignore[union-attr]  # stdout=PIPE: never None
    until_blocking(lambda: not _alive(postmaster), "PostgreSQL to stop", timeout=20)
