"""Threads: orchestrator conversations that take turns.

Consumes `thread_control_queue` (create, rename, set mode, archive) and `chat_queue`. Each delivered
message is journaled as `task.user_message` (the echo every client renders; a note the executor queued for
the orchestrator — a worker's end, an approval's outcome, a late answer — as `thread.harness_message`) and
becomes an orchestrator turn — one `claude -p --resume <thread>` run per
turn, exit = turn boundary. Messages arriving while a turn is open stay pending (visible in
GET /api/queue) and go together, in order, in the next turn. A message sent while the turn waits in
ask_user_question answers that question as a reply instead; a note to the orchestrator never does (it
waits for the boundary). A failed turn is acted on by its settlement (executor/settle/escalations.py:
re-run, back off, escalate); the user's Retry of it is a `retry` control row, applied once the thread has no turn open.
This loop only delivers chat and applies thread controls: every follow-up of an end or an answer
(escalations, approvals, late answers) is the settler's (executor/settle/settler.py), which wakes this loop
when a turn's end is settled (a boundary sends no NOTIFY of its own). Rows through `ThreadStore`
(executor/settle/thread_store.py).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from executor.journal.writer import JournalWriter
from executor.projects import service as projects
from executor.sessions import adopt as adoption
from executor.sessions.index import Index as SessionIndex
from executor.settle import dispatch, escalations, reviews
from executor.settle.thread_store import PendingThread, ThreadControl, ThreadProject, ThreadStore
from shared import consume, database, journal, logs, threads
from shared.listener import Subscription
from shared.models import NewEvent
from shared.query import Queries
from shared.sql import queries as shared_queries

log = logs.get(__name__)

# (deliver: the page sent a live terminal's thread a message, True when held here; end: why not, or None)
Terminals = tuple[Callable[[uuid.UUID], bool], Callable[[uuid.UUID], Awaitable[str | None]]]

POLL_S = 1.0
# most messages one turn carries; the rest wait for the next boundary
MAX_MESSAGES_PER_TURN = 50
# A turn's records (its messages and its request) are one small journal batch: a statement of the pipelined
# transaction that queues the turn (a larger one would COPY, which pipeline mode does not allow).
assert MAX_MESSAGES_PER_TURN + 1 <= journal.SMALL_BATCH
ARCHIVED = "thread archived"  # the response of a question its thread's archiving closed


class Threads:
    def __init__(self, pool: AsyncConnectionPool, writer: JournalWriter, sessions: SessionIndex | None = None,
                 turn_coming: Callable[[uuid.UUID, str, str | None], None] | None = None,
                 terminals: Terminals | None = None):
        self.pool = pool
        # the terminal sessions this executor holds (executor/terminals/): a thread live in one gets the page's
        # messages typed into it, and its "end session" control ends it
        self.terminals = terminals
        # told a plain thread's turn is about to be queued (its id, the turn's role, the executor it is pinned to):
        # the supervisor starts its sandbox meanwhile (executor/run/spawn/ahead_pool.py). Not a project's or adopted
        # conversation's (their turns run in directories of their own).
        self.turn_coming = turn_coming
        self.sessions = sessions  # the CLI conversations this executor holds (a thread may be made from one)
        self.store = ThreadStore.over(pool)
        self.shared = Queries(pool, shared_queries)
        self.writer = writer
        self._wake = consume.Wake()

    def wake(self) -> None:
        """A turn's end was settled (the settler): the messages that waited for the boundary go now, and a
        retry that waited for it is applied (every pass runs)."""
        self._wake.ring()

    async def run(self, sub: Subscription) -> None:
        await consume.consume("threads", sub, self.passes_by_channel(), POLL_S, database.availability(self.pool),
                              wake=self._wake)

    def passes_by_channel(self) -> dict[str, list[consume.Pass]]:
        # a pass's queries are on the way to every turn's spawn, so a wake-up runs only the passes its source
        # can have given work: a chat message needs delivering, a thread control applying first (in this order)
        return {"thread_control_queue": [self.apply_controls, self.deliver], "chat_queue": [self.deliver]}

    # ---- thread control ------------------------------------------------------------------------------

    async def apply_controls(self) -> None:
        await self._claim_controls()
        await self.settle_archived()  # also what an earlier run left: archived stays archived across restarts

    async def settle_archived(self) -> None:
        """Archived threads run nothing and ask nothing: their queued turns are cancelled, a running turn is
        stopped, and their pending questions are closed as "thread archived" (journaled, for the history)."""
        for turn in await self.store.cancel_archived_turns():
            log.info("archived_turn_cancelled", thread=str(turn.session_id), turn=str(turn.id))
        for task_id in await self.store.stop_archived_turns():
            log.info("archived_turn_stopped", turn=str(task_id))
        closed = await self.store.close_archived_questions(ARCHIVED)
        events = [NewEvent("question.cancelled", {"question_id": str(r.id), "tool_use_id": r.tool_use_id,
                                                  "answers": {}, "response": ARCHIVED},
                           task_id=r.task_id, session_id=r.thread_id)
                  for r in closed if not r.asker_running]  # a waiting tool call journals its own close
        if events:
            await self.writer.put_many(events)

    async def _claim_controls(self) -> None:
        # a thread made from a stored conversation is made by the executor that holds its file
        holder = self.sessions.executor if self.sessions is not None else None
        for control in await self.store.claim_controls(holder):
            status, error = await self._apply(control)
            await self.store.finish_control(control.id, status, error)

    async def _apply(self, control: ThreadControl) -> tuple[str, str | None]:
        """Apply one thread control: its status (done, failed) and error."""
        args = control.args or {}
        thread_id = control.thread_id
        if control.action == "retry":
            return await self._retry_turn(thread_id, args.get("task_id"))
        if control.action == "review":
            try:
                async with self.store.work() as (_, unit):
                    error = await reviews.send_back(unit, thread_id, args)
            except dispatch.DispatchRefused as exc:  # nothing was recorded
                error = str(exc)
            return ("failed", error) if error else ("done", None)
        if control.action == "end_terminal":
            error = await self.terminals[1](thread_id) if self.terminals else "this executor holds no terminal sessions"
            return ("failed", error) if error else ("done", None)
        if control.action == "create" and args.get("adopt"):
            error = (await adoption.adopt(self.sessions, thread_id, args) if self.sessions is not None
                     else "this executor keeps no index of stored conversations")
            if error:  # said where the page looks (the thread never came to be)
                await self.writer.put(NewEvent("thread.adopted", {
                    "session_id": str(args["adopt"].get("session_id")), "thread_id": str(thread_id),
                    "refused": error}))
            return ("failed", error) if error else ("done", None)
        if control.action == "create":
            return await self._create(thread_id, args)
        changes: dict[str, Any] = {"title": args.get("title") if control.action == "rename" else None,
                   "mode": args.get("mode") if control.action == "set_mode" else None,
                   "archive": control.action == "archive"}
        if not await self.store.update(thread_id, **changes):
            return "failed", f"no thread {thread_id}"
        event = {"rename": "thread.renamed", "set_mode": "thread.mode_changed",
                 "archive": "thread.archived"}[control.action]
        await self.writer.put(NewEvent(event, args, session_id=thread_id))
        return "done", None

    async def _create(self, thread_id: uuid.UUID, args: dict[str, Any]) -> tuple[str, str | None]:
        project_id = args.get("project_id")
        if project_id and await self.shared.one("check_project_exists", {"id": project_id}) is None:
            return "failed", f"no project {project_id}"
        mode = args.get("mode") or "interactive"
        if await self.store.create(thread_id, title=args.get("title"), mode=mode, project_id=project_id):
            await self.writer.put(NewEvent("thread.created", {"title": args.get("title"), "mode": mode,
                                                              "project_id": project_id},
                                           session_id=thread_id,
                                           project_id=uuid.UUID(project_id) if project_id else None))
        return "done", None

    async def _retry_turn(self, thread_id: uuid.UUID, task_id: Any) -> tuple[str, str | None]:
        """The user's Retry of a failed turn: its messages run again (claimed only once no turn is open)."""
        try:
            turn_id = uuid.UUID(str(task_id))
        except ValueError:
            return "failed", f"no turn {task_id!r}"
        async with self.store.work() as (_, unit):
            error = await escalations.retry_turn(unit, turn_id, thread_id, requested_by="user (retry)")
        log.info("turn_retry", thread=str(thread_id), turn=str(turn_id), error=error)
        return ("failed", error) if error else ("done", None)

    # ---- chat delivery -------------------------------------------------------------------------------

    async def deliver(self) -> None:
        for thread in await self.store.threads_with_pending_chat():
            await self._deliver_thread(thread)

    async def _deliver_thread(self, thread: PendingThread) -> None:
        thread_id = thread.thread_id
        if not thread.found:
            if thread_id == threads.DEFAULT_THREAD_ID:
                await self.store.create(thread_id, title="Default", mode="interactive", project_id=None)
                await self.writer.put(NewEvent("thread.created", {"title": "Default", "mode": "interactive"},
                                               session_id=thread_id))
                for made in await self.store.threads_with_pending_chat(thread_id):
                    await self._deliver_thread(made)
                return None
            if not await self.store.create_pending(thread_id):
                await self.store.fail_chat(thread_id, f"no thread {thread_id}")
            return None
        if thread.lifecycle == "archived":
            await self.store.fail_chat(thread_id, "the thread is archived")
            return None
        if thread.controls_pending:
            return None  # a rename or mode change queued before these messages applies first
        if thread.terminal_executor is not None:
            # live in a terminal: typed at its next empty prompt by the executor holding it (another's is its own)
            if self.terminals is not None:
                self.terminals[0](thread_id)
            return None
        if thread.blocked_question is not None:
            await self._reply_in_chat(thread_id, thread.blocked_question)
            return None
        if thread.turn_open:
            return None  # delivered at the boundary: the settler wakes us when the turn ends
        if self.turn_coming is not None and thread.project_id is None and not thread.adopted:
            self.turn_coming(thread_id, dispatch.TURN_ROLE, thread.executor_name)
        await self._start_turn(thread_id, thread.project_id)
        return None

    async def _reply_in_chat(self, thread_id: uuid.UUID, question_id: uuid.UUID) -> None:
        try:
            await self._answer_with_chat(thread_id, question_id)
        except _Unanswered:
            # answered or timed out since the threads' states were read: the message stays queued (rolled back)
            # for the next pass, which finds the thread as it is now
            log.info("reply_in_chat_unanswered", thread=str(thread_id), question=str(question_id))

    async def _answer_with_chat(self, thread_id: uuid.UUID, question_id: uuid.UUID) -> None:
        async with self.store.work() as (store, unit):
            # only the user answers the user's question; a note to the orchestrator waits for the turn boundary
            taken = await store.take_chat(thread_id, 1, origin="user")
            if not taken:
                return
            msg = taken[0]
            if not await store.answer_in_chat(question_id, msg.text, msg.id):
                raise _Unanswered
            unit.emit(NewEvent(
                "task.user_message", {"text": msg.text, "thread_id": str(thread_id), "origin": msg.origin,
                                      "answered_question": str(question_id)},
                session_id=thread_id, message_id=msg.id))

    async def _start_turn(self, thread_id: uuid.UUID, project_id: uuid.UUID | None) -> None:
        turn_id = uuid.uuid4()
        # a project thread's turn knows its project: it runs as the project's, with the plan's state
        project = await self.store.project(thread_id) if project_id else None
        context = await projects.turn_context(self.pool, dataclasses.asdict(project)) if project else None
        try:
            await self._queue_turn(thread_id, turn_id, project, context)
        except dispatch.DispatchRefused as exc:
            # messages no turn can carry (blank ones an older ingress let through): refused where the user
            # sees them, not retried forever ahead of the thread's next messages
            await self.store.fail_chat(thread_id, str(exc))
            log.warning("turn_refused", thread=str(thread_id), error=str(exc))

    async def _queue_turn(self, thread_id: uuid.UUID, turn_id: uuid.UUID, project: ThreadProject | None,
                          context: str | None) -> None:
        # pipelined: BEGIN, the lock and the take go out in one round trip (the take still runs after the lock)
        async with self.store.work(pipelined=True) as (store, unit):
            await store.lock_for_turn(thread_id)
            # none while a turn is open (another executor started one meanwhile): they wait for its end
            messages = await store.take_chat(thread_id, MAX_MESSAGES_PER_TURN, origin=None)
            if not messages:
                return
            brief = "\n\n".join(m.text for m in messages)
            if context:
                brief = f"{brief}\n\n{context}"
            # a note the executor queued for the orchestrator keeps its record type (stored data)
            unit.emit(*[NewEvent("task.user_message" if m.origin == "user" else "thread.harness_message",
                                 {"text": m.text, "thread_id": str(thread_id), "origin": m.origin,
                                  **({"attachments": m.attachments} if m.attachments else {})},
                                 session_id=thread_id, task_id=turn_id, message_id=m.id) for m in messages])
            # the files sent with these messages, in order: delivered with them in this commit
            attachments = tuple(a for m in messages for a in (m.attachment_ids or ()))
            await dispatch.request_task(unit, dispatch.TaskRequest(
                dispatch.TURN_ROLE, brief, id=turn_id, project_id=project.id if project else None,
                session_id=thread_id, record={"messages": len(messages)}, attachment_ids=attachments,
                chat=any(m.origin == "user" for m in messages)))
        log.info("turn_queued", thread=str(thread_id), messages=len(messages))


class _Unanswered(Exception):
    """The question a reply in chat was for is no longer pending: its transaction is undone."""


async def purge_attachments(pool: AsyncConnectionPool, older_than_s: float) -> list[dict[str, Any]]:
    """Delete the bytes of archived threads' attachments (and of uploads never sent) older than
    `older_than_s`, journaling what went (`attachments.purged`: each file's id, name, type, size, sha256) in
    the same commit; returns that list."""
    async with ThreadStore.over(pool).work() as (store, unit):
        gone = [dataclasses.asdict(g) for g in await store.delete_purgeable_attachments(older_than_s)]
        if gone:
            unit.emit(NewEvent("attachments.purged", {"older_than_s": older_than_s, "attachments": [
                {**g, "id": str(g["id"]), "chat_message_id": str(g["chat_message_id"]) if g["chat_message_id"] else None}
                for g in gone]}))
    return gone
