"""`dispatch_worker`: the model asks for a headless worker; the harness records the request and the
supervisor spawns it (lifecycle control stays in the harness). In an interactive thread the worker first
waits for the user's approval (executor/settle/approvals.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
import weakref
from typing import Any, Literal, NoReturn

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from executor.harness import scope as scopes
from executor.harness.identity import tool_use_id
from executor.harness.refusals import credential_key
from executor.harness.results import Result
from executor.harness.services import Harness
from executor.harness.store import HarnessStore
from executor.projects import service as projects
from executor.run import user_input
from executor.run.caller import Caller
from executor.run.task_store import TaskRows
from executor.settle import approvals, briefs, dispatch
from executor.settle.dispatch import TaskRequest
from executor.settle.thread_store import ThreadStore
from shared import read_surface
from shared.models import NewEvent
from shared.work import work

STARTED = "the harness runs it; its handoff comes back to you when it finishes"


class Dispatched(Result):
    task_id: str = Field(description="the worker's task id")
    status: Literal["pending", "awaiting_approval"] = Field(
        description="pending: the harness starts it; awaiting_approval: it starts when the user approves it")
    note: str = Field(description="what happens next")


class _Workers:
    def __init__(self, harness: Harness):
        self.harness = harness
        self.pool = harness.db.pool
        # a lock per caller while any of its calls holds it
        self._locks: weakref.WeakValueDictionary[uuid.UUID, asyncio.Lock] = weakref.WeakValueDictionary()

    async def dispatch(self, ctx: Context, brief: str, plan_ref: str | None, project_id: str | None,
                       allowed_tools: list[str] | None, override_ruled_out: str | None,
                       attachments: list[str] | None) -> Dispatched:
        caller = await self.harness.identities.caller(ctx, "dispatch_worker")
        try:
            named = uuid.UUID(project_id) if project_id else None
        except ValueError:
            raise ToolError(f"project_id {project_id!r} is not a UUID") from None
        # one caller's dispatches in turn (its credential is served by this executor alone): the bounds are
        # counted, then the worker inserted, with no other of its calls in between
        lock = self._locks.setdefault(caller.task_id, asyncio.Lock())
        async with lock:
            return await self._dispatch(ctx, caller, brief, plan_ref, named, allowed_tools, override_ruled_out,
                                        attachments)

    async def _dispatch(self, ctx: Context, caller: Caller, brief: str, plan_ref: str | None,
                        named: uuid.UUID | None, allowed_tools: list[str] | None, override_ruled_out: str | None,
                        attachments: list[str] | None) -> Dispatched:
        project = caller.project_id  # never another: a worker works where its caller's thread does
        found = await self._within_bounds(caller, brief, named)
        brief = await self._brief(caller, brief, plan_ref, override_ruled_out)
        files = chosen_files(await self._files(caller), attachments)
        if files and project is not None:  # in its worktree (user_input.place_in_worktree); else with its brief
            brief = f"{brief}\n\n" + user_input.files_note(
                [f["name"] for f in files], [f["media_type"] for f in files], [f["size_bytes"] for f in files])
        file_ids = tuple(f["id"] for f in files)
        # the thread's mode, not the caller's own session: a worker of an interactive thread asks too, at any
        # depth (the thread of its lineage's root)
        thread = caller.thread_id or found.thread_id
        mode = await ThreadStore(self.harness.q).mode(thread) if thread else None
        if thread is not None:  # a routine's run: at most its routine's max_workers at once, at any depth
            await self._check_routine_workers(self.harness.store, thread)
        if thread is not None and mode == "interactive":
            return await self._approve(brief, caller, thread, project, plan_ref, allowed_tools, tool_use_id(ctx),
                                       file_ids)
        new_id = await self._insert(caller, thread, dispatch.TaskRequest(
            "worker", brief, project_id=project, project_workdir=True, plan_ref=plan_ref,
            allowed_tools=tuple(allowed_tools) if allowed_tools is not None else None,
            parent_task_id=caller.task_id, requested_by=str(caller.session_id),
            tool_use_id=tool_use_id(ctx), attachment_ids=file_ids))
        return Dispatched(task_id=str(new_id), status="pending", note=STARTED)

    async def _within_bounds(self, caller: Caller, brief: str, named: uuid.UUID | None) -> scopes.Lineage:
        """The caller's lineage, when it may ask for another worker in the project it named; else refused."""
        refused = scopes.project_refusal(caller, named)
        if refused is not None:
            await self._refuse(caller, brief, "another project", refused, {"project_id": str(named)})
        found = await self.harness.store.lineage(caller.task_id)
        over = scopes.over_bounds(self.harness.dispatch_limits, found)
        if over is not None:
            await self._refuse(caller, brief, over[0], over[1], {"depth": found.depth, "dispatched": found.dispatched})
        return found

    async def _brief(self, caller: Caller, brief: str, plan_ref: str | None, override_ruled_out: str | None) -> str:
        """The worker's brief: refused when it matches a rule-out (unless overridden) or names a plan task the
        project's plan does not list; enriched with what the store knows, and the plan task's title."""
        project = caller.project_id
        scope = project or caller.session_id
        title = None
        if plan_ref and project is not None:
            try:  # a plan_ref the project's plan does not list is a mistake worth telling the model
                title = await projects.plan_task_title(self.pool, project, plan_ref)
            except projects.Refused as exc:
                raise ToolError(f"dispatch refused: {exc}") from None
        if not override_ruled_out:
            matches = await read_surface.check_ruled_out(self.pool, scope, brief)
            if matches:
                rule_outs = [{"approach": m["approach"], "reason": m["reason"]} for m in matches]
                await self._refuse(caller, brief, "matches a prior rule-out",
                                   f"the brief matches approaches already ruled out {rule_outs}; change the "
                                   "brief, or pass override_ruled_out with the reason", {"rule_outs": rule_outs})
        brief = await briefs.enrich(self.pool, brief, scope=scope, project_id=project, plan_ref=plan_ref)
        return f"{brief}\n\n## Plan task {plan_ref}: {title}" if title else brief  # it knows which plan task

    async def _insert(self, caller: Caller, thread: uuid.UUID | None, asked: TaskRequest) -> uuid.UUID:
        """The worker's task, pending; a routine's run (`thread`: the caller's lineage's, at any depth) counts its
        workers again under its run's lock."""
        try:
            async with work(self.harness.q) as unit:
                if thread is not None:
                    # again under the run's row lock, to the insert's commit: two calls at once (a turn's, or two
                    # workers') are counted in turn (the lock first, then a count that sees the other's worker)
                    runs = HarnessStore(unit)
                    await runs.lock_routine_run(thread)
                    await self._check_routine_workers(runs, thread)
                return await dispatch.request_task(unit, asked)
        except dispatch.DispatchRefused as exc:
            raise ToolError(f"dispatch refused: {exc}") from None

    async def _refuse(self, caller: Caller, brief: str, reason: str, message: str, facts: dict[str, Any]) -> NoReturn:
        """Refuse the call with `message`, journaled as `task.dispatch_refused` within the caller's own
        refusal budget (a loop of refused dispatches cannot fill the journal, nor spend another's budget)."""
        left_out = self.harness.identities.refusals.admit(credential_key(caller.task_id))
        if left_out is not None:
            payload: dict[str, Any] = {"brief": brief, "reason": reason, **facts}
            if left_out:
                payload["not_journaled_before"] = left_out
            await self.harness.writer.put(NewEvent("task.dispatch_refused", payload, task_id=caller.task_id,
                                                   session_id=caller.session_id, project_id=caller.project_id))
        raise ToolError(f"dispatch refused: {message}")

    @staticmethod
    async def _check_routine_workers(store: HarnessStore, thread_id: uuid.UUID) -> None:
        full = await store.routine_workers_full(thread_id)
        if full is not None:
            raise ToolError(f"dispatch refused: routine {full.name} runs at most {full.max_workers} "
                            "worker(s) at once; wait for a running worker's report, then dispatch again")

    async def _files(self, caller: Caller) -> list[dict[str, Any]]:
        """The files sent with the caller's turn (its messages carried them), in order."""
        return [dataclasses.asdict(f) for f in await TaskRows(self.harness.q).attachment_files(caller.task_id)]

    async def _approve(self, brief: str, caller: Caller, thread: uuid.UUID, project: uuid.UUID | None,
                       plan_ref: str | None, allowed_tools: list[str] | None, call_id: str | None,
                       file_ids: tuple[uuid.UUID, ...]) -> Dispatched:
        """An interactive thread: the worker is recorded waiting for the user's Approve in the Asks panel,
        and the call returns at once — the approval is durable state, not a wait that could time out; the
        orchestrator hears the answer as a harness message."""
        try:
            task_id = await approvals.request(
                self.pool, brief=brief, thread_id=thread, asker_task_id=caller.task_id,
                project_id=project, plan_ref=plan_ref, allowed_tools=allowed_tools,
                requested_by=str(caller.session_id), tool_use_id=call_id, attachment_ids=file_ids)
        except dispatch.DispatchRefused as exc:
            raise ToolError(f"dispatch refused: {exc}") from None
        return Dispatched(task_id=str(task_id), status="awaiting_approval", note=approvals.AWAITING)


def chosen_files(files: list[dict[str, Any]], chosen: list[str] | None) -> list[dict[str, Any]]:
    """The files of the caller's turn a worker is handed: all of them by default, or those `chosen` by name or
    id, each once (an unknown one is the model's mistake, told back)."""
    if chosen is None:
        return files
    by_key = {k: f for f in files for k in (str(f["id"]), f["name"])}
    unknown = [c for c in chosen if c not in by_key]
    if unknown:
        sent = ", ".join(f["name"] for f in files) or "none"
        raise ToolError(f"no file {', '.join(unknown)} was sent with this turn (sent: {sent})")
    return list({by_key[c]["id"]: by_key[c] for c in chosen}.values())


def register(server: MCPServer, harness: Harness) -> None:
    workers = _Workers(harness)

    @server.tool(structured_output=True)
    async def dispatch_worker(ctx: Context, brief: str, plan_ref: str | None = None, project_id: str | None = None,
                              allowed_tools: list[str] | None = None,
                              override_ruled_out: str | None = None,
                              attachments: list[str] | None = None) -> Dispatched:
        """Ask the harness for a headless worker to carry out `brief`; returns its task id at once.

        The harness spawns and supervises it; when it exits, its derived handoff comes back to you.
        In an interactive thread it returns at once with status `awaiting_approval`: the worker starts
        when the user approves it, and a harness message tells you the answer either way.
        A brief matching a prior rule-out is refused unless override_ruled_out gives the reason.
        The files the user sent with this turn go to the worker (in a project, as files in its worktree
        whose paths its brief lists); `attachments` picks some of them by name or id, [] none.
        The worker runs in your thread's project (or without one when your thread has none): `project_id`
        may be left out, and naming any other project is refused. Workers dispatch at most
        PETAL_MAX_DISPATCH_DEPTH deep (a turn's worker is at depth 1) and one task asks for at most
        PETAL_MAX_DISPATCH_PER_TASK workers; past either the call is refused with the reason.
        """
        return await workers.dispatch(ctx, brief, plan_ref, project_id, allowed_tools, override_ruled_out,
                                      attachments)
