"""`petal-dispatch import-transcript`: journal a recorded stream-json file as one finished task."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, TypedDict

from psycopg_pool import AsyncConnectionPool

from executor.run import stream
from executor.run.task_store import TaskRows, TaskStore
from shared import journal
from shared.models import NewEvent


class _Ids(TypedDict):
    task_id: uuid.UUID
    session_id: uuid.UUID
    project_id: uuid.UUID | None

BATCH = 1000


def read_lines(path: Path) -> list[stream.Line]:
    # split on b"\n" only: tool output inside JSON strings carries \r\n
    return [stream.classify(raw) for raw in path.read_bytes().split(b"\n") if raw.strip()]


async def import_transcript(
    pool: AsyncConnectionPool, path: Path, *, project_id: uuid.UUID | None = None, role: str = "worker"
) -> dict[str, Any]:
    """All or nothing, in one transaction: the task, its session, every non-empty line, and the status
    the lines show (derived like a live run's, with no exit code; no result line means crashed)."""
    lines = read_lines(path)
    facts = stream.TurnFacts()
    for line in lines:
        facts.feed(line)
    outcome = stream.derive_status(None, facts, imported=True)
    task_id, session_id = uuid.uuid4(), uuid.uuid4()
    ids = _Ids(task_id=task_id, session_id=session_id, project_id=project_id)
    events = [NewEvent("task.spawned", {"imported": True, "source": str(path), "role": role}, **ids)]
    events += [NewEvent(line.event_type, line.payload, payload_json=line.payload_json, **ids) for line in lines]
    events.append(NewEvent("task.exited", {"imported": True, "status": outcome.status, "reason": outcome.reason,
                                           "lines": len(lines), "unparsed": facts.unparsed,
                                           "result": facts.result_summary(),
                                           "substrate_session_id": facts.substrate_session_id}, **ids))
    for event_type in sorted({line.event_type for line in lines}):
        await journal.register_event_type(pool, event_type, "raw", "stream-json line type seen first in an import")
    async with TaskStore(pool).q.transaction() as tx:
        await TaskRows(tx).insert_imported(
            task_id=task_id, session_id=session_id, project_id=project_id, role=role,
            brief=f"imported from {path.name}", status=outcome.status, reason=outcome.reason,
            substrate_session_id=facts.substrate_session_id)
        for i in range(0, len(events), BATCH):
            await journal.append_on(tx.conn, events[i : i + BATCH])
    return {"task_id": str(task_id), "events": len(lines), "unparsed": facts.unparsed, "status": outcome.status}
