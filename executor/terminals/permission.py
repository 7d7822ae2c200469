"""A terminal session's permission prompts, answered on the page or in the terminal, whichever is first.

The session's CLI runs with a `PermissionRequest` command hook (shared/terminal_hook.py). Observed on
2.1.328 (docs/claude-cli.md "Interactive mode"): the CLI calls it exactly when it shows its own permission
dialog, and shows the dialog while the hook runs; the hook's decision closes the dialog and is applied ("Allowed
by PermissionRequest hook"); an answer typed in the terminal first ends the hook's process. So the hook asks here
and waits: the call becomes an approval card in the Asks panel, and its answer goes back to the CLI through
the hook, never as keystrokes. When the hook's connection closes first (the terminal answered), the card is
closed as answered in the terminal.
"""

from __future__ import annotations

import json
from typing import Any

from executor import asks, gates
from executor.asks import Asks
from executor.harness.permission import preview
from executor.run.caller import Caller
from shared import receipts

ALLOW, DENY = "Allow once", "Deny"
ANSWERED_IN_TERMINAL = "answered in the terminal"


class _Quiet:
    """A hook has no progress to report (its timeout is the session's)."""

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        return None


def question(tool_name: str, tool_input: dict[str, Any], where: str) -> dict[str, Any]:
    """The card: the exact call, allow once or deny (or a typed reason that the model reads)."""
    options = [{"label": ALLOW, "description": "run this call now (the terminal's dialog closes)",
                "preview": preview(tool_name, tool_input)},
               {"label": DENY, "description": "refuse it; or type a reason instead, and the model reads it"}]
    return receipts.mark({
        "question": f"Claude Code in {where} wants to run {gates.summary(tool_name, tool_input, 200)!r}. Allow it?",
        "header": "Terminal", "multiSelect": False, "options": options,
        "gate": {"category": "terminal", "label": "the terminal's permission prompt", "reason": None,
                 "tool": tool_name, "summary": gates.summary(tool_name, tool_input)}},
        "tool_call", receipts.of_call(tool_name, tool_input))


def decision(behavior: str, message: str | None = None) -> bytes:
    """The hook's output for the CLI."""
    decided: dict[str, Any] = {"behavior": behavior}
    if message:
        decided["message"] = message
    return json.dumps({"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": decided}}).encode()


async def ask(service: Asks, caller: Caller, event: dict[str, Any], where: str, card_id: str) -> bytes | None:
    """Ask the user; the hook's output, or None when nobody decided (the terminal's dialog stays)."""
    tool_name = str(event.get("tool_name") or "?")
    given = event.get("tool_input")
    tool_input: dict[str, Any] = given if isinstance(given, dict) else {}
    q = question(tool_name, tool_input, where)
    final = await service.ask([q], tool_use_id=card_id, caller=caller, progress=_Quiet(), asked_by="harness",
                              gone=ANSWERED_IN_TERMINAL)
    choice = final.answers.get(q["question"])
    if not final.answered_by:  # timed out, dismissed, or not the user's own answer: the terminal decides
        return None
    if choice == ALLOW:
        if receipts.of_call(tool_name, tool_input) != await service.store.approved_sha256(final.id):
            return decision("deny", "Refused: the approval was for a different call.")
        return decision("allow")
    reason = choice if isinstance(choice, str) and choice != DENY else final.response
    if final.response == asks.TIMED_OUT:
        return None
    said = f"The user refused it on the phone, saying: {reason!r}" if reason else "The user refused it on the phone."
    return decision("deny", said)
