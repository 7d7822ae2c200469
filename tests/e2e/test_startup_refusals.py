"""Expected start-up conditions end in one line naming what is wrong, never a traceback; read-only
commands never start a database server."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import claude_bin


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PETAL_EXECUTOR_DSN", "PETAL_INGRESS_DSN")}
    # port 0: no fixed port another run may hold (a test that wants a taken port sets it)
    env.update(PETAL_DATA_DIR=str(data_dir), PETAL_LOG_FORMAT="json", PETAL_CLAUDE_BIN=claude_bin(), OPEN_MODE="1",
               PETAL_INGRESS_PORT="0", PETAL_MCP_PORT="0", HOME=str(data_dir.parent), ANTHROPIC_API_KEY="sk-ant-fake")
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str], prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(prefix or []), sys.executable, "-m", "petal_dispatch.cli", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def _one_line_error(out: subprocess.CompletedProcess[str], *names: str) -> str:
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("petal-dispatch:")]
    assert len(lines) == 1, out.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("service", ["ingress", "executor", "up"])
def test_a_taken_port_is_one_line_naming_the_service_and_the_port(service: str, taken_port: int,
                                                                   tmp_path: Path) -> None:
    data = tmp_path / "var"
    var = "PETAL_MCP_PORT" if service == "executor" else "PETAL_INGRESS_PORT"
    out = _run([service], _env(data, **{var: str(taken_port)}))
    line = _one_line_error(out, f"127.0.0.1:{taken_port}", "in use")
    assert ("harness MCP" if service == "executor" else "ingress") in line
    # and what chooses the port
    assert ("(--mcp-port / PETAL_MCP_PORT)" if service == "executor" else "(--port / PETAL_INGRESS_PORT)") in line
    assert not (data / "pgdata").exists()  # refused before any database was started


def test_up_refuses_a_taken_mcp_port_before_starting_anything(taken_port: int, tmp_path: Path) -> None:
    out = _run(["up", "--mcp-port", str(taken_port), "--port", "0"], _env(tmp_path / "var"))
    _one_line_error(out, f"127.0.0.1:{taken_port}", "harness MCP", "the port is in use (--mcp-port / PETAL_MCP_PORT)")
    assert not (tmp_path / "var" / "pgdata").exists()


def test_a_read_only_data_directory_is_one_line_naming_it(tmp_path: Path) -> None:
    data = tmp_path / "var"
    data.mkdir()
    prefix: list[str] = []
    if os.geteuid() == 0:
        # root writes through permission bits: make it a read-only mount in a mount namespace of its own
        if shutil.which("unshare") is None:
            pytest.skip("needs unshare to make a read-only mount as root")
        probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip("cannot create a mount namespace here")
        prefix = ["unshare", "-m", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"',
                  str(data)]
    else:
        data.chmod(0o555)
    for command in (["up", "--port", "0", "--mcp-port", "0"], ["migrate"], ["executor"]):
        out = _run(command, _env(data), prefix)
        _one_line_error(out, str(data.resolve()), "data directory")
    assert list(data.iterdir()) == []


def test_read_only_commands_say_the_database_is_down_and_start_nothing(tmp_path: Path) -> None:
    data = tmp_path / "var"
    assert _run(["migrate"], _env(data)).returncode == 0  # a database exists, and the command stopped it
    pidfile = data / "pgdata" / "postmaster.pid"
    assert not pidfile.exists()
    for command in (["status"], ["status", "--json"], ["journal"], ["db", "status"], ["db", "status", "--json"]):
        out = _run(command, _env(data))
        assert out.returncode == 2, (command, out.stderr)
        _one_line_error(out, "database is down", str(data.resolve()))
        assert not pidfile.exists(), f"{command} started a server"
    # nothing there at all: still down, still nothing started
    empty = _run(["status"], _env(tmp_path / "none"))
    _one_line_error(empty, "database is down")
    assert not (tmp_path / "none" / "pgdata").exists()


@pytest.mark.parametrize("service", ["executor", "up"])
@pytest.mark.parametrize("missing", ["bwrap", "socat"])
def test_without_the_sandbox_programs_the_start_is_refused_in_one_line_naming_the_install(
        service: str, missing: str, tmp_path: Path) -> None:
    # a PATH with everything the start needs but the one program
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for prog in ("bwrap", "socat", "bash", "git", "setpriv", "node", "true"):
        found = shutil.which(prog)
        if found and prog != missing:
            (bin_dir / prog).symlink_to(found)
    data = tmp_path / "var"
    out = _run([service], _env(data, PATH=str(bin_dir)))
    _one_line_error(out, missing, "apt-get install bubblewrap socat", "PETAL_SANDBOX=off")
    assert not (data / "pgdata").exists()  # refused before any database was started


def test_with_the_sandbox_off_the_executor_says_so_before_anything_else(taken_port: int, tmp_path: Path) -> None:
    """PETAL_SANDBOX=off is the explicit opt-out, even without bubblewrap: logged first (here the taken port
    then stops the start)."""
    env = _env(tmp_path / "var", PETAL_SANDBOX="off", PETAL_MCP_PORT=str(taken_port), PATH="/nonexistent")
    out = _run(["executor"], env)
    _one_line_error(out, "in use")
    assert "sandbox_off" in out.stdout + out.stderr and "unsandboxed" in out.stdout + out.stderr


def test_where_the_kernel_refuses_the_namespaces_the_start_is_refused_with_bubblewraps_reason(
        tmp_path: Path) -> None:
    """User namespaces disabled (a container without the privilege, a sysctl): bubblewrap is there but cannot
    start; its own reason is in the one line, with the fix. A stand-in bwrap answers as the real one does then."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely because the kernel "
                    "does not allow non-privileged user namespaces.' >&2\nexit 1\n")
    fake.chmod(0o755)
    data = tmp_path / "var"
    out = _run(["executor"], _env(data, PATH=f"{bin_dir}:{os.environ['PATH']}"))
    _one_line_error(out, "No permissions to creating new namespace", "unprivileged_userns_clone",
                    "PETAL_SANDBOX=off")
    assert not (data / "pgdata").exists()


def test_up_in_proxy_mode_without_the_proxy_secret_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """Not a crash-looping ingress under `up`: the same one line the ingress would give, at once."""
    data = tmp_path / "var"
    env = _env(data, OPEN_MODE="0")
    env.pop("PETAL_PROXY_SECRET", None)
    out = _run(["up"], env)
    _one_line_error(out, "PETAL_PROXY_SECRET")
    assert not (data / "pgdata").exists()
