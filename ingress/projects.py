"""Projects, workers' changes, merge / discard / push, and usage. Actions only write `project_queue` rows; the
executor carries them out and journals them (GET /api/project-requests/{id} shows the outcome)."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb
from starlette.requests import Request
from starlette.responses import Response

from ingress.http import body, ingress_queries, path_uuid, pool, query_choice, query_uuid, respond, shared_queries, who
from ingress.models import ProjectIn, ProjectPatch, ReviewIn, SendBackIn
from ingress.problems import Problem
from shared import projects
from shared.models import ACTIVE_STATUSES


async def create_project(request: Request) -> Response:
    spec = await body(request, ProjectIn)
    q = ingress_queries(request)
    if await q.one("check_slug_taken", {"slug": spec.slug}) is not None:
        raise Problem(409, f"slug {spec.slug!r} is taken")
    queued = await q.one("enqueue_project_request", {
        "action": "create", "task_id": None, "args": Jsonb(spec.model_dump(exclude_none=True))})
    return respond(queued, 202)


async def update_project(request: Request) -> Response:
    """A project's settings changed (its push remote): an `update` request the executor checks and applies."""
    project_id = path_uuid(request, "project_id")
    spec = await body(request, ProjectPatch)
    if await shared_queries(request).one("check_project_exists", {"id": project_id}) is None:
        raise Problem(404, f"no project {project_id}")
    queued = await ingress_queries(request).one("enqueue_project_request", {
        "action": "update", "task_id": None, "args": Jsonb({"project_id": str(project_id), **spec.model_dump()})})
    return respond(queued, 202)


async def list_projects(request: Request) -> Response:
    db_pool = pool(request)
    return respond({"projects": await projects.list_projects(db_pool), "requests": await projects.requests(db_pool)})


async def get_project(request: Request) -> Response:
    project_id = path_uuid(request, "project_id")
    found = await projects.get_project(request.app.state.db.pool, project_id)
    if found is None:
        raise Problem(404, f"no project {project_id}")
    return respond(found)


async def get_request(request: Request) -> Response:
    request_id = path_uuid(request, "request_id")
    found = await projects.request(request.app.state.db.pool, request_id)
    if found is None:
        raise Problem(404, f"no project request {request_id}")
    return respond(found)


async def task_diff(request: Request) -> Response:
    task_id = path_uuid(request, "task_id")
    found = await projects.task_changes(request.app.state.db.pool, task_id)
    if found is None:
        raise Problem(404, f"no task {task_id}")
    if found["branch"] is None:
        raise Problem(404, f"task {task_id} is not a worker of a project: it has no branch and no diff")
    if found["payload"] is None:
        raise Problem(409, f"task {task_id}'s changes are not recorded yet ({found['status']})")
    payload = found.pop("payload")
    return respond({**found, **payload, "branch": found["branch"]})


async def _reviewable(request: Request, action: str) -> dict[str, Any]:
    task_id = path_uuid(request, "task_id")
    task = await ingress_queries(request).one("get_task_review_state", {"id": task_id})
    if task is None:
        raise Problem(404, f"no task {task_id}")
    if task["branch"] is None:
        raise Problem(409, f"task {task_id} has no branch to {action} (not a worker of a project)")
    if task["status"] in ACTIVE_STATUSES:
        raise Problem(409, f"task {task_id} is still {task['status']}")
    if task["review"] is not None:
        raise Problem(409, f"task {task_id}'s branch was already {task['review']}")
    if task["changes_recorded_at"] is None:
        raise Problem(409, f"task {task_id}'s changes are not recorded yet")
    if task["review_pending"]:
        raise Problem(409, f"a merge or discard of task {task_id} is already queued")
    return task


async def _review(request: Request, action: str) -> Response:
    await body(request, ReviewIn, optional=True)
    task = await _reviewable(request, action)
    queued = await ingress_queries(request).one("enqueue_project_request", {
        "action": action, "task_id": task["id"], "args": Jsonb({})})
    return respond(queued, 202)


async def send_back(request: Request) -> Response:
    """A review of a worker's diff sent back: a thread control the executor turns into a follow-up worker on
    the reviewed commit (executor/settle/reviews.py); the review is kept in the thread."""
    review = await body(request, SendBackIn)
    task = await _reviewable(request, "review")
    if task["thread_id"] is None:
        raise Problem(409, f"task {task['id']} was not dispatched in a thread: there is no thread to send it back in")
    queued = await ingress_queries(request).one("enqueue_thread_control", {
        "thread_id": task["thread_id"], "action": "review",
        "args": Jsonb({"task_id": str(task["id"]), "comments": [c.model_dump(exclude_none=True) for c in review.comments],
                       "note": review.note, "by": who(request)})})
    return respond({**(queued or {}), "task_id": task["id"]}, 202)


async def merge_task(request: Request) -> Response:
    return await _review(request, "merge")


async def discard_task(request: Request) -> Response:
    return await _review(request, "discard")


async def push_task(request: Request) -> Response:
    """Push the worker's reviewed commit to its project's push remote (merged or not); the executor does it in a
    sandbox and journals task.pushed or task.push_failed."""
    await body(request, ReviewIn, optional=True)
    task_id = path_uuid(request, "task_id")
    task = await ingress_queries(request).one("get_task_review_state", {"id": task_id})
    if task is None:
        raise Problem(404, f"no task {task_id}")
    if task["branch"] is None:
        raise Problem(409, f"task {task_id} has no branch to push (not a worker of a project)")
    if task["status"] in ACTIVE_STATUSES:
        raise Problem(409, f"task {task_id} is still {task['status']}: push its changes once they are recorded")
    if task["review"] == "discarded":
        raise Problem(409, f"task {task_id}'s branch was discarded: there is nothing to push")
    if task["changes_recorded_at"] is None:
        raise Problem(409, f"task {task_id}'s changes are not recorded yet: nothing was reviewed")
    if task["push_remote"] is None:
        raise Problem(409, f"task {task_id}'s project has no push remote (set one: PATCH /api/projects/{{id}})")
    if task["push_pending"]:
        raise Problem(409, f"a push of task {task_id} is already queued")
    queued = await ingress_queries(request).one("enqueue_project_request", {
        "action": "push", "task_id": task["id"], "args": Jsonb({})})
    return respond(queued, 202)


async def usage(request: Request) -> Response:
    by = query_choice(request, "by", projects.USAGE_GROUPS) or "day"
    rows = await projects.usage(request.app.state.db.pool, by, task_id=query_uuid(request, "task_id"),
                                thread_id=query_uuid(request, "thread_id"),
                                project_id=query_uuid(request, "project_id"))
    return respond({"by": by, "rows": rows, "total": projects.total(rows)})
