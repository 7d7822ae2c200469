"""Approval receipts, exported: each approval (gate card, dispatch approval) with the hash of what it approved,
the hash of what was about to run when it was acted on (a mismatch was refused), what then ran (a gate card's
call as the CLI journaled it, hashed the same way), the outcome and the task's cost. JSON Lines, oldest first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ingress.http import dumps, ingress_queries, query_int, query_uuid
from ingress.openapi import UUID, Op, Param
from shared import receipts

RESULT_CHARS = 500  # of a call's result text, in the export


def _result(block: Any) -> tuple[bool | None, str | None]:
    if not isinstance(block, dict):
        return None, None
    content = block.get("content")
    text = content if isinstance(content, str) else "\n".join(
        str(c.get("text", "")) for c in content if isinstance(c, dict)) if isinstance(content, list) else ""
    return bool(block.get("is_error")), text[:RESULT_CHARS]


def line(row: dict[str, Any]) -> dict[str, Any]:
    """One receipt as exported: `ran` is what the journal says then ran, hashed as the approval was."""
    call, out = row.pop("call"), row.pop("result")
    ran = None
    if isinstance(call, dict):
        sha = receipts.of_call(str(call.get("name")), call.get("input") or {})
        is_error, text = _result(out)
        ran = {"tool": call.get("name"), "sha256": sha, "matches_approved": sha == row["approved_sha256"],
               "is_error": is_error, "result": text}
    return {**row, "ran": ran}


async def export(request: Request) -> Response:
    rows = await ingress_queries(request).all("list_approval_receipts", {
        "thread_id": query_uuid(request, "thread"), "task_id": query_uuid(request, "task"),
        "limit": query_int(request, "limit", 1000, lo=1, hi=10_000)})
    body = b"".join(dumps(line(dict(r))) + b"\n" for r in rows)
    return Response(body, media_type="application/x-ndjson")


OPS: list[tuple[Op, Callable[[Request], Awaitable[Response]]]] = [  # noqa: RUF012 - routes, read once
    (Op("get", "/api/receipts", "approval receipts as JSON Lines: what each approval approved (sha256 of canonical "
        "JSON), what was about to run (a mismatch was refused), what then ran, the outcome and the task's cost",
        params=(Param("thread", "query", UUID), Param("task", "query", UUID),
                Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 10000})), errors=(400,),
        responses={"200": {"description": "one receipt per line", "content": {"application/x-ndjson": {
            "schema": {"type": "string"}}}}}), export),
]
