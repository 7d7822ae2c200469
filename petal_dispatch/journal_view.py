"""The journal as lines a person can read in a terminal (who, what, status, the text that matters)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from shared.models import Event

WIDTH = 160
# What a terminal would act on instead of showing: C0 and C1 controls and DEL (escape sequences can clear
# the screen, retitle the window, write the clipboard, hide a link's target), and the bidi controls that
# make a line read differently from what it holds. Model text reaches these views, so they show them as codes.
_INERT = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def inert(text: str) -> str:
    r"""The text with every control character written out (\x1b), so printing it only shows it."""
    return _INERT.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                      else f"\\u{ord(m.group()):04x}", text)


def _short(text: str, width: int = WIDTH) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _blocks(payload: dict[str, Any]) -> list[dict[str, Any]]:
    content = (payload.get("message") or {}).get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _exited(p: dict[str, Any]) -> str:
    code = p.get("exit_code") if p.get("signal") is None else p.get("signal")
    return f"exited {p.get('status', '?').upper()} ({p.get('reason', '')}), exit {code}"


def _assistant(p: dict[str, Any]) -> str:
    parts = []
    for b in _blocks(p):
        if b.get("type") == "text":
            parts.append(_short(b.get("text", ""), 120))
        elif b.get("type") == "tool_use":
            parts.append(f"→ {b.get('name')}({_short(json.dumps(b.get('input', {})), 80)})")
    return "assistant: " + " ".join(parts)


def _tool_results(p: dict[str, Any]) -> str:
    parts = []
    for b in _blocks(p):
        if b.get("type") == "tool_result":
            content = b.get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            parts.append(("✗ " if b.get("is_error") else "← ") + _short(text, 120))
    return "tool result: " + " ".join(parts) if parts else "user"


def _result(p: dict[str, Any]) -> str:
    failed = "ERROR " if p.get("is_error") else ""
    return f"result {failed}{p.get('terminal_reason') or p.get('subtype', '')}: {_short(p.get('result', '') or '', 100)}"


def _handoff(p: dict[str, Any]) -> str:
    return (f"HANDOFF {p.get('status', '')}: goal {_short(p.get('goal', ''), 60)} | now "
            f"{_short(p.get('current_state', ''), 60)} | next {_short(p.get('next_step', ''), 50)}")


def _question(t: str, p: dict[str, Any]) -> str:
    qs = [q.get("question", "") for q in p.get("questions", [])] if t == "question.asked" else []
    detail = " / ".join(qs) if qs else json.dumps(p.get("answers") or p.get("response") or p.get("reason"))
    return f"{t.split('.')[1]}: {_short(detail, 140)}"


# one line per event type a person reads most; any other type shows its payload
_SUMMARIES: dict[str, Callable[[dict[str, Any]], str]] = {
    "task.user_message": lambda p: f"user: {_short(p.get('text', ''))}",
    "thread.harness_message": lambda p: f"harness → orchestrator: {_short(p.get('text', ''))}",
    "task.spawned": lambda p: (f"spawned {p.get('role', '')} pid {p.get('pid', '?')}"
                               + (" (imported)" if p.get("imported") else "")),
    "task.exited": _exited,
    "task.stalled": lambda p: f"stalled after {p.get('silent_s')} s silent",
    "task.resumed": lambda p: "resumed",
    "task.dispatch_requested": lambda p: f"dispatch {p.get('role', '')}: {_short(p.get('brief', '') or '', 120)}",
    "stream.assistant": _assistant,
    "stream.user": _tool_results,
    "stream.result": _result,
    "stream.system.init": lambda p: (f"init (claude {p.get('claude_code_version', '?')}, "
                                     f"{len(p.get('tools', []))} tools)"),
    "stream.unparsed": lambda p: f"unparsed line: {_short(p.get('line', ''), 120)}",
    "handoff": _handoff,
    "handoff.extraction_failed": lambda p: f"EXTRACTION FAILED: {_short('; '.join(p.get('errors', [])), 140)}",
}


def summary(e: Event) -> str:
    """One line about what this event says."""
    p: dict[str, Any] = e.payload if isinstance(e.payload, dict) else {}
    said = _SUMMARIES.get(e.event_type)
    if said is not None:
        return said(p)
    if e.event_type.startswith("question."):
        return _question(e.event_type, p)
    return _short(json.dumps(p), 140)


def line(e: Event) -> str:
    who = str(e.task_id)[:8] if e.task_id else (str(e.session_id)[:8] if e.session_id else "--------")
    return inert(f"{e.seq:>7} {e.created_at:%H:%M:%S} {who} {e.event_type:<26} {summary(e)}")
