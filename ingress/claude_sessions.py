"""The CLI's stored conversations, as the executors published them (the ingress never reads their files), and
the checks before a thread is made from one (the executor holding the file checks again when it makes it)."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ingress.http import ingress_queries, query_int, respond
from ingress.problems import Problem


async def list_sessions(request: Request) -> Response:
    def text(name: str, most: int) -> str | None:
        raw = (request.query_params.get(name) or "").strip()
        if len(raw) > most:
            raise Problem(400, f"{name} is at most {most} characters")
        return raw or None

    limit = query_int(request, "limit", 50, lo=1, hi=200)
    params = {"q": text("q", 200), "dir": text("dir", 4096), "executor": text("executor", 200), "limit": limit + 1,
              "offset": query_int(request, "offset", 0, hi=1_000_000)}
    q = ingress_queries(request)
    rows = await q.all("list_claude_sessions", params)
    # the sessions live in a terminal now (`petal-dispatch claude`), listed first, with who holds each
    return respond({"terminals": await q.all("list_live_terminals"), "sessions": rows[:limit],
                    "more": len(rows) > limit, "offset": params["offset"], "dirs": await q.all("list_claude_session_dirs")})


async def check_adoptable(request: Request, session_id: uuid.UUID, executor: str | None) -> dict[str, Any]:
    """The index row of the conversation a thread would be made from, or the Problem that says why not."""
    q = ingress_queries(request)
    holders = await q.all("list_claude_session_holders", {"session_id": str(session_id)})
    if executor is not None:
        holders = [h for h in holders if h["executor"] == executor]
    if not holders:
        where = f" on executor {executor}" if executor else ""
        raise Problem(404, f"no stored conversation {session_id}{where} (GET /api/claude-sessions lists them)")
    if len(holders) > 1:
        raise Problem(409, f"conversation {session_id} is stored on several executors "
                           f"({', '.join(h['executor'] for h in holders)}): name one as executor")
    row = holders[0]
    if not row["readable"]:
        raise Problem(422, f"conversation {session_id} cannot be read: {row['unreadable_reason']}")
    if not row["adoptable"]:
        raise Problem(403, f"conversation {session_id} is in {row['cwd']}, outside the project roots "
                           "(PETAL_PROJECT_ROOTS) of executor " + row["executor"])
    if not row["executor_live"]:
        raise Problem(409, f"executor {row['executor']}, which holds conversation {session_id}, is not running")
    taken = await q.one("check_conversation_continued", {"session_id": str(session_id)})
    if taken is not None:
        raise Problem(409, f"conversation {session_id} is already continued by thread {taken['id']}",
                      thread_id=str(taken["id"]))
    return row
