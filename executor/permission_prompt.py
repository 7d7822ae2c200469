"""The permission path's CLI side: the `permission_prompt` MCP tool and the spawn flags that route calls to it.

Not wired into spawns yet: the harness MCP's caller identity (which task, which thread mode) lands
separately. `register()` adds the tool to an `MCPServer` given a resolver from the call's context to a
`GateContext`; `cli_args()` are the flags a worker spawn adds. What the CLI does with them is recorded in
docs/claude-cli.md ("Permission path"): a constant PreToolUse hook answers `ask`, so every Bash/edit call
— pre-allowed ones too — reaches the tool, and the tool fails closed (an error or timeout runs nothing).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from executor import gates
from shared import logs

log = logs.get(__name__)

TOOL_NAME = "permission_prompt"
SERVER_NAME = "harness"
# The calls the hook sends to the tool. Read-only tools stay out: no round trip for them (the CLI itself
# still asks about a Read outside the working directory).
HOOK_MATCHER = "Bash|Write|Edit|MultiEdit|NotebookEdit"
_ASK = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "ask",
                               "permissionDecisionReason": "petal-dispatch checks this call at its hard gates"}}


@dataclass(frozen=True)
class GateContext:
    workdir: str
    home: str
    mode: gates.Mode


@dataclass(frozen=True)
class Outcome:
    """One decided call, for the journal (`gate.decided`) and the handoff's gate_decisions."""
    tool_name: str
    tool_use_id: str | None
    summary: str
    verdict: gates.Verdict
    decision: gates.Decision


def cli_args() -> list[str]:
    """The flags that send every non-read-only call through the tool (the worker must not pre-allow a way
    around it: the hook covers pre-allowed Bash/edits, the default permission mode covers a failing hook)."""
    hook = {"type": "command", "command": "printf '%s' " + _shell_quote(json.dumps(_ASK))}
    settings = {"hooks": {"PreToolUse": [{"matcher": HOOK_MATCHER, "hooks": [hook]}]}}
    return ["--permission-prompt-tool", f"mcp__{SERVER_NAME}__{TOOL_NAME}", "--permission-mode", "default",
            "--settings", json.dumps(settings)]


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def register(mcp: MCPServer, context: Callable[[Context], Awaitable[GateContext]],
             on_decided: Callable[[Outcome], Awaitable[None]] | None = None) -> None:
    """Add the permission prompt tool. An interactive thread's `ask` is denied for now, saying so: the
    approval card comes with the settlement wiring."""

    # One text block, not structured output: the CLI refuses a result with structuredContent.
    @mcp.tool(name=TOOL_NAME, structured_output=False)
    async def permission_prompt(tool_name: str, input: dict[str, Any], ctx: Context,  # noqa: A002 - the CLI's name
                                tool_use_id: str | None = None) -> str:
        """Decides whether a worker's tool call may run (called by Claude Code, not by the model)."""
        try:
            where = await context(ctx)
            verdict = gates.classify(tool_name, input, where.workdir, where.home)
            decision = gates.decide(verdict, where.mode)
        except Exception:
            # fail closed, and visibly: a deny is listed in the run's permission_denials, an error is not
            log.exception("permission_prompt_failed", tool=tool_name, tool_use_id=tool_use_id)
            return gates.permission_result("deny", input, "Refused: the harness could not check this call at its "
                                                          "hard gates. Do not retry it; say so in your report.")
        if on_decided is not None and verdict.gated:
            await on_decided(Outcome(tool_name, tool_use_id, gates.summary(tool_name, input), verdict, decision))
        if decision == "allow":
            return gates.permission_result("allow", input)
        why = None if decision == "deny" else "approvals from the phone are not available yet"
        return gates.permission_result("deny", input, gates.deny_message(verdict, why=why))
