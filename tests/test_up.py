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

import psutil

from tests.harness import claude_bin
from tests.web import free_port


def test_up_starts_both_services_on_the_embedded_server_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PETAL_EXECUTOR_DSN", "PETAL_INGRESS_DSN")}
    env.update(OPEN_MODE="1", PETAL_CLAUDE_BIN=claude_bin(), PETAL_LOG_FORMAT="json", HOME=str(tmp_path))
    mcp_port = free_port()
    cmd = [sys.executable, "-m", "shared.cli", "up", "--port", str(port), "--mcp-port", str(mcp_port),
           "--data-dir", str(tmp_path / "var")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert f"http://127.0.0.1:{port}/" in line, line
        family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            assert json.load(r)["status"] == "ready"
        deadline = time.monotonic() + 30  # the executor hosts the harness MCP on the port given
        while True:
            try:
                socket.create_connection(("127.0.0.1", mcp_port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the harness MCP never listened on --mcp-port"
                time.sleep(0.1)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/chat", data=b'{"text": "hi"}',
                                     headers={"content-type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 202
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(60)
        proc.stdout.close()  # type: ignore[union-attr]
    assert rc == 0
    deadline = time.monotonic() + 20
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in family):
        assert time.monotonic() < deadline, "a child outlived up"
        time.sleep(0.1)
    # the data stays: a second run reuses it
    assert (tmp_path / "var" / "pgdata" / "PG_VERSION").exists()


def test_up_without_the_claude_cli_refuses_and_names_the_install_command(tmp_path: Path) -> None:
    env = {**os.environ, "PETAL_CLAUDE_BIN": "no-such-claude-binary", "OPEN_MODE": "1"}
    out = subprocess.run([sys.executable, "-m", "shared.cli", "up", "--data-dir", str(tmp_path / "var")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "npm install -g @anthropic-ai/claude-code" in out.stderr


def test_a_scenario_needs_the_demo_and_a_real_file_and_a_bad_one_starts_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "OPEN_MODE": "1"}
    base = [sys.executable, "-m", "shared.cli", "up", "--data-dir", str(tmp_path / "var")]
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
    cmd = [sys.executable, "-m", "shared.cli", "up", "--demo", "--port", str(port), "--mcp-port", str(mcp_port),
           "--data-dir", str(tmp_path / "var")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert "demo" in line and f"{base}/" in line, line
        family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        deadline = time.monotonic() + 120
        while True:
            with urllib.request.urlopen(f"{base}/api/asks?status=pending", timeout=5) as r:
                asks = json.load(r)["asks"]
            if asks:
                break
            assert time.monotonic() < deadline, "the demo loop never reached its question"
            time.sleep(0.5)
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
        proc.stdout.close()  # type: ignore[union-attr]
    assert "no tests" in asks[0]["questions"][0]["question"]
    assert [e["event_type"] for e in derived] == ["handoff", "policy.decision"]
    assert roles == ["extractor", "orchestrator", "orchestrator", "worker"]
    assert rc == 0
    deadline = time.monotonic() + 20
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in family):
        assert time.monotonic() < deadline, "a child outlived up --demo"
        time.sleep(0.1)
