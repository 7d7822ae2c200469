"""Records as typed values. NewEvent is the append hot path (a slotted dataclass, no validation);
the read models are pydantic, for the API and the MCP tools."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Tier = Literal["raw", "derived"]


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


class Task(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: uuid.UUID
    project_id: uuid.UUID | None
    session_id: uuid.UUID | None
    parent_task_id: uuid.UUID | None
    role: str
    brief: str
    plan_ref: str | None
    status: str
    activity: str | None
    status_reason: str | None
    exit_code: int | None
    exit_signal: int | None
    pid: int | None
    attempt: int
    last_output_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None


class Session(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: uuid.UUID
    project_id: uuid.UUID | None
    role: str
    lifecycle: str
    title: str | None
    mode: str | None
    substrate_session_id: str | None
    created_at: datetime
    updated_at: datetime


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


class Question(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: uuid.UUID
    tool_use_id: str | None
    source_session_uuid: uuid.UUID | None
    task_id: uuid.UUID | None
    questions: list[dict[str, Any]]
    status: Literal["pending", "answered", "cancelled"]
    answers: dict[str, Any] | None
    response: str | None
    created_at: datetime
    answered_at: datetime | None
