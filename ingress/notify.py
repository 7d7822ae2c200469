"""Notification routes: the VAPID public key, browsers' push subscriptions, a test request, presence, and a
notification's answer button.

Writes stay queue-style: a subscription row, a notify_queue row, a presence row, a question's answer. The
executor sends.
"""

from __future__ import annotations

import hashlib

from psycopg.types.json import Jsonb
from starlette.requests import Request
from starlette.responses import Response

from ingress import asks
from ingress.actions import answered
from ingress.http import body, ingress_queries, respond
from ingress.models import AnswerIn, NotifyActIn, PresenceIn, PushEndpointIn, PushSubscriptionIn
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
    return respond({"public_key": config["public_key"] if config else None,
                    "subscriptions": count["subscriptions"] if count else 0,
                    "subscribed": mine is not None, "subscription": mine,
                    "ntfy": bool(config and config["ntfy"])})


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
    return respond(await ingress_queries(request).one("upsert_presence",
                                                      {"client_id": seen.client_id, "thread_id": seen.thread_id}))


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
