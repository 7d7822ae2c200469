"""The permission path with the real CLI: every gated call is refused before it runs, pre-allowed or not."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config
from mcp.server.mcpserver import Context, MCPServer

from executor.harness import permission
from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.harness import claude_bin, claude_env
from tests.served import free_port

CLI_TIMEOUT_S = 120  # a handful of tool calls; generous for a loaded machine


@asynccontextmanager
async def gate_server(context: Callable[[Context], Awaitable[permission.GateContext]],
                      decided: list[permission.Outcome] | None = None) -> AsyncIterator[str]:
    """A bare MCP server holding only the permission tool (no database: the harness wiring comes later)."""
    mcp = MCPServer(permission.SERVER_NAME)

    async def record(outcome: permission.Outcome) -> None:
        if decided is not None:
            decided.append(outcome)

    permission.register_standalone(mcp, context, record)
    port = free_port()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    stop = asyncio.Event()
    app = mcp.streamable_http_app(streamable_http_path="/harness-mcp/")
    # hypercorn types the app with its own ASGI scope TypedDicts, starlette with a plain mapping
    task = asyncio.create_task(serve(app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
    try:
        yield f"http://127.0.0.1:{port}/harness-mcp/"
    finally:
        stop.set()
        await task


async def _run_cli(model: ScriptedModelServer, tmp: Path, work: Path, home: Path, url: str) -> list[dict[str, Any]]:
    """One `claude -p` run with the gate's flags; Bash and Write pre-allowed on purpose (the hook still sends
    them to the gate). Returns the stream-json lines."""
    config = tmp / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"harness": {"type": "http", "url": url}}}))
    env = claude_env(model, home) | {"CLAUDE_CONFIG_DIR": str(tmp / "claude-config")}
    cmd = [claude_bin(), "-p", "--output-format", "stream-json", "--verbose", f"--mcp-config={config}",
           "--strict-mcp-config", "--allowedTools", "Bash,Write", *permission.cli_args(), "--", "work"]
    proc = await asyncio.create_subprocess_exec(*cmd, cwd=work, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                limit=1 << 24)
    out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
    lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    result: dict[str, Any] = next((line for line in lines if line.get("type") == "result"), {})
    assert proc.returncode == 0 and result.get("is_error") is False, err.decode()[-2000:]
    return lines


def _tool_results(lines: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(block.get("content")) for line in lines if line.get("type") == "user"
            for block in line["message"]["content"] if isinstance(block, dict) and block.get("type") == "tool_result"]


def _bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "Bash", "input": {"command": command}}}


async def test_an_autonomous_worker_runs_the_benign_calls_and_none_of_the_gated_ones(tmp_path: Path) -> None:
    work, home = tmp_path / "work", tmp_path / "home"
    (work / "sentinel-dir").mkdir(parents=True)
    (work / "sentinel-dir" / "keep").write_text("keep")
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE-KEY-MATERIAL")
    outside = tmp_path / "outside.txt"
    calls = [
        _bash("ls"),
        _bash("rm -rf sentinel-dir"),
        _bash("ls && sudo true"),
        _bash('bash -c "git push origin main"'),
        _bash("echo $(cat ~/.ssh/id_rsa)"),
        {"tool_use": {"name": "Write", "input": {"file_path": str(outside), "content": "x"}}},
        {"tool_use": {"name": "Write", "input": {"file_path": str(work / "notes.txt"), "content": "notes"}}},
        {"text": "done"},
    ]
    decided: list[permission.Outcome] = []

    async def autonomous(ctx: Context) -> permission.GateContext:
        return permission.GateContext(str(work), str(home), "autonomous")

    with ScriptedModelServer(Scenario.single(*calls)) as model:
        async with gate_server(autonomous, decided) as url:
            lines = await _run_cli(model, tmp_path, work, home, url)
    result = next(line for line in lines if line.get("type") == "result")

    assert (work / "sentinel-dir" / "keep").exists()
    assert not outside.exists()
    assert (work / "notes.txt").read_text() == "notes"
    assert [(o.tool_name, o.verdict.category, o.decision) for o in decided] == [
        ("Bash", "destructive", "deny"), ("Bash", "privilege_escalation", "deny"),
        ("Bash", "git_beyond_branch", "deny"), ("Bash", "secrets", "deny"), ("Write", "outside_tree", "deny")]
    assert [d["tool_input"] for d in result["permission_denials"]] == [c["tool_use"]["input"] for c in calls[1:6]]

    texts = _tool_results(lines)
    assert "sentinel-dir" in texts[0] and "PRIVATE-KEY-MATERIAL" not in "".join(texts)
    for text, label in zip(texts[1:6], ["destructive data op", "privilege escalation", "git beyond the branch",
                                        "secrets", "outside the project tree"]):
        assert f"Refused at the hard gate '{label}'" in text


async def test_a_gate_that_cannot_check_a_call_refuses_it_visibly(tmp_path: Path) -> None:
    work, home = tmp_path / "work", tmp_path / "home"
    (work / "sentinel-dir").mkdir(parents=True)

    async def unknown_caller(ctx: Context) -> permission.GateContext:
        raise LookupError("no task for this caller")

    with ScriptedModelServer(Scenario.single(_bash("ls"), {"text": "done"})) as model:
        async with gate_server(unknown_caller) as url:
            lines = await _run_cli(model, tmp_path, work, home, url)
    result = next(line for line in lines if line.get("type") == "result")
    assert [d["tool_input"] for d in result["permission_denials"]] == [{"command": "ls"}]
    [text] = _tool_results(lines)
    assert "could not check this call" in text and "sentinel-dir" not in text


async def test_calls_the_cli_would_allow_unasked_reach_the_gate_whatever_the_project_s_settings_say(
        tmp_path: Path) -> None:
    """`cat .env` and `echo` inside the tree are read-only to the CLI, which runs them without asking; the
    project's own settings here switch hooks off (that let a hook-based gate's `cat .env` run)."""
    work, home = tmp_path / "work", tmp_path / "home"
    (work / ".claude").mkdir(parents=True)
    (work / ".env").write_text("API_KEY=TREE-SECRET-VALUE\n")
    (work / ".claude" / "settings.json").write_text(json.dumps(
        {"disableAllHooks": True, "permissions": {"allow": ["Bash", "Write"], "defaultMode": "acceptEdits"},
         "sandbox": {"enabled": True, "autoAllowBashIfSandboxed": True}}))
    calls = [_bash("echo hi"), _bash("cat .env"), _bash("ls && cat .env"), _bash("head -c 40 < .env")]
    checked: list[str] = []

    async def autonomous(ctx: Context) -> permission.GateContext:
        checked.append("call")
        return permission.GateContext(str(work), str(home), "autonomous")

    with ScriptedModelServer(Scenario.single(*calls, {"text": "done"})) as model:
        async with gate_server(autonomous) as url:
            lines = await _run_cli(model, tmp_path, work, home, url)
    result = next(line for line in lines if line.get("type") == "result")

    assert len(checked) == len(calls)  # every one asked, the harmless echo too
    texts = _tool_results(lines)
    assert "hi" in texts[0] and "TREE-SECRET-VALUE" not in "".join(texts)
    assert [d["tool_input"] for d in result["permission_denials"]] == [c["tool_use"]["input"] for c in calls[1:]]


async def test_a_read_of_a_secret_file_reaches_the_gate_wherever_it_is_and_other_reads_do_not(tmp_path: Path) -> None:
    """The read rules are per path: a secret read is asked for (the project allowing Read notwithstanding),
    in the tree, outside it and under HOME; an ordinary read makes no round trip."""
    work, home, outside = tmp_path / "work", tmp_path / "home", tmp_path / "outside"
    for d in (work / ".claude", work / "sub", home / ".ssh", outside):
        d.mkdir(parents=True)
    (work / ".claude" / "settings.json").write_text(json.dumps({"permissions": {"allow": ["Read"]}}))
    (work / "README.md").write_text("an ordinary file\n")
    secrets = {work / ".env": "TREE-SECRET", work / "sub" / ".env.local": "SUB-SECRET",
               home / ".ssh" / "id_rsa": "KEY-SECRET", outside / ".env": "OUTSIDE-SECRET"}
    for path, value in secrets.items():
        path.write_text(f"{value}\n")
    reads = [work / "README.md", *secrets]
    checked: list[str] = []
    decided: list[permission.Outcome] = []

    async def autonomous(ctx: Context) -> permission.GateContext:
        checked.append("call")
        return permission.GateContext(str(work), str(home), "autonomous")

    calls = [{"tool_use": {"name": "Read", "input": {"file_path": str(p)}}} for p in reads]
    with ScriptedModelServer(Scenario.single(*calls, {"text": "done"})) as model:
        async with gate_server(autonomous, decided) as url:
            lines = await _run_cli(model, tmp_path, work, home, url)

    texts = _tool_results(lines)
    assert "an ordinary file" in texts[0]
    assert len(checked) == len(secrets)  # the ordinary read was not asked for
    assert [(o.tool_name, o.verdict.category, o.decision) for o in decided] == [("Read", "secrets", "deny")] * 4
    assert not any(value in "".join(texts) for value in secrets.values())
