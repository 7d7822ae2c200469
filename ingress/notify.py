"""Notification routes: the VAPID public key, browsers' push subscriptions, a test request, presence, and a
notification's answer button.

Writes stay queue-style: a subscription row, a notify_queue row, a presence row, a question's answer. The
executor sends.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable

from psycopg.types.json import Jsonb
from starlette.requests import Request
from starlette.responses import Response

from ingress import asks
from ingress.actions import answered
from ingress.http import body, ingress_queries, respond, who
from ingress.models import AnswerIn, NotifyActIn, PresenceIn, PushEndpointIn, PushSubscriptionIn
from ingress.openapi import UUID, Op, Param
from ingress.problems import Problem
from shared import endpoints

# who answered, as the question records it: the user, from a notification on this channel
ANSWERED_FROM = {"push": "notification (web push)", "ntfy": "notification (ntfy)"}


async def push_info(request: Request) -> Response:
    q = ingress_queries(request)
    config = await q.one("get_push_config")
    count = await q.one("count_push_subscriptions")
    endpoint = request.query_params.get("endpoint")
    mine = await q.one("get_push_subscription_by_endpoint", {"endpoint": endpoint}) if endpoint else None
    muted = await q.all("list_notify_mutes")
    return respond({"public_key": config["public_key"] if config else None,
                    "subscriptions": count["subscriptions"] if count else 0,
                    "subscribed": mine is not None, "subscription": mine,
                    "ntfy": bool(config and config["ntfy"]),
                    "policy": config["policy"] if config else None,  # what will notify (the executor's settings)
                    "muted": [str(m["thread_id"]) for m in muted]})


async def subscribe(request: Request) -> Response:
    sub = await body(request, PushSubscriptionIn)
    refused = await endpoints.refusal(sub.endpoint, allow_loopback=request.app.state.config.push_allow_loopback)
    if refused:  # the executor would POST there: no requests into this machine or its network (SSRF)
        raise Problem(422, f"endpoint: {refused}")
    q = ingress_queries(request)
    if await q.one("get_push_config") is None:
        raise Problem(409, "the executor has not published its VAPID key yet: start it, then try again")
    row = await q.one("upsert_push_subscription", {
        "endpoint": sub.endpoint, "p256dh": sub.keys.p256dh, "auth": sub.keys.auth,
        "user_agent": (request.headers.get("user-agent") or "")[:300]})
    return respond(row, 201)


async def unsubscribe(request: Request) -> Response:
    target = await body(request, PushEndpointIn)
    row = await ingress_queries(request).one("delete_push_subscription_by_endpoint",
                                             {"endpoint": target.endpoint})
    if row is None:
        raise Problem(404, "no such subscription")
    return respond(row)


async def test_notification(request: Request) -> Response:
    return respond(await ingress_queries(request).one("enqueue_notify", {"kind": "test"}), 202)


async def presence(request: Request) -> Response:
    seen = await body(request, PresenceIn)
    return respond(await ingress_queries(request).one("upsert_presence", {
        "client_id": seen.client_id, "thread_id": seen.thread_id, "visible": seen.visible}))


async def mute(request: Request) -> Response:
    thread_id = request.path_params["thread_id"]
    row = await ingress_queries(request).one("insert_notify_mute", {"thread_id": thread_id,
                                                                    "muted_by": who(request)})
    if row is None:
        raise Problem(404, f"no thread {thread_id}")
    return respond(row)


async def unmute(request: Request) -> Response:
    thread_id = request.path_params["thread_id"]
    if await ingress_queries(request).one("delete_notify_mute", {"thread_id": thread_id}) is None:
        raise Problem(404, f"thread {thread_id} is not muted")
    return respond({"thread_id": thread_id, "muted": False})


async def act(request: Request) -> Response:
    """A notification's answer button (sent by the service worker, or by the ntfy app): the token it carries is
    the credential, good for its one question, once, until it expires. The question is answered as from the page
    (`answered_by` names the notification's channel); a question already closed is refused (409) saying who
    closed it, so the notification can say so."""
    pressed = await body(request, NotifyActIn)
    sha256 = hashlib.sha256(pressed.token.encode()).digest()
    async with ingress_queries(request).transaction() as tx:
        row = await tx.one("get_notification_action", {"sha256": sha256})
        if row is None:
            raise Problem(403, "this notification's button is not valid here: open the page to answer")
        if row["status"] != "pending":
            raise Problem(409, f"question already {row['status']}", answered_by=row["answered_by"],
                          question_id=str(row["question_id"]))
        if row["used_at"] is not None:
            raise Problem(409, "this notification's button was used already", question_id=str(row["question_id"]))
        if row["expired"]:
            raise Problem(410, "this notification's buttons expired: open the page to answer",
                          question_id=str(row["question_id"]))
        questions = row["questions"] or []
        if len(questions) != 1:
            raise Problem(422, "this question needs the page to answer")
        answers = asks.normalise(questions, AnswerIn(answers={questions[0].get("question"): pressed.choice}))
        closed = await tx.one("answer_question", {
            "id": row["question_id"], "status": "answered", "answers": Jsonb(answers), "response": None,
            "answered_by": ANSWERED_FROM[row["channel"]]})
        if closed is None:  # closed between the read and the write
            raise Problem(409, "question was closed meanwhile", question_id=str(row["question_id"]))
        await tx.execute("mark_notification_action_used", {"sha256": sha256, "choice": pressed.choice})
    return answered(closed)


_THREAD, _MUTE = (Param("thread_id", "path", UUID),), "/api/threads/{thread_id}/mute"
# this module's part of the route table (ingress/app.py)
OPS: list[tuple[Op, Callable[[Request], Awaitable[Response]]]] = [  # noqa: RUF012 - read once
    (Op("get", "/api/push", "Web Push: the VAPID public key, whether an endpoint is subscribed, what will notify "
        "and the muted threads", params=(Param("endpoint", "query", {"type": "string"}),)), push_info),
    (Op("post", "/api/push/subscriptions", "store a browser's push subscription (PushSubscription.toJSON())",
        PushSubscriptionIn, status=201, errors=(409, 415, 422)), subscribe),
    (Op("delete", "/api/push/subscriptions", "remove a push subscription", PushEndpointIn, errors=(404, 415, 422)),
     unsubscribe),
    (Op("post", "/api/push/test", "send a test notification on every channel", status=202), test_notification),
    (Op("post", "/api/presence", "this page is in view, looking at a thread (nothing is pushed while a page is in "
        "view; no notification for its thread's finished turns)", PresenceIn, errors=(415, 422)), presence),
    (Op("put", _MUTE, "no notifications about this thread until unmuted", params=_THREAD, errors=(404, 415)), mute),
    (Op("delete", _MUTE, "notifications about this thread again", params=_THREAD, errors=(404,)), unmute),
    (Op("post", "/api/notify/act", "a notification's answer button: the notification's one-use token (not the "
        "user's) answers its question with one of its options, once, before it expires", NotifyActIn,
        errors=(403, 409, 410, 415, 422)), act),
]
