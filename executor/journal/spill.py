"""The journal writer's spill: a file-backed FIFO of what the writer could not journal while the database
was away (one JSON line per put item), read back in order when it returns, and adopted at the next start
if the executor stopped first."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from shared import journal
from shared.journal import Appended
from shared.models import NewEvent

SPILL_NAME = "journal-spill.jsonl"

Item = tuple[Sequence[NewEvent], "asyncio.Future[Appended] | None"]
_Item = Item


def _opt_uuid(value: str | None) -> uuid.UUID | None:
    return uuid.UUID(value) if value else None


def _encode(events: Sequence[NewEvent], stamp: datetime) -> str:
    return json.dumps([{
        "event_id": str(e.event_id), "event_type": e.event_type, "tier": e.tier,
        "project_id": str(e.project_id) if e.project_id else None,
        "session_id": str(e.session_id) if e.session_id else None,
        "task_id": str(e.task_id) if e.task_id else None,
        "parent_id": str(e.parent_id) if e.parent_id else None,
        "message_id": str(e.message_id) if e.message_id else None,
        # the time it was put, not the time the database came back
        "created_at": (e.created_at or stamp).isoformat(),
        "payload_json": e.payload_json if e.payload_json is not None else journal.encode_payload(e.payload),
    } for e in events], ensure_ascii=False)


def _payload(text: str) -> Any:
    """A spilled event's payload again. The write takes `payload_json` as it is; None when it cannot be parsed here
    (a line nested past json's recursion limit, which orjson took as storable up to its own): a spilled line must
    never stop the writer."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _decode(line: str) -> list[NewEvent]:
    return [NewEvent(
        d["event_type"], _payload(d["payload_json"]), tier=d["tier"], project_id=_opt_uuid(d["project_id"]),
        session_id=_opt_uuid(d["session_id"]), task_id=_opt_uuid(d["task_id"]), parent_id=_opt_uuid(d["parent_id"]),
        message_id=_opt_uuid(d["message_id"]), created_at=datetime.fromisoformat(d["created_at"]),
        event_id=uuid.UUID(d["event_id"]), payload_json=d["payload_json"],
    ) for d in json.loads(line)]


class Spill:
    """A file-backed FIFO of put items: appended at the end, read from a cursor, removed once drained.

    Each line is one item's events; its future (if any) stays in memory, keyed by the line's number.
    """

    def __init__(self, path: Path):
        self.path = path
        self.written = 0  # lines appended (including any found at start)
        self.read = 0  # lines taken by the writer
        self.events = 0  # events appended over the writer's life (the negative control of the tests)
        self._offset = 0
        self.size = 0  # bytes in the file
        self._futures: dict[int, asyncio.Future[Appended]] = {}
        self._out: Any = None

    @property
    def active(self) -> bool:
        return self.read < self.written

    @property
    def backlog_bytes(self) -> int:
        return self.size - self._offset

    def recover(self) -> int:
        """Adopt a spill left by an earlier executor; returns its number of items."""
        if not self.path.exists():
            return 0
        with self.path.open("rb") as f:
            self.written = sum(1 for line in f if line.strip())
        self.size = self.path.stat().st_size
        if not self.written:
            self.path.unlink()
        return self.written

    def append(self, events: Sequence[NewEvent], fut: asyncio.Future[Appended] | None) -> None:
        if self._out is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._out = self.path.open("ab")
        data = (_encode(events, datetime.now(UTC)) + "\n").encode()
        self._out.write(data)
        self._out.flush()  # in the OS's hands: a crash of this process loses none of it
        self.size += len(data)
        if fut is not None:
            self._futures[self.written] = fut
        self.written += 1
        self.events += len(events)

    def take(self, max_events: int) -> tuple[list[_Item], int]:
        """The next items in order (at least one), with the file offset after them."""
        items: list[_Item] = []
        n = 0
        offset = self._offset
        with self.path.open("rb") as f:
            f.seek(offset)
            index = self.read
            while index < self.written and (not items or n < max_events):
                line = f.readline()
                offset = f.tell()
                if not line.strip():
                    continue
                events = _decode(line.decode("utf-8"))
                items.append((events, self._futures.pop(index, None)))
                n += len(events)
                index += 1
        return items, offset

    def consumed(self, items: int, offset: int) -> None:
        self.read += items
        self._offset = offset
        if not self.active:
            # drained: start afresh, so the file never grows past one outage's worth
            if self._out is not None:
                self._out.close()
                self._out = None
            self.path.unlink(missing_ok=True)
            self.read = self.written = self._offset = self.size = 0

    def keep_first(self, items: list[_Item]) -> None:
        """Put `items` (older than anything spilled) before the unread rest of the file, for the next start."""
        self.close()
        rest = b""
        if self.active:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                rest = f.read()
        tmp = self.path.with_suffix(".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC)
        with tmp.open("wb") as out:
            for events, _ in items:
                out.write((_encode(events, stamp) + "\n").encode())
            out.write(rest)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(self.path)
        self.size = self.path.stat().st_size
        self.written = len(items) + rest.count(b"\n")
        self.read = self._offset = 0

    def abandon_futures(self) -> list[_Item]:
        found: list[_Item] = [((), fut) for fut in self._futures.values()]
        self._futures.clear()
        return found

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None
