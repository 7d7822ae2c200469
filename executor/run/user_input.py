"""A turn's user message with the files sent with it, as one line of the CLI's stream-json input.

Images go as base64 image content blocks, PDFs as document blocks, text files inline in the text (bounded,
with their name). A task without attachments is fed its brief as plain `-p` input, as always."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from shared.query import FromRow

IMAGES = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif"})
PDF = "application/pdf"
TEXT = "text/plain"
# A text file is read into the prompt up to this many characters; the rest is cut with a note (a 10 MiB log
# would fill the context window).
MAX_INLINE_TEXT_CHARS = 100_000


@dataclass(frozen=True)
class Attachment(FromRow):
    id: uuid.UUID
    name: str
    media_type: str
    data: bytes


def _inline(attachment: Attachment) -> str:
    text = bytes(attachment.data).decode("utf-8", errors="replace")
    name = attachment.name.replace('"', "'")
    cut = ""
    if len(text) > MAX_INLINE_TEXT_CHARS:
        cut = f"\n[… cut: the file has {len(text)} characters, the first {MAX_INLINE_TEXT_CHARS} are shown]"
        text = text[:MAX_INLINE_TEXT_CHARS]
    return f'\n\n[attached file "{name}"]\n{text}{cut}\n[end of "{name}"]'


def content_blocks(prompt: str, attachments: Sequence[Attachment]) -> list[dict[str, Any]]:
    """The user message's content: the images and documents first (the model reads them best ahead of the
    question), then the text: the brief, with each text file inline after it."""
    blocks: list[dict[str, Any]] = []
    text = prompt
    for a in attachments:
        data = base64.b64encode(bytes(a.data)).decode("ascii")
        if a.media_type in IMAGES:
            blocks.append({"type": "image", "source": {"type": "base64", "media_type": a.media_type, "data": data}})
        elif a.media_type == PDF:
            blocks.append({"type": "document", "title": a.name,
                           "source": {"type": "base64", "media_type": PDF, "data": data}})
        else:
            text += _inline(a)
    return [*blocks, {"type": "text", "text": text}]


def stream_json_line(content: Sequence[dict[str, Any]]) -> bytes:
    """One user message of the CLI's stream-json input (docs/claude-cli.md): the runner writes it, then
    closes stdin, and the CLI exits after the turn's result."""
    return orjson.dumps({"type": "user", "message": {"role": "user", "content": list(content)},
                         "parent_tool_use_id": None, "session_id": ""}) + b"\n"
