"""What the permission path does with a verdict: allow, ask or deny; whether a standing rule covers a call;
and the permission prompt tool's answer (docs/claude-cli.md: one text block holding this JSON)."""

from __future__ import annotations

import json
from typing import Any, Literal

from executor.gates.tables import PATH_KEYS
from executor.gates.verdict import Verdict

Mode = Literal["interactive", "autonomous"]
Decision = Literal["allow", "deny", "ask"]


def decide(verdict: Verdict, mode: Mode, *, standing_rule: bool = False) -> Decision:
    """What the permission path does with a classified call: allowed calls and calls a standing rule covers
    run; a gated call is asked about in an interactive thread and refused in an autonomous one."""
    if not verdict.gated or standing_rule:
        return "allow"
    return "ask" if mode == "interactive" else "deny"


def deny_message(verdict: Verdict, *, why: str | None = None) -> str:
    """The text the model reads when a gated call is refused."""
    detail = f" ({verdict.reason})" if verdict.reason else ""
    reason = why or "this thread runs autonomously, and such calls need a person's approval"
    return (f"Refused at the hard gate '{verdict.label}'{detail}: {reason}. Stay within the task's scope: do "
            "not retry this call or work around it; finish what you can and say in your report what needs "
            "approval.")


def rule_covers(pattern: str, rule_tool: str, tool_name: str, tool_input: dict[str, Any] | None) -> bool:
    """Whether a standing rule (gate_rules row) covers a call. A Bash rule is the exact command, or a prefix
    ending in ':*' that covers only one simple command starting with those words — so `npm test:*` never
    covers `npm test && sudo …` or `npm test $(…)`. Other tools' rules are the exact path."""
    if rule_tool != tool_name or not isinstance(tool_input, dict):
        return False
    if tool_name != "Bash":
        # every path the call names is the rule's (the classifier looks at each of them)
        paths = [tool_input[k] for k in PATH_KEYS if k in tool_input]
        return bool(paths) and all(p == pattern for p in paths)
    command = tool_input.get("command")
    if not isinstance(command, str):
        return False
    if not pattern.endswith(":*"):
        return command.strip() == pattern.strip()
    words = _simple_words(command)
    prefix = _simple_words(pattern[:-2])
    return words is not None and bool(prefix) and words[:len(prefix or [])] == prefix


def standing_pattern(tool_name: str, tool_input: dict[str, Any]) -> tuple[str | None, str]:
    """The pattern of a standing allow for exactly this call (a card's "allow for this task / thread": "the same
    call again"), or None and why not. A command ending in ':*' is not made one: a rule reads that as a prefix
    (`npm install lodash #:*`, allowed always, then covered `npm install lodash evil-pkg`)."""
    if tool_name == "Bash":
        pattern = tool_input.get("command")
        if isinstance(pattern, str) and pattern.rstrip().endswith(":*"):
            return None, "its command ends in ':*', which a standing rule reads as a prefix: allowed this once only"
    else:
        pattern = next((v for k in PATH_KEYS if isinstance(v := tool_input.get(k), str) and v), None)
    if not isinstance(pattern, str) or not pattern:
        return None, "it names no command or path to hold a rule to: allowed this once only"
    return pattern, ""


def _simple_words(command: str) -> list[str] | None:
    """The words of a single simple command with nothing expanded or redirected, else None."""
    import bashlex  # imported at the first command read (executor/gates/walker.py)

    try:
        trees = bashlex.parse(command)
    except Exception:
        return None
    if len(trees) != 1 or trees[0].kind != "command":
        return None
    parts = trees[0].parts
    if any(p.kind != "word" or getattr(p, "parts", None) for p in parts):
        return None
    return [p.word for p in parts]


def summary(tool_name: str, tool_input: dict[str, Any] | None, limit: int = 300) -> str:
    """What an approval card and the journal show of a call: the command, or the path, else the input."""
    tool_input = tool_input if isinstance(tool_input, dict) else {}
    if isinstance(tool_input.get("command"), str):
        text = tool_input["command"]
    else:
        text = next((v for k in PATH_KEYS if isinstance(v := tool_input.get(k), str)), None) or json.dumps(
            tool_input, ensure_ascii=False, sort_keys=True)
    return f"{tool_name}: {text}"[:limit]


def permission_result(decision: Literal["allow", "deny"], tool_input: dict[str, Any], message: str = "") -> str:
    """The text the permission prompt tool returns. Allow passes the input back unchanged (the CLI runs
    `updatedInput`); deny's message is exactly what the model reads."""
    if decision == "allow":
        return json.dumps({"behavior": "allow", "updatedInput": tool_input})
    return json.dumps({"behavior": "deny", "message": message or "Refused at a hard gate."})
