"""Standing gate rules asked for from the page or the API (`gate_rule_queue`), applied by the executor; and
the record of calls whose approval card a killed executor left open. Rows through `GateStore`
(executor/gates/store.py)."""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool

from executor.gates.store import GateStore, NewRule
from executor.journal.writer import JournalWriter
from shared import consume, database, logs
from shared.listener import Subscription
from shared.models import NewEvent

log = logs.get(__name__)

RULE_QUEUE_POLL_S = 5.0  # backstop for notifications lost while the LISTEN connection was down

# an approval card's tool_use_id starts with this (the notifier names such cards)
CARD_PREFIX = "gate-"


async def apply_rule_requests(store: GateStore, writer: JournalWriter) -> int:
    """Turn queued rule requests into gate_rules rows (journaled `gate.rule_added`); a request naming an
    unknown thread or project fails with the reason. The number handled."""
    claimed = await store.claim_rule_requests()
    for req in claimed:
        status, rule_id, error = "failed", None, None
        async with store.work() as (inside, _):
            if not await inside.rule_scope_exists(req):
                error = f"no {req.scope} {req.thread_id or req.project_id}"
            else:
                rule_id = await inside.insert_rule(NewRule(
                    req.scope, req.tool_name, req.pattern, "allow", req.requested_by, session_id=req.thread_id,
                    project_id=req.project_id))
                status = "done"
            await inside.finish_rule_request(req.id, status=status, rule_id=rule_id, error=error)
        if status == "done":
            await writer.put(NewEvent("gate.rule_added", {
                "rule_id": str(rule_id), "scope": req.scope, "tool": req.tool_name,
                "pattern": req.pattern, "decision": "allow", "requested_by": req.requested_by,
                "request_id": str(req.id)}, tier="derived", session_id=req.thread_id, project_id=req.project_id))
    return len(claimed)


async def record_orphaned_cards(store: GateStore, writer: JournalWriter) -> int:
    """Journal the refusal of calls whose approval card died with a killed executor (the restart closed the
    card and crashed the task; the CLI's call failed, which it treats as a refusal)."""
    cards = await store.orphaned_cards(CARD_PREFIX)
    for card in cards:
        gate = ((card.questions or [{}])[0]).get("gate") or {}
        await writer.write([NewEvent("gate.decided", {
            **{k: gate.get(k) for k in ("category", "label", "reason", "tool", "summary")},
            "tool_use_id": card.tool_use_id.removeprefix(CARD_PREFIX), "question_id": str(card.id),
            "decision": "deny", "decided_by": "executor_restart"}, tier="derived", task_id=card.task_id,
            session_id=card.session_id, project_id=card.project_id)])
    return len(cards)


async def run_rule_queue(pool: AsyncConnectionPool, writer: JournalWriter, sub: Subscription) -> None:
    """Apply rule requests as they are queued (woken by the gate_rule_queue channel); record the refusal of
    calls whose card a previous executor left open (the poll's)."""
    store = GateStore.over(pool)
    available = database.availability(pool)
    await available.retry(store.requeue_rule_requests, "gate_rules")

    async def rule_requests() -> int:
        return await apply_rule_requests(store, writer)

    async def orphaned_cards() -> int:
        return await record_orphaned_cards(store, writer)

    await consume.consume("gate_rules", sub, {"gate_rule_queue": [rule_requests], consume.POLL_ONLY: [orphaned_cards]},
                          RULE_QUEUE_POLL_S, available)
