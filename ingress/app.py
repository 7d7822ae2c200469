"""The ingress application: routes, lifespan (pool, listener, SSE broadcaster), error handling."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import psycopg
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from ingress import actions, attachments, claude_sessions, gate_rules, notify, problems, reads, receipts, signin, stream
from ingress import routines as routine_routes
from ingress import projects as project_routes
from ingress.auth import AuthConfig, BodyTooLarge, GuardMiddleware, TokenLimiter
from ingress.boundary import BoundaryConfig, BoundaryMiddleware
from ingress.http import ingress_queries, shared_queries
from ingress.models import (
    AnswerIn,
    ChatIn,
    ProjectIn,
    ProjectPatch,
    RetryIn,
    ReviewIn,
    SendBackIn,
    RoutineIn,
    RoutinePatch,
    RunIn,
    StopIn,
    ThreadIn,
    ThreadPatch,
)
from ingress.openapi import SEQ, UUID, Op, Param, document
from ingress.sql import queries
from shared import aio, migrate
from shared.availability import CONTENDED
from shared.database import Database
from shared.errors import DatabaseRefused, DatabaseUnavailable
from shared.query import Queries
from shared.sql import queries as shared_sql

# the repository's static/ (editable install), or the copy a wheel build packs inside `ingress`
# A request waits at most this long for a database connection, so an outage answers 503 in seconds.
ACQUIRE_TIMEOUT_S = 3.0
READYZ_TIMEOUT_S = 2.0
# How long start-up waits for the LISTEN connection before serving anyway (during an outage it goes on
# trying; /readyz says why meanwhile).
LISTEN_WAIT_S = 10.0

STATIC = next((p for p in (Path(__file__).resolve().parent.parent / "static",
                           Path(__file__).resolve().parent / "_static") if p.is_dir()),
              Path(__file__).resolve().parent / "_static")


@dataclass(frozen=True)
class IngressConfig:
    """What the ingress runs on; the application builds it from the settings (petal_dispatch/ingress_wiring.py)."""

    dsn: str = field(repr=False)  # the ingress role's; it may carry a password
    auth: AuthConfig
    boundary: BoundaryConfig = field(repr=False)  # it holds the proxy secret
    host: str = "127.0.0.1"
    port: int = 8000
    reuse_port: bool = False  # share the port with other ingress processes (ingress/main.py)
    # the SSE heartbeat, and how many recent frames are kept for clients behind (stream.Broadcaster)
    sse_heartbeat_s: float = 15.0
    sse_client_buffer: int = 20_000
    push_allow_loopback: bool = False  # test-only: a loopback push stand-in
    demo: bool = False  # the CLI talks to the scripted model: the page says so
    # how long a stop waits for open requests (SSE streams are ended at once)
    graceful_timeout_s: float = 5.0
    # what one message may carry in attachments, together (each file: auth.upload_max_bytes)
    message_attachments_max_bytes: int = 20 * 1024 * 1024


def _package_version() -> str:
    try:
        return metadata.version("petal-dispatch")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


_VERSION = _package_version()


async def info(request: Request) -> Response:
    config: IngressConfig = request.app.state.config
    row = await shared_queries(request).one("get_journal_head")
    head = row["last_seq"] if row else 0  # the journal_head row exists from the first migration on
    # from the executors' own rows, not this process's settings: the executor decides how it spawns
    unsandboxed = [r["name"] for r in await ingress_queries(request).all("list_unsandboxed_executors")]
    # where tasks without a project run, from each live executor's own row (its PETAL_WORKDIR)
    workdirs = [{"executor": r["name"], "workdir": r["workdir"]}
                for r in await ingress_queries(request).all("list_executor_workdirs") if r["workdir"]]
    # journal_head: a client that loads its views and then streams from here misses nothing in between
    return JSONResponse({"name": "petal-dispatch", "version": _VERSION, "demo": config.demo,
                         "auth": request.app.state.auth.mode, "journal_head": head,
                         "workers_isolated": not unsandboxed, "unsandboxed_executors": unsandboxed,
                         "workdirs": workdirs,
                         # the SSE heartbeat: a client that hears nothing for two of these reconnects
                         "heartbeat_s": config.sse_heartbeat_s,
                         # the page checks a file before uploading it (the routes check again)
                         "attachment_max_bytes": request.app.state.auth.upload_max_bytes,
                         "message_attachments_max_bytes": config.message_attachments_max_bytes})


_AFTER = Param("after_seq", "query", SEQ, "return events with a greater seq")
_LIMIT = Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000})
_TASK = Param("task_id", "path", UUID)
_THREADQ = Param("thread_id", "query", UUID)
_THREADP = (Param("thread_id", "path", UUID),)
_BEFORE = Param("before", "query", {"type": "string"}, "the next page: the list's next_before")
_TASK_Q = Param("task_id", "query", UUID)
_ROUTINE = Param("routine_id", "path", UUID)

OPS: list[tuple[Op, Callable[[Request], Awaitable[Response]]]] = [  # noqa: RUF012 - the route table, read once
    (Op("post", "/api/chat", "queue a chat message for a thread", ChatIn, status=202, errors=(400, 409, 413, 415, 422)),
     actions.post_chat),
    (Op("post", "/api/attachments", "upload a file to send with a chat message (multipart/form-data, field "
        "`file`): PNG, JPEG, WebP, GIF, PDF or UTF-8 text, at most 10 MiB; the type is read from the bytes, images "
        "lose their metadata", upload=True, status=201, errors=(400, 413, 415, 422)), attachments.upload),
    (Op("get", "/api/attachments/{attachment_id}", "an attachment's bytes (a download; raster images inline)",
        params=(Param("attachment_id", "path", UUID),), errors=(404,),
        responses={"200": {"description": "the file", "content": {"application/octet-stream": {
            "schema": {"type": "string", "format": "binary"}}}}}), attachments.download),
    (Op("post", "/api/tasks/{task_id}/stop", "ask the executor to stop a task", StopIn, True, (_TASK,), 202,
        (404, 409, 415, 422)), actions.stop_task),
    (Op("post", "/api/threads", "create a thread (the id is issued here); adopt_session_id: made from a stored CLI "
        "conversation, its turns continuing it", ThreadIn, True, status=202,
        errors=(403, 404, 409, 415, 422)), actions.create_thread),
    (Op("patch", "/api/threads/{thread_id}", "rename, change mode, or archive a thread", ThreadPatch, params=_THREADP,
        status=202, errors=(404, 415, 422)), actions.patch_thread),
    (Op("post", "/api/threads/{thread_id}/retry", "run a failed orchestrator turn again with the same messages",
        RetryIn, True, _THREADP, 202, (404, 409, 415, 422)), actions.retry_turn),
    (Op("post", "/api/threads/{thread_id}/terminal/end", "end the thread's live terminal session (`petal-dispatch "
        "claude`)", params=_THREADP, status=202, errors=(409,)), actions.end_terminal),
    (Op("post", "/api/asks/{ask_id}/answer", "answer a question (answers, or a response to dismiss it); 202 "
        "when it had timed out (the answer goes to the thread as a message)", AnswerIn,
        params=(Param("ask_id", "path", {"type": "string"}, "row id or tool_use_id"),), errors=(404, 409, 415, 422)),
     actions.answer_ask),
    (Op("delete", "/api/asks/{ask_id}", "cancel a question",
        params=(Param("ask_id", "path", {"type": "string"}, "row id or tool_use_id"),), errors=(404, 409)),
     actions.cancel_ask),
    (Op("get", "/api/threads", "threads, newest first, including ones still being created; a page at a time",
        params=(_LIMIT, _BEFORE), errors=(400,)), reads.list_threads),
    *notify.OPS,
    *receipts.OPS,
    (Op("get", "/api/threads/{thread_id}/conversation", "the newest records a thread's chat renders, oldest first",
        params=(Param("thread_id", "path", UUID), _AFTER,
                Param("before_seq", "query", SEQ, "page back: only records with a smaller seq"), _LIMIT),
        errors=(400,)), reads.conversation),
    (Op("get", "/api/claude-sessions", "the CLI's stored conversations on every executor, newest first", params=(
        Param("q", "query", {"type": "string"}, "text in the title, directory or id"),
        Param("dir", "query", {"type": "string"}, "this directory and those under it"),
        Param("executor", "query", {"type": "string"}),
        Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 200}),
        Param("offset", "query", {"type": "integer", "minimum": 0})), errors=(400,)), claude_sessions.list_sessions),
    (Op("get", "/api/threads/{thread_id}", "one thread: its mode, state and the command that continues it in a "
        "terminal", params=_THREADP, errors=(404,)), reads.get_thread),
    (Op("get", "/api/info", "what this server is: version, demo mode, auth mode"), info),
    (Op("get", "/api/queue", "chat messages not yet delivered", params=(_THREADQ,), errors=(400,)),
     reads.pending_queue),
    (Op("get", "/api/tasks", "running and recent tasks", params=(
        Param("status", "query", {"type": "string", "enum": list(reads.STATUSES)}), _THREADQ,
        Param("running", "query", {"type": "boolean"}), _LIMIT, _BEFORE), errors=(400,)), reads.list_tasks),
    (Op("get", "/api/tasks/{task_id}", "one task: status, activity, last output, exit facts", params=(_TASK,),
        errors=(404,)), reads.get_task),
    (Op("get", "/api/tasks/{task_id}/events", "a task's journal events, by seq", params=(_TASK, _AFTER, _LIMIT),
        errors=(400, 404)), reads.task_events),
    (Op("get", "/api/events", "the journal, by seq", params=(
        _AFTER, _LIMIT, Param("tier", "query", {"type": "string", "enum": ["raw", "derived"]}),
        Param("task_id", "query", UUID), Param("event_type", "query", {"type": "string"})), errors=(400,)),
     reads.events),
    (Op("get", "/api/handoffs", "handoffs of a task, session or project, newest first", params=(
        Param("scope_id", "query", UUID), _LIMIT), errors=(400,)), reads.handoffs),
    (Op("get", "/api/projects/{project_id}/state", "plan tasks done / in flight / failed / blocked",
        params=(Param("project_id", "path", UUID),), errors=(404,)), reads.project_state),
    (Op("get", "/api/context", "the orchestrator's working set for a thread", params=(_THREADQ,), errors=(400,)),
     reads.context),
    (Op("get", "/api/executors", "the executors sharing the database: labels, load, lease age, version, state"),
     reads.list_executors),
    (Op("get", "/api/asks", "questions, pending first", params=(
        Param("status", "query", {"type": "string", "enum": ["pending", "answered", "cancelled"]}), _THREADQ,
        _LIMIT), errors=(400,)), reads.list_asks),
    (Op("get", "/api/gate-rules", "standing gate rules (live first), for one thread or all; and queued requests",
        params=(_THREADQ, Param("revoked", "query", {"type": "boolean"}), _LIMIT), errors=(400,)), gate_rules.list_rules),
    (Op("post", "/api/gate-rules", "queue a standing allow rule for a thread or a project", gate_rules.GateRuleIn,
        status=202, errors=(415, 422)), gate_rules.request_rule),
    (Op("delete", "/api/gate-rules/{rule_id}", "revoke a standing gate rule", params=(Param("rule_id", "path", UUID),),
        errors=(404, 409)), gate_rules.revoke_rule),
    (Op("get", "/api/stream", "the live journal as Server-Sent Events (resume with Last-Event-ID)", params=(
        _AFTER, Param("Last-Event-ID", "header", SEQ)), errors=(400,)), stream.stream),
    (Op("post", "/api/projects", "register a project on a git repository (the executor checks the workdir)",
        ProjectIn, status=202, errors=(400, 409, 415, 422)), project_routes.create_project),
    (Op("get", "/api/projects", "projects, and the recent project requests with their outcome"),
     project_routes.list_projects),
    (Op("get", "/api/projects/{project_id}", "a project: plan tasks with their latest run and handoffs, "
        "branches waiting for review, usage", params=(Param("project_id", "path", UUID),), errors=(404,)),
     project_routes.get_project),
    (Op("patch", "/api/projects/{project_id}", "change a project's push remote (the executor checks it)",
        ProjectPatch, params=(Param("project_id", "path", UUID),), status=202, errors=(404, 415, 422)),
     project_routes.update_project),
    (Op("get", "/api/project-requests/{request_id}", "a project request (create, update, merge, push …), its outcome",
        params=(Param("request_id", "path", UUID),), errors=(404,)), project_routes.get_request),
    (Op("get", "/api/tasks/{task_id}/diff", "what a project worker changed: commits, files, diffstat, the diff",
        params=(_TASK,), errors=(404, 409)), project_routes.task_diff),
    (Op("post", "/api/tasks/{task_id}/merge", "merge a worker's branch into the project's branch", ReviewIn, True,
        (_TASK,), 202, (404, 409, 415, 422)), project_routes.merge_task),
    (Op("post", "/api/tasks/{task_id}/discard", "discard a worker's branch", ReviewIn, True, (_TASK,), 202,
        (404, 409, 415, 422)), project_routes.discard_task),
    (Op("post", "/api/tasks/{task_id}/push", "push a worker's reviewed commit to its branch on the project's push "
        "remote", ReviewIn, True, (_TASK,), 202, (404, 409, 415, 422)), project_routes.push_task),
    (Op("post", "/api/tasks/{task_id}/review", "send a review of a worker's diff (line comments) back: a follow-up "
        "worker continues on the reviewed commit", SendBackIn, False, (_TASK,), 202, (404, 409, 415, 422)),
     project_routes.send_back),
    (Op("get", "/api/usage", "tokens and cost from the runs' result lines, by task, thread, project or day",
        params=(Param("by", "query", {"type": "string", "enum": ["task", "thread", "project", "day"]}), _TASK_Q,
                _THREADQ, Param("project_id", "query", UUID)), errors=(400,)), project_routes.usage),
    # routines: definitions are the user's; a trigger is verified and queued, the executor runs it
    (Op("post", "/api/routines", "create a routine (cron expression and template checked); its fire token and "
        "webhook secret are in this answer only", RoutineIn, status=202, errors=(404, 415, 422)),
     routine_routes.create_routine),
    (Op("get", "/api/routines", "routines, with their next fire times and last run"), routine_routes.list_routines),
    (Op("patch", "/api/routines/{routine_id}", "enable, disable or edit a routine", RoutinePatch,
        params=(_ROUTINE,), errors=(404, 415, 422)), routine_routes.patch_routine),
    (Op("delete", "/api/routines/{routine_id}", "delete a routine (its runs stay in the history)",
        params=(_ROUTINE,), errors=(404,)), routine_routes.delete_routine),
    (Op("get", "/api/routines/{routine_id}/runs", "a routine's runs, newest first: trigger, rendered prompt, "
        "status, cost, duration, thread and turn", params=(_ROUTINE,), errors=(404,)), routine_routes.list_runs),
    (Op("post", "/api/routines/{routine_id}/run", "run a routine now, as the signed-in user", RunIn, True,
        (_ROUTINE,), 202, (404, 415, 422)), routine_routes.run_now),
    (Op("post", "/api/routines/{routine_id}/fire", "start a run with the routine's fire token (Authorization: "
        "Bearer <fire token>; not the user's token)", RunIn, True, (_ROUTINE,), 202, (409, 415, 422)),
     routine_routes.fire),
    (Op("post", "/api/hooks/{routine_id}", "a webhook delivery, signed the Standard Webhooks way (webhook-id, "
        "webhook-timestamp within 5 minutes, webhook-signature over id.timestamp.body) or GitHub's "
        "(X-Hub-Signature-256 HMAC of the body, X-GitHub-Delivery); a delivery id seen before, or a GitHub body "
        "accepted in the last 30 days, is refused; the JSON payload is the run's `event`",
        params=(_ROUTINE, Param("webhook-id", "header", {"type": "string"}),
                Param("webhook-timestamp", "header", {"type": "string"}),
                Param("webhook-signature", "header", {"type": "string"}),
                Param("X-Hub-Signature-256", "header", {"type": "string"}),
                Param("X-GitHub-Delivery", "header", {"type": "string"})),
        status=202, errors=(400, 409, 413, 415)), routine_routes.hook),
    (Op("get", "/api/quota", "the account's rate-limit windows as the CLI reports them (utilisation, reset time); "
        "while one is exhausted routines' runs wait for its reset"), routine_routes.quota),
]


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "up"})


async def readyz(request: Request) -> Response:
    db: Database = request.app.state.db
    try:
        async with db.pool.connection(timeout=READYZ_TIMEOUT_S) as conn:
            row = await (await conn.execute(queries["count_applied_migrations"])).fetchone()
            applied = row[0] if row else 0  # count(*): always one row
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        availability = db.availability
        cause = availability.cause or str(exc).strip()[:200] or type(exc).__name__
        since = (datetime.fromtimestamp(availability.down_since, UTC).isoformat()
                 if availability.down_since is not None else None)
        response = problems.problem(503, f"database unreachable: {cause}", cause="database", since=since)
        response.headers["Retry-After"] = str(problems.RETRY_AFTER_S)
        return response
    db.availability.succeeded()
    expected = len(migrate.discover())
    if applied < expected:
        return problems.problem(503, f"migrations pending ({applied} of {expected} applied)", cause="migrations")
    # seqs a failover lost (asynchronous replication): ready, but said until the ingress restarts
    lost = [loss.as_dict() for loss in db.seq_mark.losses]
    return JSONResponse({"status": "ready", "migrations": applied, **({"journal_lost": lost} if lost else {})})


def shutdown_trigger(app: Starlette, stop: asyncio.Event) -> Callable[[], Awaitable[None]]:
    """Hypercorn's shutdown trigger: when `stop` is set, end every SSE stream at once, so the graceful
    shutdown does not wait out open streams (their clients resume by Last-Event-ID)."""

    async def trigger() -> None:
        await stop.wait()
        broadcaster = getattr(app.state, "broadcaster", None)
        if broadcaster is not None:
            broadcaster.close()

    return trigger


def create_app(config: IngressConfig) -> Starlette:
    auth, boundary = config.auth, config.boundary
    limiter = TokenLimiter()
    spec = document([op for op, _ in OPS], version="0.1.0")

    async def openapi(request: Request) -> Response:
        return JSONResponse(spec)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # during an outage it serves anyway: 503s, and a /readyz that says why
        async with Database(config.dsn, name="petal-ingress", max_size=10, acquire_timeout_s=ACQUIRE_TIMEOUT_S,
                            at_start="serve") as db:
            app.state.db = db
            app.state.queries = Queries(db.pool, queries)
            app.state.shared_queries = Queries(db.pool, shared_sql)
            listener = db.listener(stream.CHANNELS)
            sub = listener.subscribe()
            broadcaster = stream.Broadcaster(db.pool, buffer=config.sse_client_buffer)
            app.state.broadcaster = broadcaster
            listening = asyncio.create_task(listener.run(), name="ingress-listener")
            try:
                async with stream.running(broadcaster, sub):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(listener.connected.wait(), LISTEN_WAIT_S)
                    yield
            finally:
                await aio.cancel_and_wait(listening)

    routes: list[BaseRoute] = [Route(op.path, handler, methods=[op.method.upper()]) for op, handler in OPS]
    routes += [Route("/healthz", healthz), Route("/readyz", readyz), Route("/openapi.json", openapi),
               Route("/login", signin.login, methods=["GET", "POST"])]
    if STATIC.is_dir():
        routes.append(Mount("/", StaticFiles(directory=STATIC, html=True), name="static"))
    app = Starlette(
        routes=routes,
        # the boundary (Host, Origin, security headers) first, then identity
        middleware=[Middleware(BoundaryMiddleware, config=boundary),
                    Middleware(GuardMiddleware, config=auth, boundary=boundary, limiter=limiter)],
        exception_handlers={problems.Problem: problems.handle_problem, HTTPException: problems.handle_http,
                            BodyTooLarge: problems.handle_too_large, ClientDisconnect: problems.handle_client_gone,
                            ValidationError: problems.handle_validation, psycopg.DataError: problems.handle_data_error,
                            # one place for "the database is away": refused, cut, or no connection in time
                            psycopg.OperationalError: problems.handle_unavailable,
                            DatabaseUnavailable: problems.handle_unavailable,
                            DatabaseRefused: problems.handle_refused,
                            # a deadlock or serialization failure is no outage: 409, retry
                            **dict.fromkeys(CONTENDED, problems.handle_contended),
                            Exception: problems.handle_unexpected},
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.auth = auth
    app.state.boundary = boundary
    app.state.limiter = limiter
    return app
