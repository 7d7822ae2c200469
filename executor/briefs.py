"""A worker's brief as the harness sends it: the orchestrator's text, plus what the store already knows.

The additions are bounded (a brief is a prompt, not a transcript): the plan task's earlier handoffs,
newest first, and the approaches already ruled out in the scope.
"""

from __future__ import annotations

import uuid
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from executor.sql import queries

MAX_HANDOFFS = 3
MAX_RULE_OUTS = 10
SECTION_CHARS = 1_500
APPROVE, REJECT = "Approve", "Reject"


async def _rows(pool: AsyncConnectionPool, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queries[name], params)
        return await cur.fetchall()


def _bounded(lines: list[str]) -> str:
    out, used = [], 0
    for line in lines:
        if used + len(line) > SECTION_CHARS:
            out.append(f"- … ({len(lines) - len(out)} more left out)")
            break
        out.append(line)
        used += len(line) + 1
    return "\n".join(out)


async def enrich(pool: AsyncConnectionPool, brief: str, *, scope: uuid.UUID, project_id: uuid.UUID | None,
                 plan_ref: str | None) -> str:
    sections = []
    if project_id is not None and plan_ref:
        handoffs = await _rows(pool, "plan_task_handoffs", {"project_id": project_id, "plan_ref": plan_ref,
                                                            "limit": MAX_HANDOFFS})
        lines = [f"- [{h['payload'].get('status', '?')}] {h['payload'].get('current_state', '')} "
                 f"(next: {h['payload'].get('next_step', '')})" for h in handoffs]
        if lines:
            sections.append(f"## Earlier handoffs for {plan_ref} (newest first)\n{_bounded(lines)}")
    rule_outs = await _rows(pool, "scope_rule_outs", {"scope": scope, "limit": MAX_RULE_OUTS})
    if rule_outs:
        lines = [f"- {r['approach']} — {r['reason']}" for r in rule_outs]
        sections.append(f"## Already ruled out here (do not retry these)\n{_bounded(lines)}")
    return "\n\n".join([brief, *sections]) if sections else brief


def approval_question(brief: str) -> dict[str, Any]:
    return {
        "question": "The orchestrator wants to start a worker with this brief. Start it?",
        "header": "Dispatch",
        "multiSelect": False,
        "options": [
            {"label": APPROVE, "description": "start the worker now", "preview": brief[:4_000]},
            {"label": REJECT, "description": "do not start it; the orchestrator hears your answer"},
        ],
    }
