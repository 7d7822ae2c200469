"""The journal's execution tree (`parent_id`), written where an event is built. See docs/api.md.

- a worker's `task.spawned` → the orchestrator's `stream.assistant` event holding the dispatch tool call
  (the harness records the call's tool_use_id with the dispatch);
- an extractor's `task.spawned` → its worker's `task.exited`;
- a task's `task.exited` → its own `task.spawned`;
- a `stream.user` line carrying tool results → the `stream.assistant` line holding the tool call;
- a `handoff` / `handoff.extraction_failed` → the extractor's `task.exited`.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from psycopg_pool import AsyncConnectionPool

from executor.run.task_store import TaskStore

# The dispatching tool call's line and the MCP call race to the journal (the CLI prints the line, then
# calls the tool); at spawn the line is nearly always there already, else wait this long for it.
CALL_WAIT_S = 2.0
CALL_POLL_S = 0.1


async def spawn_parent(pool: AsyncConnectionPool, task_id: uuid.UUID, parent_task_id: uuid.UUID | None, *,
                       extractor: bool) -> uuid.UUID | None:
    """The event a task's `task.spawned` hangs under (None for a root: a turn, a plain dispatch)."""
    if parent_task_id is None:
        return None
    rows = TaskStore(pool).rows
    if extractor:  # under the run it distils
        return await rows.exit_event(parent_task_id)
    if not await rows.dispatch_tool_use(task_id):
        return None
    for _ in range(int(CALL_WAIT_S / CALL_POLL_S)):
        found = await rows.dispatching_call(task_id)
        if found is not None:
            return found
        await asyncio.sleep(CALL_POLL_S)
    return None


# the tool calls a run's lines are linked to, at most, and the longest id remembered
MAX_CALLS = 10_000
MAX_CALL_ID = 128


def tool_parent(calls: dict[str, uuid.UUID], event_type: str, payload: Any, event_id: uuid.UUID) -> uuid.UUID | None:
    """Remember an assistant line's tool calls; answer a tool-result line's parent (its call's line)."""
    content = (payload.get("message") or {}).get("content") if isinstance(payload, dict) else None
    if not isinstance(content, list):
        return None
    blocks = [b for b in content if isinstance(b, dict)]
    if event_type == "stream.assistant":
        for b in blocks:
            call = b.get("id")
            # the line is the spawn's word: an id as the CLI makes them (toolu_…, some 30 characters), and a run's
            # worth of them, are what is remembered until its end
            if b.get("type") == "tool_use" and isinstance(call, str) and len(call) <= MAX_CALL_ID and \
                    len(calls) < MAX_CALLS:
                calls[call] = event_id
        return None
    if event_type == "stream.user":
        for b in blocks:
            if b.get("type") == "tool_result" and b.get("tool_use_id") in calls:
                return calls[b["tool_use_id"]]
    return None
