"""The derived layer's write path: an extractor run per finished worker, and the validation of its output.

The extractor is an ordinary task (role `extractor`, parent = the worker's task), journaled like any
other. It runs with `--json-schema`: the CLI then offers a StructuredOutput tool, checks the call's
input against the schema and lets the model correct itself within the run, and hands the object back
as `result.structured_output` — so no prose has to be parsed. That key is absent when the model never
produced a valid object: an extraction failure. `validate` then checks the object again, here, with
jsonschema (the conclusion is checked by our code, not taken on the CLI's or the model's word).

Both are settle steps: they take the settler's unit of work (shared/work.py) and read and write through the
settle store (executor/settle/store.py), so what they record commits with the end's settlement.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from executor.projects import worktrees
from executor.settle import dispatch, policy
from executor.settle.store import Ended, SettleStore, LineText
from shared import contract, logs
from shared.models import ContractField, NewEvent
from shared.work import Work

log = logs.get(__name__)

MAX_RESULT_CHARS = 20_000
MAX_MESSAGES = 6
MAX_MESSAGE_CHARS = 4_000
# the largest structured output taken as a handoff (its line is the spawn's word: up to 64 MiB)
MAX_OUTPUT_BYTES = 1024 * 1024


def _texts(rows: list[LineText]) -> tuple[str, list[str]]:
    """(final result text, last assistant texts oldest first) from newest-first rows (cut by the store already)."""
    result = next((r.text for r in rows if r.event_type == "stream.result" and r.text is not None), "")
    messages = [r.text[:MAX_MESSAGE_CHARS] for r in rows
                if r.event_type == "stream.assistant" and r.text is not None and r.text.strip()]
    return result, list(reversed(messages[:MAX_MESSAGES]))


def prompt(brief: str, result: str, messages: list[str], fields: list[ContractField]) -> str:
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
    """Queue an extractor run for a finished task; returns the extractor's task id.

    Raises:
        DispatchRefused: there is no such task.
    """
    async with SettleStore.over(pool).work() as (_, unit):
        return await request_on(unit, worker_id, requested_by=requested_by)


async def request_on(unit: Work, worker_id: uuid.UUID, *, requested_by: str = "executor") -> uuid.UUID:
    """Request an extractor task for a finished task in the caller's unit of work (the supervisor claims it
    once that commits); returns its id.

    Raises:
        DispatchRefused: there is no such task.
    """
    store = SettleStore(unit)
    worker = await store.extraction_source(worker_id)
    if worker is None:
        raise dispatch.DispatchRefused(f"no task {worker_id}")
    version, fields = await contract.active_on(unit.conn)
    schema = {**contract.schema_for(fields), "$comment": f"petal-dispatch contract version {version}"}
    result, messages = _texts(await store.worker_texts(worker_id, 40, MAX_RESULT_CHARS))
    return await dispatch.request_task(unit, dispatch.TaskRequest(
        "extractor", prompt(worker.brief, result, messages, fields), project_id=worker.project_id,
        parent_task_id=worker_id, plan_ref=worker.plan_ref, json_schema=schema, requested_by=requested_by))


def verdict(schema: dict[str, Any], structured: Any, ended: str, complaints: list[str]) -> list[str]:
    """Why the extractor's output fails validation (empty when it passes). `ended` says how its run ended,
    `complaints` what the CLI told it about its StructuredOutput calls (pure; no I/O)."""
    if structured is None:
        return ([f"the extractor returned no structured output (its run ended {ended})"]
                + [f"the CLI said: {c[:500]}" for c in complaints])
    if not isinstance(structured, dict):
        return [f"(root): the output is {type(structured).__name__}, not a JSON object"]
    return contract.validate(schema, structured)


def handoff_of(structured: dict[str, Any], worker_status: str, denials: list[Any],
               workdir: str | None = None, decided: list[Any] | None = None) -> dict[str, Any]:
    """The stored handoff: the model's fields, with the status (and gate evidence) from the exit's record.

    Gate evidence goes on every gated run, and on any run whose calls were decided at a gate (`decided`:
    the harness's own `gate.decided` records)."""
    handoff = dict(structured)
    claimed = handoff.get("status")
    handoff["status"] = worker_status  # the exit-derived status, never the model's claim
    if claimed is not None and claimed != worker_status:
        handoff["claimed_status"] = claimed
    if worker_status == "gated" or decided:
        handoff["gate_decisions"] = policy.gate_decisions([d for d in denials if isinstance(d, dict)], workdir,
                                                          decided)
    return handoff


@dataclass(frozen=True)
class Validated:
    """What validation concluded about a worker's run: the record it stored (its events are in the unit)."""

    worker_id: uuid.UUID
    record_type: str  # handoff or handoff.extraction_failed
    payload: dict[str, Any]


async def _output(store: SettleStore, extractor: Ended, schema: dict[str, Any]) -> tuple[Any, list[str]]:
    """The extractor's structured output and why it fails validation (read bounded: it is the spawn's word)."""
    found = await store.task_result(extractor.id, MAX_OUTPUT_BYTES)
    structured = found.structured_output if found else None
    size = found.structured_bytes if found else None
    if size is not None and size > MAX_OUTPUT_BYTES:
        return None, [f"the extractor's structured output is {size:,} bytes of JSON, over the {MAX_OUTPUT_BYTES:,} "
                      "a handoff may hold"]
    complaints = [] if structured is not None else await store.schema_complaints(extractor.id, 20, 500)
    return structured, verdict(schema, structured, f"{extractor.status}: {extractor.status_reason}", complaints)


async def validate(unit: Work, extractor: Ended) -> Validated | None:
    """Validate an ended extractor's output in `unit`, emitting the handoff (or its failure) into it; mark its
    worker extraction_failed when it fails. None when the worker is gone."""
    store = SettleStore(unit)
    assert extractor.parent_task_id is not None and extractor.json_schema is not None  # an extractor's end
    worker = await store.extraction_source(extractor.parent_task_id)
    if worker is None:
        log.error("extraction_without_worker", extractor=str(extractor.id))
        return None
    schema = extractor.json_schema
    structured, errors = await _output(store, extractor, schema)
    first, last = await store.raw_seq_range(worker.id)
    common = {"worker_task_id": str(worker.id), "extractor_task_id": str(extractor.id),
              "raw_seq_range": [first, last], "contract": schema.get("$comment")}
    ids: dict[str, Any] = {"task_id": worker.id, "session_id": worker.session_id, "project_id": worker.project_id,
                           # under the extraction run that produced it (see executor/run/lineage.py)
                           "parent_id": extractor.exit_event}
    if errors:
        await store.mark_extraction_failed(worker.id, errors[0][:200])
        log.info("extraction_failed", worker=str(worker.id), errors=errors[:3])
        unit.emit(NewEvent("handoff.extraction_failed", {"errors": errors, **common}, tier="derived", **ids))
        return Validated(worker.id, "handoff.extraction_failed", {"status": "extraction_failed", "errors": errors})
    assert isinstance(structured, dict)  # the verdict passed it
    status = worker.status
    if status == "extraction_failed":  # a re-extraction passed: the worker's own end counts again
        status = await store.restore_exit_status(worker.id) or status
    # the gate evidence comes from the harness's and the exit's records, not the model
    denials = await store.exit_denials(worker.id)
    handoff = handoff_of(structured, status, (denials.denials if denials else None) or [],
                         denials.workdir if denials else None, denials.decided if denials else None)
    checked = await SettleStore(unit).review_target(worker.id)
    if checked is not None and checked.check:  # the project's check, as code ran it (not the model's word)
        c = checked.check
        handoff["check"] = {"command": c.get("command"), "passed": c.get("passed"), "exit_code": c.get("exit_code"),
                            "duration_s": c.get("duration_s"), "fix_rounds": checked.check_round,
                            "tail": (c.get("tail") or [])[-20:]}
    recorded = await worktrees.artifacts(unit.conn, worker.id)  # a project worker's changes, as code recorded them
    if recorded:
        handoff["artifacts"] = [*(handoff.get("artifacts") or []), *recorded]
    unit.emit(NewEvent("handoff", {**handoff, **common}, tier="derived", **ids))
    return Validated(worker.id, "handoff", handoff)
