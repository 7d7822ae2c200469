"""Notification routes: the VAPID public key, browsers' push subscriptions, a test request, presence.

Writes stay queue-style: a subscription row, a notify_queue row, a presence row. The executor sends.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ingress.http import body, ingress_queries, respond
from ingress.models import PresenceIn, PushEndpointIn, PushSubscriptionIn
from ingress.problems import Problem
from shared import endpoints


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
