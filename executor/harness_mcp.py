"""The harness MCP server (streamable HTTP at /harness-mcp/), hosted by the executor.

Claude sees these tools as mcp__harness__<name>. It is the information surface; lifecycle control
stays in the harness (dispatch_worker records a request, the supervisor spawns it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from pydantic import BaseModel, Field
from starlette.applications import Starlette

from executor import approvals, briefs, dispatch, permission_prompt, projects
from executor.journal_writer import JournalWriter
from executor.refusals import RefusalBudget
from executor.sql import queries
from shared import aio, logs, read_surface
from shared.database import OUTAGE_ERRORS, Database
from shared.listener import RESYNC, Listener
from shared.models import NewEvent

log = logs.get(__name__)

PATH = "/harness-mcp/"
# The per-spawn credential arrives as "Authorization: Bearer <token>" (see substrate.mcp_config).
CREDENTIAL_HEADER = "authorization"
# Headers older configs used to declare an identity; now ignored, only named in a refusal's record.
IGNORED_IDENTITY_HEADERS = ("x-petal-session", "x-petal-task")
TOOL_USE_META = "claudecode/toolUseId"
# Progress is sent this often while a question waits: the CLI aborts a call silent for 300 s (or for
# CLAUDE_CODE_MCP_TOOL_IDLE_TIMEOUT), and a progress notification resets that clock.
PROGRESS_INTERVAL_S = 5.0
TIMED_OUT = "Timed out waiting for user input"
TIMED_OUT_STATUS = "timed_out"  # the wait's outcome (the row stays pending, marked late)
LATE_NOTE = ("the question stays open in the user's panel, marked late; if they answer it, the answer "
             "reaches you as a harness message")
DISMISSED = "The user dismissed the question without answering"
MAX_QUESTIONS, MIN_OPTIONS, MAX_OPTIONS, MAX_HEADER = 4, 2, 4, 12


class Option(BaseModel):
    label: str = Field(description="the choice as shown on its button (1-5 words)")
    description: str = Field(default="", description="what choosing it means")
    preview: str | None = Field(default=None, description="optional markdown shown with the option")


class Question(BaseModel):
    question: str = Field(description="the full question, ending with a question mark")
    header: str = Field(description="a very short label (at most 12 characters)")
    options: list[Option] = Field(description="2-4 choices; the user can always type another answer")
    multiSelect: bool = Field(default=False, description="true to allow several choices")  # noqa: N815


def broken_rule(questions: list[Question]) -> str | None:
    """The first rule the input breaks, named so the model can fix it; None when valid."""
    if not 1 <= len(questions) <= MAX_QUESTIONS:
        return f"rule: 1-{MAX_QUESTIONS} questions per call (got {len(questions)})"
    texts = [q.question for q in questions]
    if len(set(texts)) != len(texts):
        return "rule: question texts must be unique within a call"
    for q in questions:
        if not q.question.strip():
            return "rule: a question's text may not be empty"
        if not q.header.strip() or len(q.header) > MAX_HEADER:
            return f"rule: header is 1-{MAX_HEADER} characters ({q.header!r} has {len(q.header)})"
        if not MIN_OPTIONS <= len(q.options) <= MAX_OPTIONS:
            return f"rule: {MIN_OPTIONS}-{MAX_OPTIONS} options per question ({q.question!r} has {len(q.options)})"
        labels = [o.label for o in q.options]
        if any(not label.strip() for label in labels):
            return f"rule: option labels may not be empty ({q.question!r})"
        if len(set(labels)) != len(labels):
            return f"rule: option labels must be unique within a question ({q.question!r})"
    return None


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling, as resolved from the per-spawn credential alone (never from what the call declares)."""

    task_id: uuid.UUID
    session_id: uuid.UUID
    # the orchestrator conversation the call belongs to: its own session for a turn, the dispatching
    # turn's session for a worker; None for a task outside any thread
    thread_id: uuid.UUID | None
    project_id: uuid.UUID | None
    role: str


class CallRefused(ToolError):
    """A call without a valid credential: nothing was done, only the refusal was journaled."""


def bearer(headers: Any) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    value = (headers or {}).get(CREDENTIAL_HEADER) or ""
    scheme, _, token = value.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _peer(ctx: Context) -> str | None:
    client = getattr(getattr(ctx.request_context, "request", None), "client", None)
    return f"{client.host}:{client.port}" if client else None


@dataclass
class Harness:
    db: Database
    writer: JournalWriter
    listener: Listener
    ask_timeout_s: float
    progress_interval_s: float = PROGRESS_INTERVAL_S
    # refused calls journaled per peer address: a local loop of forged calls cannot fill the journal
    refusals: RefusalBudget = field(default_factory=RefusalBudget)
    # Callers whose credential the store confirmed, by its hash, while their process lives (the supervisor
    # forgets them at its exit, in this same process): during a database outage a live worker's plainly
    # safe tool calls are still checked and allowed, instead of every Bash call failing closed.
    _confirmed: dict[bytes, Caller] = field(default_factory=dict)

    def forget(self, task_id: uuid.UUID) -> None:
        """A task's process exited: its credential no longer counts, database or not."""
        for digest in [d for d, c in self._confirmed.items() if c.task_id == task_id]:
            del self._confirmed[digest]

    async def _one(self, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
        async with self.db.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(queries[name], params)
            return await cur.fetchone() if cur.description else None

    async def caller(self, ctx: Context, tool: str) -> Caller:
        """The caller behind the call's credential.

        Raises:
            CallRefused: no credential, an unknown one, or one whose process has exited or whose task
                is no longer running; the only thing written is a `harness.call_refused` record.
        """
        headers = ctx.headers or {}
        token = bearer(headers)
        row = None
        if token is None:
            reason = "no credential"
        else:
            digest = hashlib.sha256(token.encode()).digest()
            try:
                row = await self._one("harness_caller", {"token_sha256": digest})
            except OUTAGE_ERRORS:
                known = self._confirmed.get(digest)
                if known is None:
                    raise  # nothing confirmed it: the call fails, closed
                return known
            if row is None:
                reason = "unknown credential"
            elif row["status"] != "running":
                reason = f"the credential's task has ended ({row['status']})"
            elif row["revoked_at"] is not None:
                reason = "the credential's process has exited"
            else:
                caller = Caller(task_id=row["task_id"], session_id=row["session_id"], thread_id=row["thread_id"],
                                project_id=row["project_id"], role=row["role"])
                self._confirmed[digest] = caller
                return caller
        payload: dict[str, Any] = {"tool": tool, "reason": reason, "peer": _peer(ctx)}
        declared = [h for h in IGNORED_IDENTITY_HEADERS if h in headers]
        if declared:
            payload["ignored_headers"] = declared
        if row is not None:  # an ended task's own credential: worth knowing whose it was
            payload["credential_task_id"] = str(row["task_id"])
        left_out = self.refusals.admit((payload["peer"] or "").rpartition(":")[0] or None)
        if left_out is not None:
            if left_out:
                payload["not_journaled_before"] = left_out
            await self.writer.write([NewEvent("harness.call_refused", payload)])
            log.warning("harness_call_refused", **payload)
        raise CallRefused(f"{tool} refused: {reason}. The harness answers only the processes it spawned, "
                          "identified by the credential in their per-spawn MCP config; nothing was done.")

    async def ask(self, questions: list[Question], ctx: Context) -> dict[str, Any]:
        caller = await self.caller(ctx, "ask_user_question")
        rule = broken_rule(questions)
        if rule is not None:
            raise ToolError(f"ask_user_question refused, nothing was asked: {rule}")
        raw_meta: Any = ctx.request_context.meta or {}
        # a plain dict in mcp 2.3.x; a model in some builds
        meta = raw_meta.model_dump() if hasattr(raw_meta, "model_dump") else dict(raw_meta)
        tool_use_id = meta.get(TOOL_USE_META) or f"mcp-{uuid.uuid4()}"
        stored = [q.model_dump(exclude_none=True) for q in questions]
        final = await self.ask_user(stored, tool_use_id, caller, ctx)
        result: dict[str, Any] = {"questions": stored, "answers": final["answers"]}
        if final["response"] is not None:
            result["response"] = final["response"]
        if final.get("answered_via") == "chat":
            result["annotation"] = "the user replied in the chat instead of choosing an option"
        if final["status"] == TIMED_OUT_STATUS:
            result["annotation"] = LATE_NOTE
        return result

    async def ask_user(self, stored: list[dict[str, Any]], tool_use_id: str, caller: Caller, ctx: Context,
                       asked_by: str = "model") -> dict[str, Any]:
        """Put questions in the Asks panel and wait for the answer (journaled both ways); the closed row."""
        task_id = caller.task_id
        # subscribe before the row exists, so an answer can never arrive unseen
        with self.listener.subscribe(["question_answered"]) as sub:
            row = await self._one("insert_question", {"tool_use_id": tool_use_id, "session_id": caller.session_id,
                                                      "task_id": task_id, "questions": Jsonb(stored),
                                                      "asked_by": asked_by})
            if row is None:  # the same tool call again (a client retry): wait on the first row
                row = await self._one("question_by_tool_use_id", {"tool_use_id": tool_use_id})
                assert row is not None
            qid = row["id"]
            await self.writer.put(NewEvent("question.asked", {"question_id": str(qid), "tool_use_id": tool_use_id,
                                                              "questions": stored, "asked_by": asked_by},
                                           task_id=task_id, session_id=caller.session_id))
            await self._set_activity(task_id, "awaiting_user")
            try:
                # in a thread the question outlives the wait: a late answer goes to the thread as a message
                final = await self._wait(qid, sub, ctx, late_ok=caller.thread_id is not None)
            except BaseException:
                # the caller went away (the CLI was stopped): the question can never be delivered
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._one("close_question", {"id": qid,
                                                                      "response": "the asking process went away"}))
                raise
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._set_activity(task_id, "running"))
        answers = final["answers"] or {}
        response = final["response"]
        if final["status"] == "cancelled" and response is None:
            response = DISMISSED
        event = {"answered": "question.answered", TIMED_OUT_STATUS: "question.timed_out"}.get(
            final["status"], "question.cancelled")
        payload: dict[str, Any] = {"question_id": str(qid), "tool_use_id": tool_use_id, "answers": answers,
                                   "response": response}
        if final["status"] == TIMED_OUT_STATUS:
            payload["late_answer"] = "accepted: it goes to the thread as a message"
        await self.writer.put(NewEvent(event, payload, task_id=task_id, session_id=caller.session_id))
        return {**final, "answers": answers, "response": response}

    async def _set_activity(self, task_id: uuid.UUID, activity: str) -> None:
        async with self.db.pool.connection() as conn:
            await conn.execute(queries["set_task_activity"], {"id": task_id, "activity": activity})

    async def _wait(self, qid: uuid.UUID, sub: Any, ctx: Context, *, late_ok: bool = False) -> dict[str, Any]:
        deadline = time.monotonic() + self.ask_timeout_s
        progress = 0
        while True:
            row = await self._one("get_question", {"id": qid})
            assert row is not None
            if row["status"] != "pending":
                return row
            left = deadline - time.monotonic()
            if left <= 0:
                if late_ok:
                    if await self._one("mark_question_timed_out", {"id": qid}) is None:
                        continue  # answered in the same instant: the answer wins
                    return {"status": TIMED_OUT_STATUS, "answers": {}, "response": TIMED_OUT}
                if await self._one("close_question", {"id": qid, "response": TIMED_OUT}) is None:
                    continue  # answered in the same instant: the answer wins
                return {"status": "cancelled", "answers": {}, "response": TIMED_OUT}
            try:
                await aio.wait_for(_news_of(sub, str(qid)), min(left, self.progress_interval_s))
            except TimeoutError:
                progress += 1
                with contextlib.suppress(Exception):
                    await ctx.report_progress(progress, None, "waiting for the user's answer")

    async def dispatch_worker(self, ctx: Context, brief: str, plan_ref: str | None, project_id: str | None,
                              allowed_tools: list[str] | None, override_ruled_out: str | None) -> dict[str, Any]:
        caller = await self.caller(ctx, "dispatch_worker")
        try:
            project = uuid.UUID(project_id) if project_id else caller.project_id
        except ValueError:
            raise ToolError(f"project_id {project_id!r} is not a UUID") from None
        scope = project or caller.session_id
        title = None
        if plan_ref and project is not None:
            try:  # a plan_ref the project's plan does not list is a mistake worth telling the model
                title = await projects.plan_task_title(self.db.pool, project, plan_ref)
            except projects.Refused as exc:
                raise ToolError(f"dispatch refused: {exc}") from None
        if not override_ruled_out:
            matches = await read_surface.check_ruled_out(self.db.pool, scope, brief)
            if matches:
                found = [{"approach": m["approach"], "reason": m["reason"]} for m in matches]
                await self.writer.put(NewEvent("task.dispatch_refused", {
                    "brief": brief, "reason": "matches a prior rule-out", "rule_outs": found},
                    task_id=caller.task_id, session_id=caller.session_id, project_id=project))
                raise ToolError("dispatch refused: the brief matches approaches already ruled out "
                                f"{found}; change the brief, or pass override_ruled_out with the reason")
        brief = await briefs.enrich(self.db.pool, brief, scope=scope, project_id=project, plan_ref=plan_ref)
        if title:  # the worker knows which plan task it is doing
            brief = f"{brief}\n\n## Plan task {plan_ref}: {title}"
        # the thread's mode, not the caller's own session: a worker of an interactive thread asks too
        mode = await self._one("thread_mode", {"id": caller.thread_id}) if caller.thread_id else None
        if mode is not None and mode["mode"] == "interactive":
            return await self._approve(brief, caller, project, plan_ref, allowed_tools, _tool_use_id(ctx))
        try:
            new_id = await dispatch.request_task(
                self.db.pool, brief=brief, project_id=project, plan_ref=plan_ref, allowed_tools=allowed_tools,
                parent_task_id=caller.task_id, requested_by=str(caller.session_id), tool_use_id=_tool_use_id(ctx))
        except dispatch.DispatchRefused as exc:
            raise ToolError(f"dispatch refused: {exc}") from None
        return {"task_id": str(new_id), "status": "pending",
                "note": "the harness runs it; its handoff comes back to you when it finishes"}

    async def _approve(self, brief: str, caller: Caller, project: uuid.UUID | None, plan_ref: str | None,
                       allowed_tools: list[str] | None, tool_use_id: str | None) -> dict[str, Any]:
        """An interactive thread: the worker is recorded waiting for the user's Approve in the Asks panel,
        and the call returns at once — the approval is durable state (executor/approvals.py), not a wait
        that could time out; the orchestrator hears the answer as a harness message."""
        assert caller.thread_id is not None
        try:
            task_id = await approvals.request(
                self.db.pool, brief=brief, thread_id=caller.thread_id, asker_task_id=caller.task_id,
                project_id=project, plan_ref=plan_ref, allowed_tools=allowed_tools,
                requested_by=str(caller.session_id), tool_use_id=tool_use_id)
        except dispatch.DispatchRefused as exc:
            raise ToolError(f"dispatch refused: {exc}") from None
        return {"task_id": str(task_id), "status": "awaiting_approval", "note": approvals.AWAITING}


async def _news_of(sub: Any, qid: str) -> None:
    """Until a notification says this question changed, or a resync says anything may have. Another
    question's answer is no news: re-reading the row for it cost every waiter a query per answer."""
    while (note := await sub.get()) is not RESYNC and note.payload != qid:
        pass


def _tool_use_id(ctx: Context) -> str | None:
    """The CLI's id of the tool call being served (from the request's `_meta`), if it sent one."""
    raw_meta: Any = ctx.request_context.meta or {}
    # a plain dict in mcp 2.3.x; a model in some builds
    meta = raw_meta.model_dump() if hasattr(raw_meta, "model_dump") else dict(raw_meta)
    found = meta.get(TOOL_USE_META)
    return found if isinstance(found, str) else None


def build(harness: Harness) -> MCPServer:
    mcp = MCPServer("harness", instructions="petal-dispatch harness: ask the user, read handoffs and the "
                    "project state, check rule-outs, and request workers.")

    @mcp.tool(structured_output=True)
    async def ask_user_question(questions: list[Question], ctx: Context) -> dict[str, Any]:
        """Ask the user 1-4 multiple-choice questions and wait for the answers (the chat stays usable).

        Each question has 2-4 options; headers are at most 12 characters; the user may also type a
        free-text answer or reply instead of choosing. Returns {questions, answers, response?}: answers
        maps each question's text to the chosen label (or a list of labels for multiSelect); a typed
        answer is the text itself; a reply without answers comes back in `response`.
        """
        return await harness.ask(questions, ctx)

    @mcp.tool(structured_output=True)
    async def get_handoffs(ctx: Context, scope_id: str, limit: int = 10) -> dict[str, Any]:
        """The handoffs of a task, session or project, newest first (goal, state, next step, ruled out…)."""
        await harness.caller(ctx, "get_handoffs")
        scope = _uuid(scope_id, "scope_id")
        rows = await read_surface.get_handoffs(harness.db.pool, scope, max(1, min(limit, 50)))
        return {"handoffs": [{"task_id": str(r["task_id"]) if r["task_id"] else None, "seq": r["seq"],
                              "created_at": r["created_at"].isoformat(), **r["payload"]} for r in rows]}

    @mcp.tool(structured_output=True)
    async def get_project_state(ctx: Context, project_id: str) -> dict[str, Any]:
        """A short rollup of a project's plan tasks: done, in flight, failed, blocked."""
        await harness.caller(ctx, "get_project_state")
        state = await read_surface.get_project_state(harness.db.pool, _uuid(project_id, "project_id"))
        if state is None:
            raise ToolError(f"no project {project_id}")
        state["project"] = {k: str(v) for k, v in state["project"].items()}
        return state

    @mcp.tool(structured_output=True)
    async def check_ruled_out(ctx: Context, scope_id: str, candidate: str) -> dict[str, Any]:
        """Prior rule-outs in a scope that look like the candidate approach (check before dispatching)."""
        await harness.caller(ctx, "check_ruled_out")
        rows = await read_surface.check_ruled_out(harness.db.pool, _uuid(scope_id, "scope_id"), candidate)
        return {"matches": [{"approach": r["approach"], "reason": r["reason"], "overlap": round(r["overlap"], 2)}
                            for r in rows]}

    @mcp.tool(structured_output=True)
    async def dispatch_worker(ctx: Context, brief: str, plan_ref: str | None = None, project_id: str | None = None,
                              allowed_tools: list[str] | None = None,
                              override_ruled_out: str | None = None) -> dict[str, Any]:
        """Ask the harness for a headless worker to carry out `brief`; returns its task id at once.

        The harness spawns and supervises it; when it exits, its derived handoff comes back to you.
        In an interactive thread it returns at once with status `awaiting_approval`: the worker starts
        when the user approves it, and a harness message tells you the answer either way.
        A brief matching a prior rule-out is refused unless override_ruled_out gives the reason.
        """
        return await harness.dispatch_worker(ctx, brief, plan_ref, project_id, allowed_tools, override_ruled_out)

    # the CLI's --permission-prompt-tool (every worker's Bash/edit calls): executor/permission_prompt.py
    permission_prompt.register_harness(mcp, harness)
    return mcp


def _uuid(value: str, name: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ToolError(f"{name} must be a UUID, got {value!r}") from None


def asgi_app(mcp: MCPServer, host: str) -> Starlette:
    # Host/Origin checks on: only loopback names reach the server (no DNS rebinding from a browser).
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{host}:*", "127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )
    # Stateless: no server-side session per client, so nothing a local process can open by the thousand
    # to exhaust the SDK's session cap and lock real spawns out (each call is identified by its credential
    # anyway, never by a session; progress still flows on the call's own response stream).
    return mcp.streamable_http_app(streamable_http_path=PATH, transport_security=security, host=host,
                                   stateless_http=True)
