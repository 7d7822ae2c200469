"""Approval receipts: the hash that binds an approval to exactly what was approved.

The executor puts `{"receipt": {"of": …, "sha256": …}}` into a gate card's or a dispatch approval's question
when it asks; when the user's approval is acted on it hashes what is about to run the same way and refuses a
mismatch. The ingress hashes what then ran (the journaled call) to export receipts. One canonical form for
all three: JSON with sorted keys, no whitespace, UTF-8.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

KEY = "receipt"


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest(value: Any) -> str:
    return hashlib.sha256(canonical(value)).hexdigest()


def of_call(tool_name: str, tool_input: dict[str, Any]) -> str:
    """A tool call as the permission path approves it, and as the CLI then journals it."""
    return digest({"tool": tool_name, "input": tool_input})


def of_worker(role: str, brief: str, project_id: Any, allowed_tools: Sequence[str] | None,
              workdir: str | None) -> str:
    """A worker as its dispatch approval shows it: what it is told, where, and with which tools."""
    return digest({"role": role, "brief": brief, "project_id": str(project_id) if project_id else None,
                   "allowed_tools": list(allowed_tools) if allowed_tools is not None else None,
                   "workdir": workdir})


def mark(question: dict[str, Any], of: str, sha256: str) -> dict[str, Any]:
    return {**question, KEY: {"of": of, "sha256": sha256}}


def approved(questions: Any) -> str | None:
    """The hash a card's first question was asked with; None for a card asked before receipts existed."""
    first = questions[0] if isinstance(questions, list) and questions else None
    found = first.get(KEY) if isinstance(first, dict) else None
    value = found.get("sha256") if isinstance(found, dict) else None
    return value if isinstance(value, str) else None
