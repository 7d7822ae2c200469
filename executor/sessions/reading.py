"""A conversation file's complete lines fed to its Scan a chunk at a time (blocking reads): a conversation grows
without bound and is never read whole into memory, and a line longer than a chunk (a large tool result or image
in one message) is read alone, up to MAX_LINE; one longer still is passed over rather than stop the file there."""

from __future__ import annotations

from typing import BinaryIO

from executor.sessions.parse import Message, Scan
from shared import logs

log = logs.get(__name__)

# what is read at once
READ_CHUNK = 8 * 1024 * 1024
# the longest line parsed; beyond it, the line is passed over (its message is not shown)
MAX_LINE = 64 * 1024 * 1024


def feed(fh: BinaryIO, scan: Scan, end: int) -> list[Message]:
    """Feed `scan` the file's complete lines from its `parsed_to` up to byte `end`; the messages found. A partial
    line at `end` (the CLI is writing it) waits for a later call."""
    messages: list[Message] = []
    while scan.parsed_to < end and scan.unreadable is None:
        before = scan.parsed_to
        fh.seek(before)
        data = fh.read(min(READ_CHUNK, end - before))
        messages += scan.feed(data, before)
        if scan.parsed_to != before:
            continue
        if len(data) < READ_CHUNK:
            break  # a partial line only
        newline = _newline(fh, before + len(data), end)
        if newline is None:
            break  # a long line still being written
        if newline - before <= MAX_LINE:
            fh.seek(before)
            messages += scan.feed(fh.read(newline + 1 - before), before)
        else:
            log.warning("conversation_line_passed_over", session_id=scan.session_id, line=scan.lines + 1,
                        bytes=newline - before)
            scan.pass_over(newline + 1)
    return messages


def _newline(fh: BinaryIO, start: int, end: int) -> int | None:
    """Where the next newline at or after `start` is, looked for a chunk at a time up to `end`."""
    fh.seek(start)
    at = start
    while at < end:
        data = fh.read(min(READ_CHUNK, end - at))
        if not data:
            return None
        found = data.find(b"\n")
        if found >= 0:
            return at + found
        at += len(data)
    return None
