"""Who is calling the harness: a running task, as its per-spawn credential resolves it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling, as resolved from the per-spawn credential alone (never from what the call declares)."""

    task_id: uuid.UUID
    session_id: uuid.UUID
    # the orchestrator conversation the call belongs to: its own session for a turn, the dispatching
    # turn's session for a worker; None for a task outside any thread
    thread_id: uuid.UUID | None
    project_id: uuid.UUID | None
    role: str
