"""The derived layer's write path: an extractor run per finished worker, and the validation gate.

The extractor is an ordinary task (role `extractor`, parent = the worker's task), journaled like any
other. It runs with `--json-schema`: the CLI then offers a StructuredOutput tool, checks the call's
input against the schema and lets the model correct itself within the run, and hands the object back
as `result.structured_output` — so no prose has to be parsed. That key is absent when the model never
produced a valid object: an extraction failure. The gate then validates the object again, here, with
jsonschema (the conclusion is checked by our code, not taken on the CLI's or the model's word).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from executor import dispatch, lineage, policy, substrate
from executor.journal_writer import JournalWriter
from executor.sql import queries
from shared import contract, logs
from shared.models import NewEvent

log = logs.get(__name__)

MAX_RESULT_CHARS = 20_000
MAX_MESSAGES = 6
MAX_MESSAGE_CHARS = 4_000


async def _one(pool: AsyncConnectionPool, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queries[name], params)
        return await cur.fetchone() if cur.description else None


async def _all(pool: AsyncConnectionPool, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queries[name], params)
        return await cur.fetchall()


def _texts(rows: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """(final result text, last assistant texts oldest first) from newest-first journal rows."""
    result = next((r["payload"].get("result") for r in rows
                   if r["event_type"] == "stream.result" and isinstance(r["payload"].get("result"), str)), "")
    messages = []
    for r in rows:
        if r["event_type"] != "stream.assistant":
            continue
        blocks = (r["payload"].get("message") or {}).get("content") or []
        text = "\n".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")
        if text.strip():
            messages.append(text[:MAX_MESSAGE_CHARS])
    return result[:MAX_RESULT_CHARS], list(reversed(messages[:MAX_MESSAGES]))


def prompt(brief: str, result: str, messages: list[str], fields: list[contract.ContractField]) -> str:
    lines = [f"- {f.field_key}{' (required)' if f.required else ''}: {f.semantics}" for f in fields]
    recent = "\n\n".join(f"[message {i + 1}]\n{m}" for i, m in enumerate(messages)) or "(none)"
    return (
        "Distil this worker's run into a handoff.\n\n"
        f"## What the worker was asked\n{brief}\n\n"
        f"## The worker's final report\n{result or '(no final report)'}\n\n"
        f"## Its last messages\n{recent}\n\n"
        "## The handoff's fields\n" + "\n".join(lines) + "\n\n"
        "Call the StructuredOutput tool once with these fields."
    )


async def request(pool: AsyncConnectionPool, worker_id: uuid.UUID, *, requested_by: str = "executor") -> uuid.UUID:
    """Queue an extractor run for a finished task; returns the extractor's task id."""
    worker = await _one(pool, "extraction_source", {"id": worker_id})
    if worker is None:
        raise dispatch.DispatchRefused(f"no task {worker_id}")
    version, fields = await contract.active(pool)
    schema = {**contract.schema_for(fields), "$comment": f"petal-dispatch contract version {version}"}
    result, messages = _texts(await _all(pool, "worker_texts", {"id": worker_id, "limit": 40}))
    return await dispatch.request_task(
        pool, role="extractor", brief=prompt(worker["brief"], result, messages, fields), project_id=worker["project_id"],
        parent_task_id=worker_id, plan_ref=worker["plan_ref"], json_schema=schema, requested_by=requested_by)


def _complaints(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        content = (r["payload"].get("message") or {}).get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result" and block.get("is_error"):
                text = block.get("content")
                out.append(text if isinstance(text, str) else json.dumps(text))
    return out


Report = Callable[[uuid.UUID, str, dict[str, Any]], Awaitable[None]]


async def gate(pool: AsyncConnectionPool, writer: JournalWriter, extractor: dict[str, Any],
               outcome: substrate.Outcome, facts: substrate.TurnFacts, report: Report | None = None) -> bool:
    """Validate an extractor's output; store the handoff or the failure. True when a handoff was stored."""
    worker = await _one(pool, "extraction_source", {"id": extractor["parent_task_id"]})
    if worker is None:
        log.error("extraction_without_worker", extractor=str(extractor["id"]))
        return False
    schema = extractor["json_schema"]
    structured = (facts.result or {}).get("structured_output")
    if structured is None:
        errors = [f"the extractor returned no structured output (its run ended {outcome.status}: {outcome.reason})"]
        errors += [f"the CLI said: {c[:500]}" for c in _complaints(await _all(pool, "schema_complaints",
                                                                              {"id": extractor["id"]}))]
    elif not isinstance(structured, dict):
        errors = [f"(root): the output is {type(structured).__name__}, not a JSON object"]
    else:
        errors = contract.validate(schema, structured)
    seqs = await _one(pool, "raw_seq_range", {"id": worker["id"]})
    first, last = (seqs["min"], seqs["max"]) if seqs else (None, None)
    common = {"worker_task_id": str(worker["id"]), "extractor_task_id": str(extractor["id"]),
              "raw_seq_range": [first, last], "contract": schema.get("$comment")}
    ids = {"task_id": worker["id"], "session_id": worker["session_id"], "project_id": worker["project_id"],
           # under the extraction run that produced it (see executor/lineage.py)
           "parent_id": await lineage.task_exit_event(pool, extractor["id"])}
    if errors:
        async with pool.connection() as conn:
            await conn.execute(queries["mark_extraction_failed"], {"id": worker["id"], "reason": errors[0][:200]})
        await writer.write([NewEvent("handoff.extraction_failed", {"errors": errors, **common}, tier="derived",
                                     **ids)])
        log.info("extraction_failed", worker=str(worker["id"]), errors=errors[:3])
        if report is not None:
            await report(worker["id"], "handoff.extraction_failed", {"status": "extraction_failed", "errors": errors})
        return False
    handoff = dict(structured)
    claimed = handoff.get("status")
    handoff["status"] = worker["status"]  # the exit-derived status, never the model's claim
    if claimed is not None and claimed != worker["status"]:
        handoff["claimed_status"] = claimed
    if worker["status"] == "gated":  # the gate evidence comes from the exit's record, not the model
        denials = await _one(pool, "exit_denials", {"id": worker["id"]})
        handoff["gate_decisions"] = policy.gate_decisions((denials or {}).get("denials") or [],
                                                          (denials or {}).get("workdir"))
    await writer.write([NewEvent("handoff", {**handoff, **common}, tier="derived", **ids)])
    if report is not None:
        await report(worker["id"], "handoff", handoff)
    return True


def exit_hook(pool: AsyncConnectionPool, writer: JournalWriter, report: Report | None = None) -> Any:
    """The supervisor's exit hook: extract finished runs whose role says so; gate finished extractors."""

    async def on_exit(row: dict[str, Any], outcome: substrate.Outcome, facts: substrate.TurnFacts) -> None:
        if row.get("json_schema") is not None and row.get("parent_task_id") is not None:
            await gate(pool, writer, row, outcome, facts, report)
            return
        source = await _one(pool, "extraction_source", {"id": row["id"]})
        if source and source["extract_on_exit"] and (facts.result_text.strip() or facts.lines):
            await request(pool, row["id"])
        elif report is not None:  # nothing to extract: the end itself is what there is to act on
            await report(row["id"], "task.exited", {"status": outcome.status, "reason": outcome.reason})

    return on_exit
