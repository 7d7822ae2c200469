"""One run's state while its process lives (`Running`), its prompt fed, and its output read into the journal: each
read's stdout lines typed and queued together, each stderr line as a task.stderr."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from executor.journal.writer import JournalWriter
from executor.run import lineage, process, stream, substrate
from executor.sandbox.gateway import Gateway
from shared import journal
from shared.models import NewEvent


@dataclass
class Running:
    task_id: uuid.UUID
    session_id: uuid.UUID
    project_id: uuid.UUID | None
    role: str
    proc: asyncio.subprocess.Process
    started: float
    facts: stream.TurnFacts = field(default_factory=stream.TurnFacts)
    last_output: float = 0.0
    last_output_at: datetime | None = None
    output_dirty: bool = False
    stalled_since: float | None = None
    awaiting_user: bool = False
    chat: bool = False  # a thread turn a user's message started (executor/run/supervisor.py: its slots)
    stop_reason: str | None = None
    stop_asked: asyncio.Event = field(default_factory=asyncio.Event)  # the run's own coroutine carries it out
    killed: bool = False
    mcp_config: Path | None = None
    gateway: Gateway | None = None  # the sandbox's ways out, closed when the process has exited
    workdir: Path | None = None
    # the CLI conversation it speaks in and the CLI config it runs with (an adopted thread's own)
    cli_session: str | None = None
    substrate: substrate.SubstrateConfig | None = None
    revoke_pending: bool = False  # the database was away when its process exited: revoked once the end is recorded
    # row updates an outage held back, applied in order once the database is back
    unsaved: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    saving: bool = False
    spawned_id: uuid.UUID | None = None  # its task.spawned event: the parent of its task.exited
    tool_calls: dict[str, uuid.UUID] = field(default_factory=dict)  # tool_use_id → the line that made the call
    # the process's PETAL_TASK_ID and sandbox key: the task's id, or the warm process's own it was started with
    spawn_id: uuid.UUID | None = None

    @property
    def spawn_key(self) -> uuid.UUID:
        return self.spawn_id or self.task_id

    def event(self, event_type: str, payload: Any, created_at: datetime | None = None,
              payload_json: str | None = None, parent_id: uuid.UUID | None = None) -> NewEvent:
        """One of the run's journal events."""
        return NewEvent(event_type, payload, task_id=self.task_id, session_id=self.session_id,
                        project_id=self.project_id, created_at=created_at, payload_json=payload_json,
                        parent_id=parent_id)


async def feed_prompt(proc: asyncio.subprocess.Process, prompt: bytes) -> None:
    """The brief on the process's stdin, then end of input (`claude -p` reads its prompt from there)."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(prompt)
        await proc.stdin.drain()
        proc.stdin.close()
        await proc.stdin.wait_closed()
    except (BrokenPipeError, ConnectionResetError):
        pass  # it died before reading: its exit says why


async def read_stdout(r: Running, writer: JournalWriter, output_seen: Callable[[Running], Awaitable[None]]) -> None:
    """Every line the process prints, typed and journaled (each read's lines together), and its facts fed; told
    `output_seen` after each read that had lines."""
    assert r.proc.stdout is not None
    task_id, session_id, project_id = r.task_id, r.session_id, r.project_id
    async for chunk in process.iter_line_chunks(r.proc.stdout):
        events = []
        read_at = datetime.now(UTC)
        for raw, event_id in zip(chunk, journal.new_event_ids(len(chunk))):
            if not raw.strip():
                continue
            line = stream.classify(raw)
            r.facts.feed(line)
            parent = lineage.tool_parent(r.tool_calls, line.event_type, line.payload, event_id)
            # A line kept as printed is stored from its text: its parsed value is let go here rather
            # than held while queued (a flood's queued values cost more in garbage collection than in
            # parsing).
            events.append(NewEvent(line.event_type, line.payload if line.payload_json is None else None,
                                   task_id=task_id, session_id=session_id, project_id=project_id,
                                   created_at=read_at, payload_json=line.payload_json, parent_id=parent,
                                   event_id=event_id))
        if events:
            await output_seen(r)
            await writer.put_many(events)


async def read_stderr(r: Running, writer: JournalWriter) -> None:
    assert r.proc.stderr is not None
    async for raw in process.iter_lines(r.proc.stderr):
        if raw.strip():
            await writer.put(r.event("task.stderr", {"line": raw.decode("utf-8", "replace")}))
