"""The files a user sent, as a run hands them to the CLI.

A turn (or a worker outside any project) gets them in its user message, one line of the CLI's stream-json
input: images as base64 image content blocks, PDFs as document blocks, text files inline in the text
(bounded, with their name). A worker of a project finds them as files in its worktree, under
`.petal/attachments/`, with their paths in its brief. A task without attachments is fed its brief as plain
`-p` input, as always."""

from __future__ import annotations

import base64
import os
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
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
    # an image's copy for the model, when the original is over the CLI's limits (ingress/attachments.py)
    model_data: bytes | None = None
    model_media_type: str | None = None


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
        if a.media_type in IMAGES:
            image, media_type = (a.model_data, a.model_media_type) if a.model_data else (a.data, a.media_type)
            blocks.append({"type": "image", "source": {"type": "base64", "media_type": media_type,
                                                        "data": base64.b64encode(bytes(image)).decode("ascii")}})
        elif a.media_type == PDF:
            blocks.append({"type": "document", "title": a.name, "source": {
                "type": "base64", "media_type": PDF, "data": base64.b64encode(bytes(a.data)).decode("ascii")}})
        else:
            text += _inline(a)
    return [*blocks, {"type": "text", "text": text}]


def stream_json_line(content: Sequence[dict[str, Any]]) -> bytes:
    """One user message of the CLI's stream-json input (docs/claude-cli.md): the runner writes it, then
    closes stdin, and the CLI exits after the turn's result."""
    return orjson.dumps({"type": "user", "message": {"role": "user", "content": list(content)},
                         "parent_tool_use_id": None, "session_id": ""}) + b"\n"


# where a project worker finds the files, relative to its worktree; `.petal/.gitignore` ignores the folder
# itself, so the files never enter the worker's recorded changes
ATTACHMENTS_DIR = ".petal/attachments"
_UNSAFE = re.compile(r"[^\w.+@=-]+")


def worktree_names(names: Sequence[str]) -> list[str]:
    """The file name each attachment gets under ATTACHMENTS_DIR, in order: the name it was sent with, reduced
    to safe characters, never hidden nor `.`/`..`, and made unique (`2-screen.png`). The same names give the
    same result, so the brief written at dispatch and the files written at the spawn agree."""
    out: list[str] = []
    for i, raw in enumerate(names, 1):
        name = _UNSAFE.sub("_", raw).lstrip(".")[:120] or "file"
        while name in out:
            name = f"{i}-{name}"
        out.append(name)
    return out


def files_note(names: Sequence[str], media_types: Sequence[str], sizes: Sequence[int]) -> str:
    """The brief's section that tells a project worker where the user's files are."""
    lines = [f"- {ATTACHMENTS_DIR}/{n} ({t}, {s} bytes)" for n, t, s in zip(worktree_names(names), media_types, sizes,
                                                                             strict=True)]
    return "## Files the user sent (in your working directory, read them there)\n" + "\n".join(lines)


def place_in_worktree(worktree: Path, attachments: Sequence[Attachment]) -> list[Path]:
    """Write the files into a fresh worktree under ATTACHMENTS_DIR; returns their paths.

    The worktree is a checkout of a repository the worker may not trust: a `.petal` committed as a symlink
    must not make the executor write outside it. Each level is opened relative to the one above without
    following a symlink, and each file is created new (O_EXCL), so nothing that exists is overwritten.

    Raises:
        OSError: a level is a symlink or not a directory, or a file is already there.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fds = [os.open(worktree, flags)]
    try:
        for part in ATTACHMENTS_DIR.split("/"):
            try:
                os.mkdir(part, 0o755, dir_fd=fds[-1])
            except FileExistsError:
                pass  # opened below without following a link: a symlink fails there
            fds.append(os.open(part, flags, dir_fd=fds[-1]))
        _write_new(fds[1], ".gitignore", b"*\n")
        paths = []
        for name, a in zip(worktree_names([a.name for a in attachments]), attachments, strict=True):
            _write_new(fds[-1], name, bytes(a.data))
            paths.append(worktree / ATTACHMENTS_DIR / name)
        return paths
    finally:
        for fd in fds:
            os.close(fd)


def _write_new(dir_fd: int, name: str, data: bytes) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
