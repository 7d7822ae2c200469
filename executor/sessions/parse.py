"""A CLI conversation file (`<config>/projects/<cwd slug>/<id>.jsonl`), read incrementally: its facts for the
index and its messages for a thread's journal.

What the lines look like was observed on CLI 2.1.328 (docs/claude-cli.md "Stored conversations"): one JSON
object per line; the conversation's lines are `type: "user"` / `"assistant"` with `message.role/content`,
`cwd`, `gitBranch`, `timestamp`, `uuid`, `isSidechain`; many other types sit between them (`attachment`,
`queue-operation`, `last-prompt`, `api-request*`, `cost-state`, `mode`, older versions' `summary`) and are
skipped. A tool result is a `user` line whose content is only `tool_result` blocks: no message of its own.
Parsed tolerantly (unknown types and keys pass), but a complete line that is not a JSON object makes the
whole file unreadable: it is listed so, and never imported in part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import orjson

# what a title keeps of the first prompt, and an imported message of its text
TITLE_CHARS = 200
MESSAGE_CHARS = 16_000


@dataclass(frozen=True)
class Message:
    role: str  # "user" | "assistant"
    text: str
    uuid: str | None
    at: datetime | None
    end: int  # the byte offset just past its line


@dataclass
class Scan:
    """What one file says so far; `feed` the bytes appended since `parsed_to` to bring it up to date."""

    session_id: str
    cwd: str | None = None
    title: str | None = None
    summary: str | None = None
    git_branch: str | None = None
    last_activity: datetime | None = None
    message_count: int = 0
    unreadable: str | None = None
    parsed_to: int = 0  # bytes of complete lines read
    lines: int = 0
    _pending_title: bool = field(default=True, repr=False)

    def feed(self, data: bytes, start: int) -> list[Message]:
        """Parse the complete lines of `data`, which begins at byte `start` of the file (== parsed_to); a
        trailing partial line (the CLI is writing it) waits for the next feed. Returns the messages found."""
        if self.unreadable is not None:
            return []
        messages: list[Message] = []
        offset = start
        # split on b"\n" only: text inside JSON strings may carry \r\n
        *complete, _partial = data.split(b"\n")
        for raw in complete:
            offset += len(raw) + 1
            self.lines += 1
            if not raw.strip():
                continue
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                self.unreadable = f"line {self.lines} is not JSON ({exc.msg})"
                return []
            if not isinstance(line, dict):
                self.unreadable = f"line {self.lines} is not a JSON object"
                return []
            message = self._take(line, offset)
            if message is not None:
                messages.append(message)
        self.parsed_to = offset
        return messages

    def pass_over(self, end: int) -> None:
        """The line that ends at byte `end` (exclusive) is not read: too long to parse (executor/sessions/reading.py)."""
        self.lines += 1
        self.parsed_to = end

    def _take(self, line: dict[str, object], end: int) -> Message | None:
        kind = line.get("type")
        if kind == "summary" and isinstance(line.get("summary"), str):
            self.summary = str(line["summary"])[:TITLE_CHARS]
            return None
        if kind not in ("user", "assistant") or line.get("isSidechain") is True:
            return None
        for key, attr in (("cwd", "cwd"), ("gitBranch", "git_branch")):
            value = line.get(key)
            if isinstance(value, str) and value:
                setattr(self, attr, value)
        at = _timestamp(line.get("timestamp"))
        if at is not None and (self.last_activity is None or at > self.last_activity):
            self.last_activity = at
        if line.get("isMeta") is True:
            return None  # the CLI's own notes (a command's output, a caveat), not said by anyone
        message = line.get("message")
        text = _text(message.get("content")) if isinstance(message, dict) else None
        if not text:
            return None
        self.message_count += 1
        if kind == "user" and self._pending_title and not text.lstrip().startswith("<"):
            self.title = " ".join(text.split())[:TITLE_CHARS]
            self._pending_title = False
        uuid = line.get("uuid")
        return Message(str(kind), text[:MESSAGE_CHARS], uuid if isinstance(uuid, str) else None, at, end)


def _text(content: object) -> str | None:
    """A message's words: a string, or its text blocks joined (tool calls and results are not words)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"
                 and isinstance(b.get("text"), str)]
        return "\n\n".join(parts) if parts else None
    return None


def _timestamp(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def read(data: bytes, session_id: str) -> tuple[Scan, list[Message]]:
    """A whole file at once."""
    scan = Scan(session_id)
    return scan, scan.feed(data, 0)


def outside_turns(messages: list[Message], windows: list[tuple[datetime, datetime | None]],
                  before_s: float = 0.5) -> list[Message]:
    """The messages written outside the thread's own turns (`windows`: each turn's start and end; an end of
    None is a turn still running): what a terminal added, which the journal does not have yet. A message
    with no timestamp is taken as the terminal's.

    A turn's start is taken when it is claimed, before its process exists, and its end once the process
    has been reaped, so every line the turn wrote lies inside; `before_s` allows for a clock step between
    the CLI's and the database's. No allowance after the end: a terminal that goes on with the
    conversation right after a turn (in under a second) writes after that end, and must not be lost."""
    def inside(at: datetime) -> bool:
        return any((at - start).total_seconds() >= -before_s and (end is None or at <= end) for start, end in windows)
    return [m for m in messages if m.at is None or not inside(m.at)]
