"""A terminal session's conversation, journaled as the CLI writes it.

The interactive CLI appends each entry of the conversation to `<config>/projects/<cwd slug>/<session>.jsonl`
(docs/claude-cli.md "Stored conversations"). The session reads what was appended past the thread's import offset
every FOLLOW_S and journals it with the offset moved in the same commit (a compare-and-set: a pass that lost the
race journals nothing), so each entry is journaled once, in order, within a second of being written:
- the user's prompt (typed in the terminal) → `task.user_message` (origin "terminal"); one the page sent and the
  session typed is journaled already (with its message id) and is not repeated;
- what the model says, its tool calls and their results → `terminal.entry` (role, blocks; long texts cut);
- the CLI's own note that a turn was interrupted (Esc: a user entry "[Request interrupted by user…]") →
  `terminal.entry` with role "interrupted", not a prompt of the user's;
- a `!` command typed in the terminal → `task.user_message` as typed (`!ls`), and what it printed →
  `terminal.entry` with a `shell_output` block (the CLI writes both as tagged user text).
Bookkeeping entries (snapshots, attachments, modes, requests, meta prompts) are not the conversation.
"""

from __future__ import annotations

import json
import os
import re
import stat
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor.sandbox import cliconfig
from shared.models import NewEvent

FOLLOW_S = 0.2
MAX_TEXT = 8_000  # of a block's text in the journal (the file keeps it whole)
READ_MAX = 8 << 20  # of the file read at one look: what a faster conversation adds is read at the next
MAX_INPUT = 2_000  # of a tool call's input, as JSON


# what the CLI writes as a user entry when a turn is interrupted (observed on 2.1.328: "[Request interrupted by
# user]", and "… by user for tool use]" during a tool call)
INTERRUPTED = "[Request interrupted by user"


def conversation_file(config_dir: Path, cwd: str, session_id: str) -> Path:
    """Where the CLI keeps the conversation (its folder named for the directory, cliconfig.session_dir)."""
    return cliconfig.session_dir(config_dir, Path(cwd)) / f"{session_id}.jsonl"


def _cut(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more characters in the file)"


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


# a `!` command typed in the terminal, and what it printed, as the CLI writes them: two user entries of tagged text
# (observed on 2.1.328: stdout and stderr each in its tags, either one empty)
_BASH_INPUT = re.compile(r"<bash-input>(.*)</bash-input>", re.S)
_BASH_OUTPUT = re.compile(r"<bash-stdout>(.*)</bash-stdout><bash-stderr>(.*)</bash-stderr>", re.S)


def _shell(text: str) -> tuple[str | None, list[dict[str, Any]]] | None:
    """A `!` command as what the user typed, its output as a block of its own; None for any other text."""
    if typed := _BASH_INPUT.fullmatch(text):
        return "!" + typed.group(1), []
    if printed := _BASH_OUTPUT.fullmatch(text):
        out, err = printed.group(1), printed.group(2)
        return None, [{"type": "shell_output", "is_error": bool(err.strip()),
                       "text": _cut("\n".join(part.rstrip("\n") for part in (out, err) if part), MAX_INPUT)}]
    return None


def _user(content: Any) -> tuple[str | None, list[dict[str, Any]]]:
    if isinstance(content, str):
        return _shell(content) or (content, [])
    given = [b for b in content or [] if isinstance(b, dict)]
    texts = [b.get("text", "") for b in given if b.get("type") == "text"]
    results = [{"type": "tool_result", "tool_use_id": b.get("tool_use_id"), "is_error": bool(b.get("is_error")),
                "text": _cut(_result_text(b.get("content")), MAX_INPUT)}
               for b in given if b.get("type") == "tool_result"]
    return ("\n".join(texts) if texts and not results else None), results


def _assistant(content: Any) -> list[dict[str, Any]]:
    shown: list[dict[str, Any]] = []
    for b in content if isinstance(content, list) else []:
        if not isinstance(b, dict):
            continue
        if b.get("type") == "text" and str(b.get("text", "")).strip():
            shown.append({"type": "text", "text": _cut(b["text"])})
        elif b.get("type") == "tool_use":
            shown.append({"type": "tool_use", "id": b.get("id"), "name": b.get("name"),
                          "input": _cut(json.dumps(b.get("input"), ensure_ascii=False), MAX_INPUT)})
    return shown


def blocks(entry: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
    """(the user's prompt text, or None; the entry's blocks to show) of one conversation entry (pure)."""
    if entry.get("isMeta") or entry.get("type") not in ("user", "assistant"):
        return None, []
    content = (entry.get("message") or {}).get("content")
    return _user(content) if entry["type"] == "user" else (None, _assistant(content))


@dataclass
class Follower:
    """What the session journals of its conversation file."""

    path: Path
    thread_id: uuid.UUID
    task_id: uuid.UUID
    offset: int
    # the page's messages the session typed, not yet seen in the file: their prompts are journaled already
    typed: list[str] = field(default_factory=list)

    def read(self) -> tuple[int, list[NewEvent]]:
        """The new end (past the last whole line) and the records of the entries before it, READ_MAX at most.

        A sandboxed session can write its conversation's directory: the file is read only as itself, a regular
        file, never through a link (one to /dev/zero read the executor out of memory, one to another conversation
        would journal that one here) nor as a FIFO (a read that never returns)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return self.offset, []
        except OSError:  # a link (ELOOP), or what this user may not open: nothing of it is read
            return self.offset, []
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return self.offset, []
            f.seek(self.offset)
            data = f.read(READ_MAX)
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) == READ_MAX:
            end = READ_MAX  # a line longer than a read: passed over (no entry the page shows is this long)
        events: list[NewEvent] = []
        for line in data[:end].splitlines():
            try:
                entry = json.loads(line)
            except (ValueError, RecursionError):  # nested past the parser's depth: the file is the sandbox's to write
                continue  # not an entry (the CLI's own business): the rest still counts
            if isinstance(entry, dict):
                events.extend(self._records(entry))
        return self.offset + end, events

    def _records(self, entry: dict[str, Any]) -> list[NewEvent]:
        prompt, shown = blocks(entry)
        origin = {"uuid": entry.get("uuid"), "at": entry.get("timestamp")}
        if prompt is not None and prompt.startswith(INTERRUPTED):
            return [NewEvent("terminal.entry", {"role": "interrupted", "blocks": [], **origin},
                             session_id=self.thread_id, task_id=self.task_id)]
        if prompt is not None:
            said = prompt.strip()
            if said in self.typed:
                self.typed.remove(said)
                return []
            return [NewEvent("task.user_message", {"text": prompt, "thread_id": str(self.thread_id),
                                                   "origin": "terminal", "terminal": origin},
                             session_id=self.thread_id, task_id=self.task_id)]
        if not shown:
            return []
        role = "assistant" if entry.get("type") == "assistant" else "tool"
        return [NewEvent("terminal.entry", {"role": role, "blocks": shown, **origin},
                         session_id=self.thread_id, task_id=self.task_id)]
