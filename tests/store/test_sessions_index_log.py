"""The sessions index (executor/sessions/index.py) logs a change of what it lists, not every pass: a conversation
that grows while its CLI writes is published each pass, at debug."""

from __future__ import annotations

import json
import uuid
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool
from structlog.testing import capture_logs

from executor.sessions.index import Index
from tests import tables
from tests.pg import DB


def _line(sid: str, text: str, at: str) -> bytes:
    return json.dumps({"type": "user", "message": {"role": "user", "content": text}, "timestamp": at,
                       "uuid": f"u-{at}", "cwd": "/w/app", "sessionId": sid, "isSidechain": False}).encode() + b"\n"


async def test_a_growing_conversation_is_published_each_pass_but_logged_only_when_the_list_changes(
        pool: AsyncConnectionPool, db: DB, tmp_path: Path) -> None:
    folder = tmp_path / "cfg" / "projects" / "-w-app"
    folder.mkdir(parents=True)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    conv = folder / f"{first}.jsonl"
    conv.write_bytes(_line(first, "hello", "2026-12-01T18:48:21.900Z"))
    index = Index(pool, "exec", (tmp_path / "cfg",), (Path("/w"),), tmp_path / "home" / ".claude")

    passes: list[list[MutableMapping[str, Any]]] = []

    async def one_pass() -> None:
        with capture_logs() as logged:
            await index.refresh()
        passes.append([e for e in logged if e["event"].startswith("claude_sessions")])

    await one_pass()  # the first: it appears
    for n in range(3):  # its CLI writes: it grows each pass
        with conv.open("ab") as fh:
            fh.write(_line(first, f"more {n}", f"2026-12-01T18:49:0{n}.000Z"))
        await one_pass()
    await one_pass()  # nothing changed
    (folder / f"{second}.jsonl").write_bytes(_line(second, "another", "2026-12-01T18:50:00.000Z"))
    await one_pass()  # a second appears
    conv.unlink()
    await one_pass()  # the first goes
    counts = tables.rows(db.admin_dsn, "claude_sessions", "session_id", "message_count", order=("session_id",))

    info = [[(e["event"], e.get("new"), e.get("gone")) for e in p if e["log_level"] == "info"] for p in passes]
    assert info == [[("claude_sessions_indexed", 1, 0)], [], [], [], [], [("claude_sessions_indexed", 1, 0)],
                    [("claude_sessions_indexed", 0, 1)]]
    # the growth was published all the same, at debug
    assert [[e["log_level"] for e in p] for p in passes[1:4]] == [["debug"]] * 3
    assert counts == [(second, 1)]
