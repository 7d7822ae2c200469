"""A worker's brief as the harness sends it: the orchestrator's text, plus what the store already knows.

The additions are bounded (a brief is a prompt, not a transcript): the plan task's earlier handoffs,
newest first, and the approaches already ruled out in the scope. A retry also carries what the attempt
it repeats had already done (its tool calls, from the journal), so side effects are not silently repeated.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from psycopg_pool import AsyncConnectionPool

from executor.settle.store import SettledWorker, SettleStore

MAX_HANDOFFS = 3
MAX_RULE_OUTS = 10
SECTION_CHARS = 1_500
MAX_TOOL_CALLS = 30
CALL_CHARS = 160
# statuses of an attempt cut short from outside, rather than one that ran to its own end
INTERRUPTED = {"crashed", "cancelled", "rate_limited", "stalled"}
# the input key that says most about a call, per common tool, before falling back to the whole input
_CALL_KEYS = ("command", "file_path", "path", "pattern", "url", "query", "brief", "description")
APPROVE, REJECT = "Approve", "Reject"

# what an approval card shows of a worker's brief (a longer one is cut, and the card says so)
BRIEF_PREVIEW_CHARS = 20_000


def _bounded(lines: list[str]) -> str:
    out: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) > SECTION_CHARS:
            out.append(f"- … ({len(lines) - len(out)} more left out)")
            break
        out.append(line)
        used += len(line) + 1
    return "\n".join(out)


async def enrich(pool: AsyncConnectionPool, brief: str, *, scope: uuid.UUID, project_id: uuid.UUID | None,
                 plan_ref: str | None) -> str:
    """`brief` with what the store already knows: the plan task's earlier handoffs, the approaches ruled out
    in `scope` (bounded)."""
    return await enrich_on(SettleStore.over(pool), brief, scope=scope, project_id=project_id, plan_ref=plan_ref)


async def enrich_on(store: SettleStore, brief: str, *, scope: uuid.UUID, project_id: uuid.UUID | None,
                    plan_ref: str | None) -> str:
    """`enrich`, read through `store`."""
    sections = []
    if project_id is not None and plan_ref:
        handoffs = await store.plan_task_handoffs(project_id, plan_ref, MAX_HANDOFFS)
        lines = [f"- [{h.get('status', '?')}] {h.get('current_state', '')} "
                 f"(next: {h.get('next_step', '')})" for h in handoffs]
        if lines:
            sections.append(f"## Earlier handoffs for {plan_ref} (newest first)\n{_bounded(lines)}")
    rule_outs = await store.scope_rule_outs(scope, MAX_RULE_OUTS)
    if rule_outs:
        lines = [f"- {r.approach} — {r.reason}" for r in rule_outs]
        sections.append(f"## Already ruled out here (do not retry these)\n{_bounded(lines)}")
    return "\n\n".join([brief, *sections]) if sections else brief


def _call_line(name: str, tool_input: Any, finished: bool) -> str:
    shown: Any = tool_input
    if isinstance(tool_input, dict):
        shown = next((tool_input[k] for k in _CALL_KEYS if isinstance(tool_input.get(k), str)), tool_input)
    text = shown if isinstance(shown, str) else json.dumps(shown, separators=(",", ":"), default=str)
    text = " ".join(text.split())
    if len(text) > CALL_CHARS:
        text = text[:CALL_CHARS] + "…"
    return f"- {name}: `{text}`" + ("" if finished else " (no result came back: it may or may not have finished)")


async def earlier_attempt(store: SettleStore, attempt: SettledWorker) -> str:
    """The section a retry's brief gets about the attempt it repeats: how it ended and the tool calls it had
    made, bounded. Read through the settler's store, inside its unit of work."""
    calls = await store.attempt_tool_calls(attempt.id, MAX_TOOL_CALLS)
    how = "was interrupted" if attempt.status in INTERRUPTED else "ended"
    head = (f"## An earlier attempt {how}\nAttempt {attempt.attempt} of this brief {how} "
            f"({attempt.status}: {attempt.status_reason or 'no reason recorded'}) before it finished.")
    if not calls:
        return f"{head} It had made no tool calls."
    lines = [_call_line(c.name or "?", c.input, c.finished) for c in calls]
    if calls[0].total > len(calls):
        lines.append(f"- … and {calls[0].total - len(calls)} later calls")
    return (f"{head} It had already made these tool calls (oldest first); their effects may already be in "
            f"place, so check before doing any of them again:\n{_bounded(lines)}")


def approval_question(brief: str) -> dict[str, Any]:
    """The card that asks the user to start a worker. Its brief is shown whole up to BRIEF_PREVIEW_CHARS; a longer one
    says so in the question itself, so an approval is never given for a tail the card hid (what runs is bound to
    the whole brief: receipts.mark)."""
    question = "The orchestrator wants to start a worker with this brief. Start it?"
    preview = brief
    if len(brief) > BRIEF_PREVIEW_CHARS:
        left = len(brief) - BRIEF_PREVIEW_CHARS
        question = (f"The orchestrator wants to start a worker with a brief of {len(brief):,} characters, too long to "
                    f"show whole: {left:,} are not shown here. Start it?")
        preview = f"{brief[:BRIEF_PREVIEW_CHARS]}\n\n… {left:,} more characters not shown"
    return {
        "question": question,
        "header": "Dispatch",
        "multiSelect": False,
        "options": [
            {"label": APPROVE, "description": "start the worker now", "preview": preview},
            {"label": REJECT, "description": "do not start it; the orchestrator hears your answer"},
        ],
    }
