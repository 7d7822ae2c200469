"""Standing gate rules ("always allow `npm test` in this thread"): list, ask for one, revoke.

Asking for a rule only queues it (gate_rule_queue): the executor checks the scope, makes the rule and
journals it. Revoking is the one direct write (the revoked_* columns), as answering a question is.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.requests import Request
from starlette.responses import Response

from ingress.http import body, ingress_queries, path_uuid, query_bool, query_int, query_uuid, respond, who
from ingress.problems import Problem

# the tools the gate sees; a rule for any other name could never match a call
TOOLS = ("Bash", "Write", "Edit", "MultiEdit", "NotebookEdit", "Read")


class GateRuleIn(BaseModel):
    """A standing allow: `pattern` is the exact command (or path), or a command prefix ending in ':*' that
    covers one simple command only (`npm test:*` never covers `npm test && …`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tool_name: Literal[TOOLS] = "Bash"  # type: ignore[valid-type]
    pattern: str = Field(min_length=1, max_length=4000)
    thread_id: uuid.UUID | None = None
    project_id: uuid.UUID | None = None

    @model_validator(mode="after")
    def _one_scope(self) -> GateRuleIn:
        if (self.thread_id is None) == (self.project_id is None):
            raise ValueError("give exactly one of thread_id, project_id")
        if not self.pattern.strip() or self.pattern.strip() == ":*":
            raise ValueError("pattern may not be blank")
        return self


async def list_rules(request: Request) -> Response:
    params = {"thread_id": query_uuid(request, "thread_id"), "revoked": bool(query_bool(request, "revoked")),
              "limit": query_int(request, "limit", 100, lo=1, hi=500)}
    q = ingress_queries(request)
    return respond({"rules": await q.all("list_gate_rules", params),
                    "requests": await q.all("list_pending_gate_rule_requests", params)})


async def request_rule(request: Request) -> Response:
    rule = await body(request, GateRuleIn)
    row = await ingress_queries(request).one("enqueue_gate_rule", {
        "scope": "thread" if rule.thread_id else "project", "thread_id": rule.thread_id,
        "project_id": rule.project_id, "tool_name": rule.tool_name, "pattern": rule.pattern.strip(),
        "requested_by": who(request)})
    return respond(row, 202)


async def revoke_rule(request: Request) -> Response:
    rule_id = path_uuid(request, "rule_id")
    q = ingress_queries(request)
    found = await q.one("revoke_gate_rule", {"id": rule_id, "revoked_by": who(request)})
    if found is not None:
        return respond(found)
    if await q.one("check_gate_rule_exists", {"id": rule_id}) is not None:
        raise Problem(409, "the rule is already revoked")
    raise Problem(404, f"no gate rule {rule_id}")
