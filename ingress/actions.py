"""Actions: each only writes a queue row (or answers a question) and says what it queued."""

from __future__ import annotations

import uuid
from typing import Any

from psycopg.types.json import Jsonb
from starlette.requests import Request
from starlette.responses import Response

from ingress import asks, claude_sessions
from ingress.auth import size_text
from ingress.http import body, ingress_queries, path_uuid, respond, shared_queries, who
from ingress.models import AnswerIn, ChatIn, RetryIn, StopIn, ThreadIn, ThreadPatch
from ingress.problems import Problem
from shared import threads
from shared.models import ACTIVE_STATUSES
from shared.query import Queries, Transaction

_FINAL_ASK = {"answered", "cancelled"}


async def _known_thread(request: Request, thread_id: uuid.UUID) -> None:
    if await ingress_queries(request).one("check_thread_known", {"id": thread_id}) is None:
        raise Problem(404, f"no thread {thread_id}")


async def post_chat(request: Request) -> Response:
    msg = await body(request, ChatIn)
    thread_id = msg.thread_id or threads.DEFAULT_THREAD_ID
    if thread_id != threads.DEFAULT_THREAD_ID:  # the default thread is made on its first message
        await _known_thread(request, thread_id)
    params = {"thread_id": thread_id, "text": msg.text, "client_msg_id": msg.client_msg_id, "sent_by": who(request),
              "attachment_ids": msg.attachment_ids}
    q = ingress_queries(request)
    if not msg.attachment_ids:
        # a message alone is one statement, a transaction of its own: BEGIN and COMMIT would be two round trips
        # more on the way to its turn
        row = await q.one("enqueue_chat", params)
        if row is None:
            return await _repeated(q, msg, params)
        return respond({**row, "duplicate": False}, 202)
    # the message and its attachments are one unit: queued and tied together in one transaction, or neither
    async with q.transaction() as tx:
        row = await tx.one("enqueue_chat", params)
        if row is None:
            return await _repeated(tx, msg, params)
        await _attach(tx, row["id"], msg.attachment_ids, who(request),
                      request.app.state.config.message_attachments_max_bytes)
    return respond({**row, "duplicate": False}, 202)


async def _repeated(q: Queries | Transaction, msg: ChatIn, params: dict[str, Any]) -> Response:
    """The same client_msg_id was queued before: a retry of that message (answered as it was queued), or a
    different message under a used id (409)."""
    row = await q.one("get_chat_by_client_msg_id", params)
    assert row is not None
    if (row["text"] != msg.text or row["thread_id"] != params["thread_id"]
            or list(row["attachment_ids"]) != msg.attachment_ids):
        raise Problem(409, "client_msg_id was already used for a different message")
    return respond({**row, "duplicate": True}, 202)


async def _attach(tx: Transaction, message_id: uuid.UUID, ids: list[uuid.UUID], sender: str, max_bytes: int) -> None:
    """Tie the uploaded files to the message being queued; a Problem rolls the message back with them."""
    found = {r["id"]: r for r in await tx.all("lock_attachments", {"ids": ids})}
    # another user's upload is as unknown as a made-up id
    unknown = [str(i) for i in ids if i not in found or found[i]["sent_by"] != sender]
    if unknown:
        raise Problem(422, f"no attachment {', '.join(unknown)} (upload it first: POST /api/attachments)")
    taken = [str(i) for i in ids if found[i]["chat_message_id"] is not None]
    if taken:
        raise Problem(409, f"attachment {', '.join(taken)} was already sent with another message")
    total = sum(int(found[i]["size_bytes"]) for i in ids)
    if total > max_bytes:
        raise Problem(413, f"the attachments of one message are at most {size_text(max_bytes)} "
                           f"together ({size_text(total)} given)")
    await tx.execute("mark_attachments_sent", {"message_id": message_id, "ids": ids})


async def stop_task(request: Request) -> Response:
    task_id = path_uuid(request, "task_id")
    stop = await body(request, StopIn, optional=True)
    row = await shared_queries(request).one("get_task_status", {"id": task_id})
    if row is None:
        raise Problem(404, f"no task {task_id}")
    if row["status"] not in ACTIVE_STATUSES:
        raise Problem(409, f"task {task_id} already ended ({row['status']})")
    queued = await ingress_queries(request).one("enqueue_stop", {"task_id": task_id, "reason": stop.reason})
    return respond(queued, 202)


async def create_thread(request: Request) -> Response:
    spec = await body(request, ThreadIn, optional=True)
    thread_id = uuid.uuid4()  # the ingress names the thread, so the client can use it at once
    args: dict[str, Any] = {"title": spec.title, "mode": spec.mode or "interactive"}
    if spec.project_id is not None:
        if await shared_queries(request).one("check_project_exists", {"id": spec.project_id}) is None:
            raise Problem(404, f"no project {spec.project_id}")
        args["project_id"] = str(spec.project_id)
    if spec.adopt_session_id is not None:
        # made by the executor holding the file (it checks again there, with the file in hand)
        held = await claude_sessions.check_adoptable(request, spec.adopt_session_id, spec.executor)
        args["title"] = spec.title or held["title"] or f"conversation {str(spec.adopt_session_id)[:8]}"
        args["adopt"] = {"session_id": str(spec.adopt_session_id), "executor": held["executor"]}
    queued = await ingress_queries(request).one("enqueue_thread_control",
                                                {"thread_id": thread_id, "action": "create", "args": Jsonb(args)})
    return respond({**(queued or {}), "thread_id": thread_id}, 202)


async def patch_thread(request: Request) -> Response:
    thread_id = path_uuid(request, "thread_id")
    patch = await body(request, ThreadPatch)
    await _known_thread(request, thread_id)
    queued = []
    for action, args in (("rename", {"title": patch.title} if patch.title is not None else None),
                         ("set_mode", {"mode": patch.mode} if patch.mode is not None else None),
                         ("archive", {} if patch.archived else None)):
        if args is not None:
            queued.append(await ingress_queries(request).one(
                "enqueue_thread_control", {"thread_id": thread_id, "action": action, "args": Jsonb(args)}))
    return respond({"thread_id": thread_id, "queued": queued}, 202)


async def retry_turn(request: Request) -> Response:
    """Run a failed orchestrator turn again with the same messages (a thread-control row the executor
    carries out once no turn of the thread is open)."""
    thread_id = path_uuid(request, "thread_id")
    spec = await body(request, RetryIn, optional=True)
    await _known_thread(request, thread_id)
    q = ingress_queries(request)
    turn = await q.one("get_thread_turn", {"thread_id": thread_id, "task_id": spec.task_id})
    if turn is None:
        raise Problem(404, f"no failed turn {spec.task_id or ''} in thread {thread_id}".replace("  ", " "))
    if turn["status"] in ("pending", "running", "success"):
        raise Problem(409, f"turn {turn['id']} is {turn['status']}: only a failed turn is retried")
    if turn["retried_by"] is not None:
        raise Problem(409, f"turn {turn['id']} was already run again (task {turn['retried_by']})")
    if turn["retry_queued"] is not None:
        raise Problem(409, f"a retry of turn {turn['id']} is already queued")
    queued = await q.one("enqueue_thread_control",
                         {"thread_id": thread_id, "action": "retry", "args": Jsonb({"task_id": str(turn["id"])})})
    return respond({**(queued or {}), "task_id": turn["id"]}, 202)


async def end_terminal(request: Request) -> Response:
    """End the thread's live terminal session (its CLI gets the hang-up a closed terminal sends; the conversation
    stays resumable in the thread)."""
    thread_id = path_uuid(request, "thread_id")
    q = ingress_queries(request)
    if await q.one("check_terminal_live", {"thread_id": thread_id}) is None:
        raise Problem(409, f"thread {thread_id} has no live terminal session")
    queued = await q.one("enqueue_thread_control", {"thread_id": thread_id, "action": "end_terminal", "args": Jsonb({})})
    return respond(queued or {}, 202)


async def _question(request: Request) -> dict[str, Any]:
    ref = request.path_params["ask_id"]
    row = await ingress_queries(request).one("get_question_by_ref", {"ref": ref})
    if row is None:
        raise Problem(404, f"no question {ref!r} (use its id or its tool_use_id)")
    return row


async def _close(request: Request, row: dict[str, Any], status: str, answers: Any, response: str | None
                 ) -> dict[str, Any]:
    if row["status"] in _FINAL_ASK:
        raise Problem(409, f"question already {row['status']}")
    # answered_by: who answered, from the authenticated request; the executor honours an answer as the
    # user's only when it carries this mark
    updated = await ingress_queries(request).one("answer_question", {
        "id": row["id"], "status": status, "answers": Jsonb(answers) if answers is not None else None,
        "response": response, "answered_by": who(request)})
    if updated is None:  # closed between our read and our write
        raise Problem(409, "question was closed meanwhile")
    return updated


async def answer_ask(request: Request) -> Response:
    seen = await _answer_seen(request)
    if seen is not None:
        return answered(seen)
    row = await _question(request)
    answer = await body(request, AnswerIn)
    if row["status"] in _FINAL_ASK:
        raise Problem(409, f"question already {row['status']}")
    answers = asks.normalise(row["questions"], answer)
    return answered(await _close(request, row, "answered", answers, answer.response))


async def _answer_seen(request: Request) -> dict[str, Any] | None:
    """An answer to a question this process saw asked (ingress/asked.py), checked against the questions kept
    and written by the conditional UPDATE alone: one round trip, not a read and then the write. None when
    that cannot say it all — not seen, refused, or not pending — and the reading way then answers, with its
    own order of errors (404, bad body, 409, 422)."""
    broadcaster = getattr(request.app.state, "broadcaster", None)
    seen = broadcaster.asked.get(request.path_params["ask_id"]) if broadcaster is not None else None
    if seen is None:
        return None
    qid, questions = seen
    try:
        answer = await body(request, AnswerIn)
        answers = asks.normalise(questions, answer)
    except Problem:
        return None
    return await ingress_queries(request).one("answer_question", {
        "id": qid, "status": "answered", "answers": Jsonb(answers), "response": answer.response,
        "answered_by": who(request)})


def answered(closed: dict[str, Any]) -> Response:
    # Told from the row as our update left it, not as first read: the asking tool may have stopped waiting
    # in between (it marks the row late only while it is pending, so one of the two always sees the other).
    if closed["timed_out_at"] is None:
        return respond(closed)  # the asking tool returns this answer
    # the tool had stopped waiting: the answer is accepted and goes to the thread as a message (202)
    return respond({**closed, "late": True,
                    "note": "the question had timed out: the answer is sent to the thread as a message"}, 202)


async def cancel_ask(request: Request) -> Response:
    row = await _question(request)
    return respond(await _close(request, row, "cancelled", None, "cancelled by the user"))
