"""The derived read surface both services serve: handoffs by scope, a project's rollup, rule-outs.

Readers are shape-tolerant: they return whatever fields a handoff carries.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from psycopg_pool import AsyncConnectionPool

from shared.models import ACTIVE_STATUSES
from shared.query import Queries
from shared.sql import queries

# A rule-out matches a candidate when this share of its approach's words appear in the candidate.
RULE_OUT_OVERLAP = 0.6
# get_project_state's answer stays under this many characters (a few hundred tokens).
STATE_BUDGET = 1_800
_PLAN_LINE = re.compile(r"^\s*[-*] \[([ xX])\] ([A-Z][A-Z0-9]*-\d+)\b[:\s]*(.*)$", re.MULTILINE)


async def get_handoffs(pool: AsyncConnectionPool, scope_id: uuid.UUID, limit: int = 10,
                       order: str = "desc") -> list[dict[str, Any]]:
    """Handoffs of a task, session (with the workers it dispatched) or project; newest first by default."""
    if order not in ("asc", "desc"):
        raise ValueError("order is asc or desc")
    rows = await Queries(pool, queries).all("list_handoffs", {"scope": scope_id, "limit": limit})
    return rows if order == "desc" else list(reversed(rows))


def plan_tasks(plan: str | None) -> list[tuple[str, str, bool]]:
    """(id, title, checked) for each `- [ ] T-001 title` line of a markdown plan."""
    return [(m.group(2), m.group(3).strip(), m.group(1).lower() == "x") for m in _PLAN_LINE.finditer(plan or "")]


async def get_project_state(pool: AsyncConnectionPool, project_id: uuid.UUID) -> dict[str, Any] | None:
    """Plan tasks done / in flight / failed / blocked / not started — a rollup bounded to about
    STATE_BUDGET characters however many tasks there are (lists are cut, counts stay exact)."""
    q = Queries(pool, queries)
    project = await q.one("get_project", {"id": project_id})
    if project is None:
        return None
    plan = plan_tasks(project["plan"])
    latest = {t["plan_ref"] or str(t["id"]): t for t in await q.all("list_project_latest_tasks", {"id": project_id})}
    buckets: dict[str, list[str]] = {"done": [], "in_flight": [], "failed": [], "blocked": [], "not_started": []}
    for ref, t in latest.items():
        if t["status"] == "success":
            buckets["done"].append(ref)
        elif t["status"] in ACTIVE_STATUSES:
            buckets["blocked" if t["activity"] in ("stalled", "awaiting_user") else "in_flight"].append(ref)
        elif t["status"] in ("gated", "skipped"):
            buckets["blocked"].append(f"{ref} ({t['status']})")
        else:
            buckets["failed"].append(f"{ref} ({t['status']})")
    buckets["not_started"] = [ref for ref, _, checked in plan if ref not in latest and not checked]
    counts = {k: len(v) for k, v in buckets.items()}
    state: dict[str, Any] = {"project": {"id": str(project["id"]), "name": project["name"]},
                             "plan_tasks": len(plan), "counts": counts, **buckets}
    # keep the rollup small: trim the longest lists until it fits the budget
    while len(json.dumps(state)) > STATE_BUDGET:
        longest = max(buckets, key=lambda k: len(state[k]))
        if not state[longest]:
            break
        state[longest] = state[longest][: len(state[longest]) // 2]
        state["truncated"] = True
    return state


async def check_ruled_out(pool: AsyncConnectionPool, scope_id: uuid.UUID, candidate: str) -> list[dict[str, Any]]:
    """Prior rule-outs in the scope similar to the candidate approach (a word-overlap lookup)."""
    rows = await Queries(pool, queries).all("list_matching_rule_outs", {"scope": scope_id, "candidate": candidate})
    return [r for r in rows if r["overlap"] >= RULE_OUT_OVERLAP]
