"""Scripted-model scenarios the tests share: one builder instead of the same rule block in every file.

The common story: the orchestrator dispatches one worker (and acknowledges the harness's report of its
end), the worker replies, and the extractor returns a handoff. Rules are tried in order, so `before`
rules (a `match_last` on a later turn, say) take precedence over the story's own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from petal_dispatch.demo.scripted_model import Rule, Scenario

# a reply that never ends: the worker hangs until it is stopped
STALL_FOREVER: dict[str, Any] = {"stall": {"seconds": None}}


def dispatch(brief: str, **tool_input: Any) -> dict[str, Any]:
    """The orchestrator's `dispatch_worker` call (`plan_ref`, `needs_approval` … as extra input)."""
    return {"tool_use": {"name": "mcp__harness__dispatch_worker", "input": {"brief": brief, **tool_input}}}


def handoff(goal: str, current_state: str = "finished", *, next_step: str = "none", status: str = "success",
            **fields: Any) -> dict[str, Any]:
    """A handoff that passes extraction's validation (`ruled_out` and `artifacts` empty unless given)."""
    return {"goal": goal, "current_state": current_state, "next_step": next_step, "ruled_out": [],
            "status": status, "artifacts": [], **fields}


def extractor(result: dict[str, Any], match: str | None = None) -> Rule:
    """The extractor's reply: the handoff as its structured output (only to a brief holding `match`, if given)."""
    return Rule(role="extractor", match=match,
                replies=[{"tool_use": {"name": "StructuredOutput", "input": result}}, {"text": "ok"}])


def one_worker(brief: str, *worker: dict[str, Any], said: str = "dispatched", noted: str | None = "noted",
               first_run: list[dict[str, Any]] | None = None, result: dict[str, Any] | None = None,
               before: Iterable[Rule] = (), dispatch_input: dict[str, Any] | None = None) -> Scenario:
    """The orchestrator dispatches `brief` (with `dispatch_input`: `allowed_tools` …) and says `said`; the
    worker replies `worker` (after `first_run` on its first conversation only, e.g. a hang a retry gets
    past); the extractor returns `result`; the orchestrator answers the harness's report with `noted`
    (None: no such rule)."""
    rules = list(before)
    if noted is not None:
        rules.append(Rule(role="orchestrator", match_last="[harness]", replies=[{"text": noted}]))
    rules.append(Rule(role="orchestrator", replies=[dispatch(brief, **(dispatch_input or {})), {"text": said}]))
    if first_run is not None:
        rules.append(Rule(role="worker", sessions=1, replies=first_run))
    rules.append(Rule(role="worker", replies=list(worker) or [{"text": "done"}]))
    if result is not None:
        rules.append(extractor(result))
    return Scenario(rules=rules)
