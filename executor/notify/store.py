"""The notifier's store (executor/sql/notify.sql): its cursor in the journal, the records that may call for a
note, what was sent, push subscriptions, test requests, the fleet's VAPID key and the notifier's duty lock.

The one module of this room that runs these queries; rows come back as frozen dataclasses (shared.query.FromRow).
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from executor.sql import queries
from shared.query import FromRow, Queries, Transaction


@dataclass(frozen=True)
class Cursor(FromRow):
    """Where the notifier is in the journal (`last_seq`), and the journal's head."""

    last_seq: int
    head: int


@dataclass(frozen=True)
class Candidate(FromRow):
    """A journal record that may call for a note (list_notify_candidates), with its task's role and brief."""

    seq: int
    event_type: str
    task_id: uuid.UUID | None
    session_id: uuid.UUID | None
    payload: dict[str, Any] | None
    role: str | None = None
    brief: str | None = None
    task_session: uuid.UUID | None = None  # the task's own session (a turn's thread)


@dataclass(frozen=True)
class Subscription(FromRow):
    """A browser subscribed to Web Push."""

    id: uuid.UUID
    endpoint: str
    p256dh: str
    auth: str


@dataclass(frozen=True)
class Sent(FromRow):
    """A notification as it is recorded, whatever came of it (`outcome`)."""

    kind: str
    task_id: Any
    thread_id: Any
    seq: int | None
    title: str
    body: str
    url: str
    outcome: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class Deferred(FromRow):
    """A note recorded for the next digest (a finished run), and how long the oldest of them has waited."""

    id: uuid.UUID
    kind: str
    task_id: Any
    thread_id: Any
    seq: int | None
    title: str
    body: str
    url: str
    detail: dict[str, Any] | None
    waited_s: float


@dataclass(frozen=True)
class _Id(FromRow):
    id: uuid.UUID


@dataclass(frozen=True)
class _Question(FromRow):
    question_id: uuid.UUID


@dataclass(frozen=True)
class _Holds(FromRow):
    holds: bool


@dataclass(frozen=True)
class _Value(FromRow):
    value: str


class NotifyStore:
    def __init__(self, q: Queries | Transaction):
        self.q = q

    @classmethod
    def over(cls, pool: AsyncConnectionPool) -> NotifyStore:
        return cls(Queries(pool, queries))

    # ---- start ---------------------------------------------------------------------------------------

    async def store_push_key(self, public_key: str, *, ntfy: bool, policy: dict[str, Any]) -> None:
        """The key browsers subscribe with (the page reads it), whether ntfy is configured, and what will notify."""
        await self.q.execute("store_push_key", {"public_key": public_key, "ntfy": ntfy, "policy": Jsonb(policy)})

    async def init_cursor(self) -> None:
        """A first start begins at the journal's head (a later one keeps its cursor)."""
        await self.q.execute("init_notify_cursor")

    async def fleet_secret(self, name: str, offer: str, *, offered_by: str | None) -> str:
        """The fleet's value of a secret: `offer` when this executor is the first to offer one."""
        await self.q.execute("offer_fleet_secret", {"name": name, "value": offer, "created_by": offered_by})
        found = await self.q.one("get_fleet_secret", {"name": name}, into=_Value)
        assert found is not None  # this executor's offer, or an earlier one
        return found.value

    # ---- a pass --------------------------------------------------------------------------------------

    async def claim_test_requests(self) -> list[uuid.UUID]:
        """The pending requests for a test notification, claimed."""
        return [r.id for r in await self.q.all("claim_notify_requests", into=_Id)]

    async def finish_test_request(self, request_id: uuid.UUID, status: str, error: str | None) -> None:
        await self.q.execute("finish_notify_request", {"id": request_id, "status": status, "error": error})

    async def cursor(self) -> Cursor:
        found = await self.q.one("get_notify_cursor", into=Cursor)
        assert found is not None  # made by init_cursor()
        return found

    async def candidates(self, after: int, limit: int) -> list[Candidate]:
        return await self.q.all("list_notify_candidates", {"after": after, "limit": limit}, into=Candidate)

    async def advance_cursor(self, seq: int) -> None:
        await self.q.execute("advance_notify_cursor", {"seq": seq})

    async def thread_watched(self, thread_id: Any, seconds: float) -> bool:
        """Whether a page showed the thread within `seconds`, or the thread is a routine's run's."""
        return await self.q.one("check_thread_watched", {"thread_id": thread_id, "seconds": seconds},
                                into=_Holds) is not None

    async def page_visible(self, seconds: float) -> bool:
        """Whether a page was in front of the user, on any device, within `seconds`."""
        return await self.q.one("check_page_visible", {"seconds": seconds}, into=_Holds) is not None

    async def muted(self, task_id: Any, thread_id: Any) -> bool:
        """Whether the user muted the thread a note is about (its own, or the one its task descends from)."""
        return await self.q.one("check_thread_muted", {"task_id": task_id, "thread_id": thread_id},
                                into=_Holds) is not None

    async def deferred(self) -> list[Deferred]:
        return await self.q.all("list_deferred_notifications", into=Deferred)

    async def finish_deferred(self, ids: list[uuid.UUID], outcome: str, delivery: dict[str, Any]) -> None:
        await self.q.execute("finish_deferred_notifications", {"ids": ids, "outcome": outcome,
                                                               "delivery": Jsonb(delivery)})

    async def recently_notified(self, kind: str, task_id: Any, thread_id: Any, seconds: float) -> bool:
        """Whether a note of this kind about this task (or thread) went out within `seconds`."""
        return await self.q.one("check_recent_notification", {"kind": kind, "task_id": task_id,
                                                              "thread_id": thread_id, "seconds": seconds},
                                into=_Holds) is not None

    async def question_notified(self, kind: str, task_id: Any, question_id: Any, seconds: float) -> bool:
        """Whether this question's note went out within `seconds`."""
        return await self.q.one("check_question_notified", {"kind": kind, "task_id": task_id,
                                                            "question_id": str(question_id), "seconds": seconds},
                                into=_Holds) is not None

    async def record(self, sent: Sent) -> None:
        await self.q.execute("record_notification", {
            "kind": sent.kind, "task_id": sent.task_id, "thread_id": sent.thread_id, "seq": sent.seq,
            "title": sent.title, "body": sent.body, "url": sent.url, "outcome": sent.outcome,
            "detail": Jsonb(sent.detail)})

    async def action_token(self, question_id: Any, channel: str, ttl_s: float) -> str | None:
        """A new one-use token that answers this question from a notification on `channel` ('push' | 'ntfy'),
        valid `ttl_s`; only its sha256 is kept. None when the question is no longer pending."""
        token = secrets.token_urlsafe(32)
        made = await self.q.one("insert_notification_action", {
            "sha256": hashlib.sha256(token.encode()).digest(), "question_id": question_id, "channel": channel,
            "ttl_s": ttl_s}, into=_Question)
        return token if made is not None else None

    # ---- push subscriptions --------------------------------------------------------------------------

    async def subscriptions(self) -> list[Subscription]:
        return await self.q.all("list_push_subscriptions", into=Subscription)

    async def delete_subscription(self, subscription_id: uuid.UUID) -> None:
        await self.q.execute("delete_push_subscription", {"id": subscription_id})

    async def push_failed(self, subscription_id: uuid.UUID, error: str) -> None:
        await self.q.execute("mark_push_failed", {"id": subscription_id, "error": error})

    async def push_succeeded(self, subscription_id: uuid.UUID) -> None:
        await self.q.execute("mark_push_succeeded", {"id": subscription_id})


async def try_duty_lock(conn: psycopg.AsyncConnection[Any], duty: str) -> bool:
    """Take a once-per-fleet duty's lock on `conn`'s session (it stays held until that session ends); whether
    it was free. Raises psycopg's error as it comes: the duty's holder says an outage once, in its own words."""
    cur = await conn.execute(queries["try_duty_lock"], {"duty": duty})
    row = await cur.fetchone()
    return bool(row and row[0])
