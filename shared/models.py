"""Records as typed values. NewEvent is the append hot path (a slotted dataclass, no validation);
the read models are pydantic. And the one definition of a task's statuses."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict

Tier = Literal["raw", "derived"]

# A task's statuses, as the `task_statuses` table holds them (migrations/0001_journal.sql; the store tier
# compares the two): it waits, runs, then ends in a final status, which never changes afterwards.
ACTIVE_STATUSES: Final = ("pending", "running")
FINAL_STATUSES: Final = ("success", "failed", "crashed", "cancelled", "rate_limited", "partial", "skipped", "gated",
                         "extraction_failed")


@dataclass(frozen=True, slots=True)
class NewEvent:
    """One journal record to append. `seq` is assigned by the journal, never by the caller."""

    event_type: str
    payload: Any = field(default_factory=dict)
    tier: Tier = "raw"
    project_id: uuid.UUID | None = None
    session_id: uuid.UUID | None = None
    task_id: uuid.UUID | None = None
    parent_id: uuid.UUID | None = None
    message_id: uuid.UUID | None = None
    created_at: datetime | None = None
    event_id: uuid.UUID = field(default_factory=uuid.uuid4)
    # The payload's JSON text when the caller already has it (a stream line as printed), so it is
    # stored without being serialised again. Must encode the same value as `payload`, or `payload` is None:
    # a stream line's parsed value is let go once read, so a flood's queue holds only text.
    payload_json: str | None = None


class Event(BaseModel):
    model_config = ConfigDict(frozen=True)

    event_id: uuid.UUID
    seq: int
    project_id: uuid.UUID | None
    session_id: uuid.UUID | None
    task_id: uuid.UUID | None
    parent_id: uuid.UUID | None
    message_id: uuid.UUID | None
    event_type: str
    tier: Tier
    created_at: datetime
    payload: Any


class ContractField(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: int
    field_key: str
    required: bool
    read_by: list[str]
    semantics: str
    shape: dict[str, Any]
    supersedes: int | None
    retired: bool
    created_at: datetime
