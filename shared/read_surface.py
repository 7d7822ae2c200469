"""The derived read surface both services serve: handoffs by scope, a project's rollup, rule-outs.

Readers are shape-tolerant: they return whatever fields a handoff carries.
"""

from __future__ import annotations

import uuid
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from shared.sql import queries

# A rule-out matches a candidate when this share of its approach's words appear in the candidate.
RULE_OUT_OVERLAP = 0.6


async def _rows(pool: AsyncConnectionPool, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queries[name], params)
        return await cur.fetchall()


async def get_handoffs(pool: AsyncConnectionPool, scope_id: uuid.UUID, limit: int = 10) -> list[dict[str, Any]]:
    return await _rows(pool, "handoffs_for_scope", {"scope": scope_id, "limit": limit})


async def get_project_state(pool: AsyncConnectionPool, project_id: uuid.UUID) -> dict[str, Any] | None:
    """Plan tasks done / in flight / failed / blocked: a bounded rollup (the latest run of each)."""
    project = await _rows(pool, "project_by_id", {"id": project_id})
    if not project:
        return None
    buckets: dict[str, list[str]] = {"done": [], "in_flight": [], "failed": [], "blocked": []}
    for t in await _rows(pool, "project_latest_tasks", {"id": project_id}):
        ref = t["plan_ref"] or str(t["id"])
        if t["status"] == "success":
            buckets["done"].append(ref)
        elif t["status"] in ("pending", "running"):
            buckets["blocked" if t["activity"] in ("stalled", "awaiting_user") else "in_flight"].append(ref)
        elif t["status"] in ("gated", "skipped"):
            buckets["blocked"].append(ref)
        else:
            buckets["failed"].append(f"{ref} ({t['status']})")
    return {"project": project[0], **{k: v[:50] for k, v in buckets.items()},
            "counts": {k: len(v) for k, v in buckets.items()}}


async def check_ruled_out(pool: AsyncConnectionPool, scope_id: uuid.UUID, candidate: str) -> list[dict[str, Any]]:
    """Prior rule-outs in the scope similar to the candidate approach (a word-overlap lookup)."""
    rows = await _rows(pool, "matching_rule_outs", {"scope": scope_id, "candidate": candidate})
    return [r for r in rows if r["overlap"] >= RULE_OUT_OVERLAP]
