"""The not-clean-return policy: what the harness does when a thread's worker ends other than `success`.

A declared table, status → rule. A rule's action is tried while its budget lasts (the budget counts
retries of one brief: attempt 1 is the first run); past the budget the end is escalated to the user.
The decision is code's, from the exit-derived status, never a model's; every one is journaled.
docs/threads.md ("Not-clean-return policy") documents this table; a test keeps the two in step.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from executor import gates

RETRY_SAME = "retry_same"  # run the same brief again
RETRY_MODIFIED = "retry_modified"  # run the brief again with the failed attempt's handoff appended
BACK_OFF = "back_off"  # run the same brief again after a growing delay
ESCALATE = "escalate"  # ask the user: Retry / Skip / Stop the plan
SKIP = "skip"  # give up on this brief; tell the orchestrator
REPORT = "report"  # a clean end: hand the result to the orchestrator

RETRIES = (RETRY_SAME, RETRY_MODIFIED, BACK_OFF)


@dataclass(frozen=True)
class Rule:
    action: str
    budget: int = 0  # retries allowed before escalating
    delay_factor: float = 0.0  # back-off: base delay × factor × 2^(retry-1)


POLICY: dict[str, Rule] = {
    "crashed": Rule(RETRY_SAME, budget=1),
    "failed": Rule(RETRY_MODIFIED, budget=1),
    # a budget (--max-turns, --max-budget-usd) stopped the run after a tool call completed (substrate)
    "partial": Rule(RETRY_MODIFIED, budget=1),
    "rate_limited": Rule(BACK_OFF, budget=3, delay_factor=1.0),
    "cancelled": Rule(SKIP),
    "skipped": Rule(SKIP),  # never started: its working directory is missing
    "gated": Rule(ESCALATE),
    "extraction_failed": Rule(ESCALATE),
}

# An orchestrator turn (role `orchestrator`) follows its own table: a turn is the user's messages, so a
# crash re-runs them once and a rate limit backs off; anything else (a failure, a spent budget) is the
# user's call. A turn the user stopped is left alone: its error record in the chat offers Retry.
TURN_POLICY: dict[str, Rule] = {
    "crashed": Rule(RETRY_SAME, budget=1),
    "rate_limited": Rule(BACK_OFF, budget=3, delay_factor=1.0),
    "cancelled": Rule(SKIP),
}

# The table each role follows (a role not named here follows the workers' table).
POLICIES: dict[str, dict[str, Rule]] = {"worker": POLICY, "orchestrator": TURN_POLICY}

# The answers an escalation offers, and what each does.
ESCALATION_RETRY, ESCALATION_SKIP, ESCALATION_STOP = "Retry", "Skip", "Stop the plan"
# an extraction failure: the worker's run is fine, so the extractor alone can run again (no side effects)
ESCALATION_REEXTRACT, ESCALATION_RETRY_WORKER = "Re-extract", "Retry worker"


@dataclass(frozen=True)
class Decision:
    status: str
    action: str
    attempt: int
    budget: int = 0
    delay_s: float = 0.0
    why: str = ""


def decide(status: str, attempt: int, backoff_base_s: float, *, started: bool = True,
           role: str = "worker") -> Decision:
    """The action for a worker's (or, with `role`, a turn's) end. `attempt` is the ended run's number
    (1 = first run); `started` is False when its process never ran (missing working directory, CLI
    missing, spawn error)."""
    if status == "success":
        return Decision(status, REPORT, attempt, why="a clean end")
    if not started and status != "cancelled":
        # the cause is the environment, not the run: a retry would meet it again, so the user decides
        return Decision(status, ESCALATE, attempt, why=f"{status}: the worker never started")
    table = POLICIES.get(role, POLICY)
    rule = table.get(status, Rule(ESCALATE))
    retries_used = attempt - 1
    if rule.action in RETRIES:
        if retries_used >= rule.budget:
            return Decision(status, ESCALATE, attempt, rule.budget,
                            why=f"{status}: the retry budget ({rule.budget}) is spent")
        delay = backoff_base_s * rule.delay_factor * 2 ** retries_used if rule.action == BACK_OFF else 0.0
        return Decision(status, rule.action, attempt, rule.budget, delay,
                        why=f"{status}: retry {retries_used + 1} of {rule.budget}")
    why = f"{status}: {'not in the table, so ' if status not in table else ''}{rule.action}"
    return Decision(status, rule.action, attempt, rule.budget, why=why)


# ---- gates ---------------------------------------------------------------------------------------------
# What a denied tool call tried to do, named by the gate classifier (executor/gates/classify.py) for the handoff's
# record. The exit's denial has no workdir: relative paths then count as inside the tree.
UNKNOWN_WORKDIR = "/nonexistent/petal-workdir"


def _verdict(denial: dict[str, Any], workdir: str | None) -> gates.Verdict:
    tool_input = denial.get("tool_input")
    return gates.classify(str(denial.get("tool_name") or "Bash"), tool_input if isinstance(tool_input, dict) else {},
                          workdir or UNKNOWN_WORKDIR, os.path.expanduser("~"))


def gate_of(denial: dict[str, Any], workdir: str | None = None) -> str:
    """The gate category a denied tool call falls in ('tool not allowed' when the classifier allows it)."""
    verdict = _verdict(denial, workdir)
    return verdict.label if verdict.gated else "tool not allowed"


def gate_decisions(denials: list[dict[str, Any]], workdir: str | None = None,
                   decided: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The handoff's gate-decision fields (code, not model): every gate the harness decided (gate.decided,
    allowed ones too), then the exit's permission denials the harness did not decide (the CLI's own)."""
    out = [_from_decided(g) for g in decided or [] if isinstance(g, dict)]
    seen = {g.get("tool_use_id") for g in decided or [] if isinstance(g, dict) and g.get("tool_use_id")}
    for d in denials:
        if not isinstance(d, dict) or (d.get("tool_use_id") and d.get("tool_use_id") in seen):
            continue
        summary = f"{d.get('tool_name', '?')}: {json.dumps(d.get('tool_input') or {}, ensure_ascii=False)[:300]}"
        verdict = _verdict(d, workdir)
        out.append({"decision_point": summary, "options": ["run it", "stay in scope"],
                    "chosen": "stay in scope (denied)", "gate": verdict.label if verdict.gated else "tool not allowed",
                    "reason": "the worker's allowed-tools set does not permit it", "tool": d.get("tool_name"),
                    "category": verdict.category if verdict.gated else None, "summary": summary,
                    "decision": "deny", "decided_by": "cli"})
    return out


def _from_decided(g: dict[str, Any]) -> dict[str, Any]:
    allowed = g.get("decision") == "allow"
    return {"decision_point": str(g.get("summary") or "?"), "options": ["run it", "stay in scope"],
            "chosen": f"run it (allowed by {g.get('decided_by')})" if allowed
            else f"stay in scope (denied by {g.get('decided_by')})",
            "gate": str(g.get("label") or g.get("category") or "?"), "reason": str(g.get("reason") or ""),
            "category": g.get("category"), "tool": g.get("tool"), "summary": g.get("summary"),
            "decision": g.get("decision"), "decided_by": g.get("decided_by")}
