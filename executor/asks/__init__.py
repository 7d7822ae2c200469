"""The ask service: questions the harness puts in the user's Asks panel, journaled both ways.

One implementation for every question:
- `Asks.ask` puts questions up and waits for the answer, with progress notifications while it waits and
  a timeout — the model's `ask_user_question` (executor/harness/questions.py) and the permission path's
  approval cards (executor/harness/permission.py);
- `post` records a question inside the caller's transaction and returns its `question.asked` record,
  without a wait: a dispatch awaiting approval (executor/settle/approvals.py) and the policy's
  escalations (executor/settle/escalations.py), whose answers are carried out from the store later.

Its rows are read and written through `AskStore` (executor/asks/store.py, SQL in executor/sql/asks.sql).

A task's activity (awaiting_user while a question waits) is written through `TaskStore.save_activity`,
the one writer of `tasks.activity`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from executor.asks.store import AskStore, Question
from executor.asks.store import Receipt as Receipt
from executor.journal.writer import JournalWriter
from executor.run.caller import Caller
from executor.run.task_store import TaskStore
from shared import after_response, aio, logs
from shared.listener import RESYNC, Listener, Subscription
from shared.models import NewEvent
from shared.query import Queries, Transaction

# Progress is sent this often while a question waits: the CLI aborts a call silent for 300 s (or for
# CLAUDE_CODE_MCP_TOOL_IDLE_TIMEOUT), and a progress notification resets that clock.
PROGRESS_INTERVAL_S = 5.0
TIMED_OUT = "Timed out waiting for user input"
TIMED_OUT_STATUS = "timed_out"  # the wait's outcome (the row stays pending, marked late)
DISMISSED = "The user dismissed the question without answering"
WENT_AWAY = "the asking process went away"
# An answer that does not carry the ingress's mark (answered_by) was written some other way than by the user:
# it is not acted on (the question ends as if dismissed, and the record says why).
NOT_THE_USERS = ("Refused: the question was closed with an answer that did not come from the user (it carries "
                 "no answering identity), so it was not acted on")
# A call identical to the thread's last answered question within this window is answered with that answer
# instead of putting the question up again (a model re-asking after a late answer, an approval, a handoff).
REASK_WINDOW_S = 600.0
ALREADY_ANSWERED_STATUS = "already_answered"  # the call's outcome: the thread's earlier answer, nothing asked

log = logs.get(__name__)

# A closed question's notification that carries how it closed, then the id-only one every listener takes
# (migration 0032 sends them in that order): a waiter returns from the first without reading the row back.
CLOSED = "question_closed"
CHANNELS = [CLOSED, "question_answered"]
CLOSED_STATUSES = frozenset({"answered", "cancelled"})

Answers = dict[str, str | list[str]]


class Progress(Protocol):
    """What a wait needs of the MCP request: a way to say it is still waiting (the SDK's Context)."""

    async def report_progress(self, progress: float, total: float | None = None,
                              message: str | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class Answer:
    """How a question ended: answered, cancelled (dismissed, timed out, or its asker gone) or timed_out (the
    row stays open, marked late, for a thread to hear a late answer)."""

    id: uuid.UUID
    status: str
    answers: Answers = field(default_factory=dict)
    response: str | None = None
    answered_via: str | None = None
    answered_by: str | None = None  # who answered (the ingress's request identity); None: not the user


def honoured(status: str, answered_by: str | None) -> bool:
    """An answered row counts as the user's only when it carries who answered (written by the ingress, or
    from a chat message the ingress queued); a cancellation needs no mark (it approves nothing)."""
    return status != "answered" or bool(answered_by)


def first_choice(answers: dict[str, Any] | None) -> Any:
    """The label chosen for a card's one question: its first answer (a multi-select's first label)."""
    values = list((answers or {}).values())
    choice = values[0] if values else None
    return (choice[0] if choice else None) if isinstance(choice, list) else choice


@dataclass(frozen=True, slots=True)
class Posted:
    id: uuid.UUID
    event: NewEvent  # its `question.asked` record, for the caller to journal with its own writes


def asked(question_id: uuid.UUID, questions: list[dict[str, Any]], *, tool_use_id: str, task_id: uuid.UUID | None,
          session_id: uuid.UUID | None, project_id: uuid.UUID | None = None, asked_by: str = "harness",
          **facts: Any) -> NewEvent:
    """The `question.asked` record of a question."""
    return NewEvent("question.asked", {"question_id": str(question_id), "tool_use_id": tool_use_id,
                                       "questions": questions, "asked_by": asked_by, **facts},
                    task_id=task_id, session_id=session_id, project_id=project_id)


async def post(run: Queries | Transaction, questions: list[dict[str, Any]], *, tool_use_id: str,
               task_id: uuid.UUID | None, session_id: uuid.UUID | None, project_id: uuid.UUID | None = None,
               asked_by: str = "harness", **facts: Any) -> Posted | None:
    """Record a question (in `run`'s transaction, if it is one); None if `tool_use_id` was asked already."""
    qid = await AskStore(run).insert(questions, tool_use_id=tool_use_id, session_id=session_id, task_id=task_id,
                                     asked_by=asked_by)
    if qid is None:
        return None
    return Posted(qid, asked(qid, questions, tool_use_id=tool_use_id, task_id=task_id, session_id=session_id,
                             project_id=project_id, asked_by=asked_by, **facts))


class Asks:
    """Questions that wait for their answer, for the length of one tool call."""

    def __init__(self, q: Queries, writer: JournalWriter, listener: Listener, timeout_s: float,
                 progress_interval_s: float = PROGRESS_INTERVAL_S, reask_window_s: float = REASK_WINDOW_S):
        self.q = q
        self.store = AskStore(q)
        self.reask_window_s = reask_window_s
        self.writer = writer
        self.listener = listener
        self.timeout_s = timeout_s
        self.progress_interval_s = progress_interval_s
        self.tasks = TaskStore(q.pool)  # a task's activity: TaskStore.save_activity, its one writer
        # each task's "running" write after an answer, until it is done (kept so it is neither lost nor reordered)
        self._activity: dict[uuid.UUID, asyncio.Future[None]] = {}

    async def ask(self, questions: list[dict[str, Any]], *, tool_use_id: str, caller: Caller, progress: Progress,
                  asked_by: str = "model", gone: str = WENT_AWAY) -> Answer:
        """Put questions in the Asks panel and wait for the answer (journaled both ways). `gone`: how the card
        closes when the caller stops waiting (a terminal answered its own dialog first)."""
        task_id = caller.task_id
        # subscribe before the row exists, so an answer can never arrive unseen
        with self.listener.subscribe(CHANNELS) as sub:
            posted = await self._adopt(questions, tool_use_id=tool_use_id, caller=caller, asked_by=asked_by)
            joined = False
            if posted is None and caller.thread_id is not None:
                earlier, posted = await self._once_per_thread(questions, tool_use_id=tool_use_id, caller=caller,
                                                              asked_by=asked_by)
                if isinstance(earlier, Answer):
                    return earlier
                joined = earlier
            elif posted is None:
                posted = await post(self.q, questions, tool_use_id=tool_use_id, task_id=task_id,
                                    session_id=caller.session_id, asked_by=asked_by)
            if posted is None:  # the same tool call again (a client retry): wait on the first row
                first = await self.store.by_tool_use_id(tool_use_id, task_id, caller.session_id)
                if first is None:  # the id is another thread's row's: asked under an id of its own instead
                    tool_use_id = f"mcp-{uuid.uuid4()}"
                    posted = await post(self.q, questions, tool_use_id=tool_use_id, task_id=task_id,
                                        session_id=caller.session_id, asked_by=asked_by)
                    assert posted is not None
                else:
                    posted = Posted(first, asked(first, questions, tool_use_id=tool_use_id, task_id=task_id,
                                                 session_id=caller.session_id, asked_by=asked_by))
            qid = posted.id
            # the last answer's record and "running" first (_afterwards), then this question's
            await self._activity_settled(task_id)
            await self.writer.put(posted.event)
            await self.tasks.save_activity(task_id, "awaiting_user")
            try:
                # in a thread the question outlives the wait: a late answer goes to the thread as a message
                final = await self.wait(qid, sub, progress, late_ok=caller.thread_id is not None)
            except BaseException:
                # the caller went away (the CLI was stopped): the question can never be delivered (unless the
                # supervisor marked it late as it ended a parked process: its answer goes to the thread)
                closed = False
                if not joined:  # a joined row is its first asker's to close
                    with contextlib.suppress(Exception):
                        closed = await asyncio.shield(self.store.close_abandoned(qid, gone))
                # how it closed, on the record (a card a terminal answered first says so where it was asked)
                await self._afterwards(task_id, NewEvent("question.cancelled", {
                    "question_id": str(qid), "tool_use_id": tool_use_id, "answers": {}, "response": gone},
                    task_id=task_id, session_id=caller.session_id) if closed else None)
                raise
        response = final.response
        if final.status == "cancelled" and response is None:
            response = DISMISSED
        event = {"answered": "question.answered", TIMED_OUT_STATUS: "question.timed_out"}.get(
            final.status, "question.cancelled")
        payload: dict[str, Any] = {"question_id": str(qid), "tool_use_id": tool_use_id, "answers": final.answers,
                                   "response": response}
        if final.status == TIMED_OUT_STATUS:
            payload["late_answer"] = "accepted: it goes to the thread as a message"
        if final.answered_by is not None:
            payload["answered_by"] = final.answered_by
        if final.response == NOT_THE_USERS:
            payload["refused_answer"] = "no answering identity: not written by the ingress"
        await self._afterwards(task_id, NewEvent(event, payload, task_id=task_id, session_id=caller.session_id))
        return Answer(qid, final.status, final.answers, response, final.answered_via, final.answered_by)

    async def _afterwards(self, task_id: uuid.UUID, record: NewEvent | None) -> None:
        """The answer's record journaled and the task's activity set back to running, which the answer does
        not wait for: asked through the MCP server, once the tool's response is sent (shared/after_response.py
        — on the response's way out their queries came first); else the record now and the activity write
        beside. The task's next question waits for both (_activity_settled), so the journal and the
        activity keep their order."""
        if record is not None and not after_response.in_request():
            await self.writer.put(record)
            record = None

        async def afterwards() -> None:
            if record is not None:
                await self.writer.put(record)
            await self.tasks.save_activity(task_id, "running")

        write = after_response.defer(afterwards)  # outside a request: at once
        self._activity[task_id] = write

        def done(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and f.exception() is not None:
                log.warning("activity_write_failed", task_id=str(task_id), error=repr(f.exception()))
            if self._activity.get(task_id) is f:
                del self._activity[task_id]
        write.add_done_callback(done)

    async def _activity_settled(self, task_id: uuid.UUID) -> None:
        pending = self._activity.get(task_id)
        if pending is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(pending)

    async def _adopt(self, questions: list[dict[str, Any]], *, tool_use_id: str, caller: Caller,
                     asked_by: str) -> Posted | None:
        """The row these questions already have, when a re-run turn (or the same session, its first asker
        gone) asks them again: a second pending row is never added (executor/sql/asks.sql)."""
        row = await self.store.take_asked(questions, asked_by=asked_by, session_id=caller.session_id,
                                          task_id=caller.task_id)
        if row is None:
            return None
        log.info("question_reasked", question_id=str(row.id), status=row.status, tool_use_id=tool_use_id)
        return Posted(row.id, asked(row.id, questions, tool_use_id=tool_use_id, task_id=caller.task_id,
                                    session_id=caller.session_id, asked_by=asked_by, reasked_from=row.tool_use_id))

    async def _once_per_thread(self, questions: list[dict[str, Any]], *, tool_use_id: str, caller: Caller,
                               asked_by: str) -> tuple[Answer | bool, Posted | None]:
        """Never the same question to a thread twice in a row. Under the thread's lock: the same questions
        (texts, headers, options) pending in the thread are joined (True: this call waits on that row, its
        answer is both calls'; a row marked late is taken over, so its answer comes back as this call's result
        rather than as a late message); the thread's last answered question, when identical and answered within
        the window, answers this call at once (an Answer, nothing asked); else a new row (False)."""
        assert caller.thread_id is not None
        async with self.q.transaction() as tx:
            store = AskStore(tx)
            await store.lock_thread(caller.thread_id)
            row = await store.thread_repeat(caller.thread_id, questions, asked_by=asked_by,
                                            window_s=self.reask_window_s)
            if row is None:
                posted = await post(tx, questions, tool_use_id=tool_use_id, task_id=caller.task_id,
                                    session_id=caller.session_id, asked_by=asked_by)
                return False, posted
            if row.status == "pending":
                if row.timed_out_at is not None:
                    await store.take_late(row.id, caller.task_id)
                log.info("question_joined", question_id=str(row.id), tool_use_id=tool_use_id)
                return True, Posted(row.id, asked(row.id, questions, tool_use_id=tool_use_id,
                                                  task_id=caller.task_id, session_id=caller.session_id,
                                                  asked_by=asked_by, joined=row.tool_use_id))
        log.info("question_already_answered", question_id=str(row.id), tool_use_id=tool_use_id)
        await self.writer.put(NewEvent("question.answered", {
            "question_id": str(row.id), "tool_use_id": tool_use_id, "answers": row.answers or {},
            "response": row.response, "already_answered": "the thread's last question, asked again: its "
            "answer returned, nothing asked"}, task_id=caller.task_id, session_id=caller.session_id))
        return Answer(row.id, ALREADY_ANSWERED_STATUS, row.answers or {}, row.response, row.answered_via,
                      row.answered_by), None

    async def wait(self, qid: uuid.UUID, sub: Subscription, progress: Progress, *, late_ok: bool = False) -> Answer:
        """Until the question is closed, or the timeout: then it is closed (or, `late_ok`, marked late)."""
        deadline = time.monotonic() + self.timeout_s
        reports = 0
        carried: Question | None = None
        while True:
            # how it closed, as its notification carried it (the committed row's own values), else read
            row = carried or await self.store.get(qid)
            carried = None
            assert row is not None
            if row.status != "pending":
                if not honoured(row.status, row.answered_by):
                    log.warning("answer_not_honoured", question_id=str(qid), answered_via=row.answered_via)
                    return Answer(qid, "cancelled", {}, NOT_THE_USERS, row.answered_via)
                return Answer(qid, row.status, row.answers or {}, row.response, row.answered_via, row.answered_by)
            left = deadline - time.monotonic()
            if left <= 0:
                if late_ok:
                    if not await self.store.mark_timed_out(qid):
                        # answered in the same instant (the answer wins), or marked late already (its parked
                        # process ended by the supervisor): read it again, and stop waiting if it is still open
                        carried = await self.store.get(qid)
                        if carried is not None and carried.status != "pending":
                            continue
                    return Answer(qid, TIMED_OUT_STATUS, {}, TIMED_OUT)
                if not await self.store.close(qid, TIMED_OUT):
                    continue  # answered in the same instant: the answer wins
                return Answer(qid, "cancelled", {}, TIMED_OUT)
            try:
                carried = await aio.wait_for(_news_of(sub, qid), min(left, self.progress_interval_s))
            except TimeoutError:
                reports += 1
                with contextlib.suppress(Exception):
                    await progress.report_progress(reports, None, "waiting for the user's answer")


async def _news_of(sub: Subscription, question_id: uuid.UUID) -> Question | None:
    """Until a notification says this question changed, or a resync says anything may have: how it closed
    when the notification carries it (`question_closed`, migration 0032), else None (read the row). Another
    question's answer is no news: re-reading the row for it cost every waiter a query per answer."""
    qid = str(question_id)
    while (note := await sub.get()) is not RESYNC:
        if note.channel == CLOSED:
            if qid not in note.payload:
                continue  # another question's
            try:
                row = json.loads(note.payload)
            except ValueError:
                return None
            if not isinstance(row, dict) or row.get("id") != qid:
                continue
            return Question.from_row({**row, "id": question_id}) if row.get("status") in CLOSED_STATUSES else None
        if note.payload == qid:
            return None
    return None
