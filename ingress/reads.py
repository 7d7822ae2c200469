"""Reads: views over the store. Paging is by seq, never by offset."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import Response

from ingress.http import (ingress_queries, next_cursor, path_uuid, query_bool, query_choice, query_cursor, query_int,
                          query_uuid, respond)
from ingress.problems import Problem
from ingress.sql import queries
from shared import read_surface, threads
from shared.models import ACTIVE_STATUSES, FINAL_STATUSES
from shared.query import Queries

STATUSES = (*ACTIVE_STATUSES, *FINAL_STATUSES)
# the lists' pages when the client names no limit: what a page shows at once (older ones by `before`)
THREADS_PAGE = 200
TASKS_PAGE = 100
# what a page of journal records may come to past its first one, as JSON text: a spawn's stdout line is a record, and
# can be 64 MiB (the read surface's pages are cut there, `more` set)
PAGE_BYTES = 32 * 1024 * 1024


def _page_params(request: Request, default: int) -> dict[str, Any]:
    before = query_cursor(request)
    return {"limit": query_int(request, "limit", default, lo=1, hi=1000),
            "before_at": before[0] if before else None, "before_id": before[1] if before else None}


async def list_threads(request: Request) -> Response:
    params = _page_params(request, THREADS_PAGE)
    rows = await ingress_queries(request).all("list_threads", params)
    return respond({"threads": rows, "default_thread_id": threads.DEFAULT_THREAD_ID,
                    "next_before": next_cursor(rows, params["limit"])})


async def pending_queue(request: Request) -> Response:
    params = {"thread_id": query_uuid(request, "thread_id")}
    return respond({"pending": await ingress_queries(request).all("list_pending_chat", params)})


async def list_tasks(request: Request) -> Response:
    params = {"status": query_choice(request, "status", STATUSES), "thread_id": query_uuid(request, "thread_id"),
              "running": query_bool(request, "running"), **_page_params(request, TASKS_PAGE)}
    rows = await _tasks(ingress_queries(request), params)
    return respond({"tasks": rows, "next_before": next_cursor(rows, params["limit"])})


async def _tasks(q: Queries, params: dict[str, Any]) -> list[dict[str, Any]]:
    """A page of tasks: a thread's (picked by their indexes) or any."""
    if params["thread_id"] is None:
        return await q.all("list_tasks", {k: v for k, v in params.items() if k != "thread_id"})
    return await q.all("list_thread_tasks", params)


async def get_task(request: Request) -> Response:
    task_id = path_uuid(request, "task_id")
    task = await ingress_queries(request).one("get_task", {"id": task_id})
    if task is None:
        raise Problem(404, f"no task {task_id}")
    return respond(task)


def _events_params(request: Request, task_id: Any = None) -> dict[str, Any]:
    return {"after": query_int(request, "after_seq", 0), "limit": query_int(request, "limit", 200, lo=1, hi=1000),
            "max_bytes": PAGE_BYTES,
            "tier": query_choice(request, "tier", ("raw", "derived")),
            "task_id": task_id if task_id is not None else query_uuid(request, "task_id"),
            "event_type": request.query_params.get("event_type") or None}


def _sized(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """A page of records without the columns that bounded it by size (PAGE_BYTES), and whether it was cut by it."""
    taken = rows[0]["rows_in_page"] if rows else 0
    for row in rows:
        row.pop("rows_in_page")
        row.pop("bytes_before", None)
        row.pop("bytes_after", None)
    return rows, len(rows) < taken


def _page(rows: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    events, cut = _sized(rows)
    last = events[-1]["seq"] if events else params["after"]
    return {"events": events, "next_after_seq": last, "more": len(events) == params["limit"] or cut}


async def task_events(request: Request) -> Response:
    task_id = path_uuid(request, "task_id")
    q = ingress_queries(request)
    if await q.one("get_task", {"id": task_id}) is None:
        raise Problem(404, f"no task {task_id}")
    params = _events_params(request, task_id)
    return respond(_page(await q.all("list_task_events", params), params))


async def events(request: Request) -> Response:
    params = _events_params(request)
    # one task's records come from its own index (list_task_events), not from a walk of the journal by seq
    name = "list_task_events" if params["task_id"] is not None else "list_events"
    return respond(_page(await ingress_queries(request).all(name, params), params))


# The records a thread's chat renders (see static/app.js); the rest of the journal is in Activity.
CONVERSATION_TYPES = [
    "task.user_message", "thread.harness_message", "stream.result", "task.dispatch_requested",
    "task.dispatch_refused", "task.spawned", "task.exited", "task.stalled", "task.resumed", "handoff",
    "handoff.extraction_failed", "policy.decision", "escalation.resolved", "question.asked", "question.answered",
    "question.cancelled", "thread.created", "thread.renamed", "thread.mode_changed", "thread.archived",
    "turn.failed", "approval.resolved", "question.timed_out", "task.review",
    "terminal.started", "terminal.entry", "terminal.input_waiting", "terminal.ended",
]


async def conversation(request: Request) -> Response:
    before = query_int(request, "before_seq", 0, lo=1) if request.query_params.get("before_seq") else None
    params = {"thread_id": path_uuid(request, "thread_id"), "after": query_int(request, "after_seq", 0),
              "before": before, "limit": query_int(request, "limit", 300, lo=1, hi=1000), "types": CONVERSATION_TYPES,
              "max_bytes": PAGE_BYTES}
    q = ingress_queries(request)
    events, cut = _sized(await q.all("list_thread_conversation", params))
    failed = [e for e in events if e["event_type"] == "turn.failed"]
    if failed:
        # a failed turn's record says whether its Retry is still open (no later run repeats the turn)
        reruns = {r["retry_of"]: r["id"]
                  for r in await q.all("list_turn_reruns", {"ids": [e["task_id"] for e in failed]})}
        for e in failed:
            e["retried_by"] = reruns.get(e["task_id"])
    # more: older records exist before the first one returned (page back with before_seq = its seq)
    return respond({"events": events, "types": CONVERSATION_TYPES, "more": len(events) == params["limit"] or cut})


async def handoffs(request: Request) -> Response:
    scope = query_uuid(request, "scope_id")
    if scope is None:
        raise Problem(400, "scope_id is required (a task, session or project id)")
    limit = query_int(request, "limit", 20, lo=1, hi=200)
    return respond({"handoffs": await read_surface.get_handoffs(request.app.state.db.pool, scope, limit)})


async def project_state(request: Request) -> Response:
    project_id = path_uuid(request, "project_id")
    state = await read_surface.get_project_state(request.app.state.db.pool, project_id)
    if state is None:
        raise Problem(404, f"no project {project_id}")
    return respond(state)


async def get_thread(request: Request) -> Response:
    thread_id = path_uuid(request, "thread_id")
    thread = await ingress_queries(request).one("get_thread", {"id": thread_id})
    if thread is None:
        raise Problem(404, f"no thread {thread_id}")
    return respond(thread)


async def context(request: Request) -> Response:
    """The orchestrator's working set for one thread (FR-006)."""
    thread_id = query_uuid(request, "thread_id") or threads.DEFAULT_THREAD_ID
    q = ingress_queries(request)
    thread = await q.one("get_thread", {"id": thread_id})
    tasks = await _tasks(q, {"status": None, "thread_id": thread_id, "running": None, "limit": 50,
                             "before_at": None, "before_id": None})
    turn = next((t for t in tasks if t["session_id"] == thread_id and t["status"] in ACTIVE_STATUSES), None)
    workers = [t for t in tasks if t["session_id"] != thread_id and t["status"] in ACTIVE_STATUSES]
    return respond({
        "thread": thread,
        "thread_id": thread_id,
        "mode": thread["mode"] if thread else None,
        "current_turn": turn,
        "pending_messages": await q.all("list_pending_chat", {"thread_id": thread_id}),
        "running_workers": workers,
        "recent_handoffs": await read_surface.get_handoffs(request.app.state.db.pool, thread_id, 5),
        "pending_asks": await q.all("list_asks", {"status": "pending", "thread_id": thread_id, "limit": 20}),
    })


async def list_executors(request: Request) -> Response:
    """The executors sharing this database (the fleet)."""
    return respond({"executors": await ingress_queries(request).all("list_executors")})


async def list_asks(request: Request) -> Response:
    params = {"status": query_choice(request, "status", ("pending", "answered", "cancelled")),
              "thread_id": query_uuid(request, "thread_id"), "limit": query_int(request, "limit", 50, lo=1, hi=500)}
    return respond({"asks": await ingress_queries(request).all("list_asks", params)})


# `petal-dispatch status`: what is open now, each part under its key
STATUS_PARTS = {"tasks": "list_open_tasks", "queue": "list_queued_messages", "asks": "list_pending_asks",
                "last_events": "list_last_events", "executors": "list_executors"}


async def status(pool: AsyncConnectionPool) -> dict[str, list[dict[str, Any]]]:
    """Open tasks, queued messages, pending asks, the last events and the fleet (the operator's view)."""
    q = Queries(pool, queries)
    return {key: await q.all(name) for key, name in STATUS_PARTS.items()}
