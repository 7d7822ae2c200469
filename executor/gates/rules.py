"""Standing gate rules asked for from the page or the API (`gate_rule_queue`), applied by the executor; and
the record of calls whose approval card a killed executor left open."""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool

from executor.journal.writer import JournalWriter
from executor.sql import queries
from shared import consume, database, logs
from shared.listener import Subscription
from shared.models import NewEvent
from shared.query import Queries

log = logs.get(__name__)

RULE_QUEUE_POLL_S = 5.0  # backstop for notifications lost while the LISTEN connection was down

# an approval card's tool_use_id starts with this (the notifier names such cards)
CARD_PREFIX = "gate-"


async def apply_rule_requests(q: Queries, writer: JournalWriter) -> int:
    """Turn queued rule requests into gate_rules rows (journaled `gate.rule_added`); a request naming an
    unknown thread or project fails with the reason. The number handled."""
    claimed = await q.all("claim_gate_rule_requests")
    for req in claimed:
        params = {"id": req["id"], "status": "failed", "rule_id": None, "error": None}
        async with q.transaction() as tx:
            found = await tx.one("get_gate_rule_scope", req)
            if not (found or {}).get("found"):
                params["error"] = f"no {req['scope']} {req['thread_id'] or req['project_id']}"
            else:
                rule = await tx.one("insert_gate_rule", {
                    "scope": req["scope"], "session_id": req["thread_id"], "project_id": req["project_id"],
                    "task_id": None, "tool_name": req["tool_name"], "pattern": req["pattern"], "decision": "allow",
                    "category": None, "created_by": req["requested_by"]})
                assert rule is not None
                params |= {"status": "done", "rule_id": rule["id"]}
            await tx.execute("finish_gate_rule_request", params)
        if params["status"] == "done":
            await writer.put(NewEvent("gate.rule_added", {
                "rule_id": str(params["rule_id"]), "scope": req["scope"], "tool": req["tool_name"],
                "pattern": req["pattern"], "decision": "allow", "requested_by": req["requested_by"],
                "request_id": str(req["id"])}, tier="derived", session_id=req["thread_id"],
                project_id=req["project_id"]))
    return len(claimed)


async def record_orphaned_cards(q: Queries, writer: JournalWriter) -> int:
    """Journal the refusal of calls whose approval card died with a killed executor (the restart closed the
    card and crashed the task; the CLI's call failed, which it treats as a refusal)."""
    cards = await q.all("list_orphaned_gate_cards", {"card_prefix": CARD_PREFIX + "%"})
    for card in cards:
        gate = ((card["questions"] or [{}])[0]).get("gate") or {}
        await writer.write([NewEvent("gate.decided", {
            **{k: gate.get(k) for k in ("category", "label", "reason", "tool", "summary")},
            "tool_use_id": card["tool_use_id"].removeprefix(CARD_PREFIX), "question_id": str(card["id"]),
            "decision": "deny", "decided_by": "executor_restart"}, tier="derived", task_id=card["task_id"],
            session_id=card["session_id"], project_id=card["project_id"])])
    return len(cards)


async def run_rule_queue(pool: AsyncConnectionPool, writer: JournalWriter, sub: Subscription) -> None:
    """Apply rule requests as they are queued (woken by the gate_rule_queue channel); record the refusal of
    calls whose card a previous executor left open (the poll's)."""
    q = Queries(pool, queries)
    available = database.availability(pool)
    await available.retry(lambda: q.execute("requeue_gate_rule_requests"), "gate_rules")

    async def rule_requests() -> int:
        return await apply_rule_requests(q, writer)

    async def orphaned_cards() -> int:
        return await record_orphaned_cards(q, writer)

    await consume.consume("gate_rules", sub, {"gate_rule_queue": [rule_requests], consume.POLL_ONLY: [orphaned_cards]},
                          RULE_QUEUE_POLL_S, available)
