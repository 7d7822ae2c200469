"""Notifications: reach the user when Claude needs them, a worker stalls, or a turn finishes unwatched.

The notifier reads the journal after its own cursor (kept in the database, so a restart neither
repeats nor skips one), turns the few record types that need a person into short notifications, holds
back repeats (one per task per kind per `rate_limit_s`), folds a burst into one digest, and sends them by
Web Push (VAPID; RFC 8291 encryption by pywebpush) to every subscribed browser and, when configured, to an
ntfy topic. Payloads are a title, one line and a deep link: never a secret or a transcript.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

import orjson
from psycopg_pool import AsyncConnectionPool
from py_vapid import Vapid
from pydantic import SecretStr

from executor.notify import notes as said
from executor.notify import vapid
from executor.notify.duty import Duty
from executor.notify.notes import Note
from executor.notify.quiet import QuietHours
from executor.notify.store import NotifyStore, Sent
from executor.notify.store import Subscription as PushSubscription
from shared import consume, database, endpoints, logs
from shared.listener import Notification, Subscription

if TYPE_CHECKING:  # aiohttp and pywebpush (with requests) are imported at the first send: 0.3 s of every start
    import aiohttp

log = logs.get(__name__)

NOTIFIER_DUTY = "notifier"
# how often a notifier without the duty tries to take it (its holder may have died)
DUTY_RETRY_S = 2.0

POLL_S = 2.0
BURST_S = 0.1  # after a wake-up, let a burst of journal records land and take it in one pass
PAGE = 500
SEND_TIMEOUT_S = 10.0
PUSH_TTL_S = 3600
# how long a notification's answer buttons work (its one-use token; store.action_token)
ACTION_TTL_S = 3600
ACT_PATH = "/api/notify/act"
GONE = (404, 410)
# The records a notification may be made from: what list_notify_candidates reads (executor/sql/notify.sql).
NOTABLE = frozenset({"question.asked", "task.stalled", "task.exited", "executor.lost", "routine.run_ended"})


def wants(note: Notification) -> bool:
    """Whether a notification can have given the notifier work: any but a `journal` one that carries its rows
    (shared/sql/journal.sql) and none of them notable. Every line a worker prints is a journal notification:
    the passes they would wake (four or five queries each) are left to the next notable one or the poll."""
    if note.channel != "journal":
        return True
    _, _, rows = note.payload.partition(" ")
    if not rows:
        return True  # only the head: the batch was too big to carry
    try:
        parsed = orjson.loads(rows)
    except orjson.JSONDecodeError:
        return True
    return not isinstance(parsed, list) or any(not isinstance(r, dict) or r.get("event_type") in NOTABLE
                                               for r in parsed)


@dataclass(frozen=True)
class NotifyConfig:
    data_dir: Path = Path("./var")
    vapid_private_key: SecretStr | None = None  # PEM or base64url DER; generated into data_dir when unset
    vapid_subject: str = "mailto:admin@localhost"
    ntfy_url: str | None = None
    ntfy_token: SecretStr | None = None
    public_url: str = ""  # the page's address, for absolute links (ntfy's Click)
    rate_limit_s: float = 60.0
    digest_after: int = 3  # more than this many in one pass become one digest
    presence_s: float = 60.0  # a page seen this recently is watching its thread (or, visible, the user)
    digest_s: float = 120.0  # a finished run waits this long for others to fold into one digest
    quiet: QuietHours | None = None  # no pushes in this daily window (PETAL_NOTIFY_QUIET)
    allow_loopback_push: bool = False  # test-only: a loopback push stand-in

    def policy(self) -> dict[str, object]:
        """What will notify, for the page's settings."""
        return {"digest_s": self.digest_s, "presence_s": self.presence_s,
                "quiet": self.quiet.describe() if self.quiet else None}


class Delivery(TypedDict, total=False):
    push: list[str]  # one outcome per subscribed browser
    ntfy: str | None  # the ntfy topic's outcome (None: not configured)


Outcome = Literal["sent", "no_channel", "failed"]


class Notifier:
    def __init__(self, pool: AsyncConnectionPool, config: NotifyConfig, duty: Duty | None = None,
                 name: str | None = None):
        self.pool = pool
        self.store = NotifyStore.over(pool)
        self.config = config
        self.vapid: Vapid | None = None
        # with several executors on one database only the duty's holder notifies (one push per event)
        self.duty = duty
        self.name = name

    async def start(self) -> None:
        self.vapid = vapid.configured(self.config.vapid_private_key) or await self._fleet_vapid()
        await self.store.store_push_key(vapid.public_key(self.vapid), ntfy=bool(self.config.ntfy_url),
                                        policy=self.config.policy())
        await self.store.init_cursor()  # a first start begins at the journal's head

    async def _fleet_vapid(self) -> Vapid:
        """One key for the whole fleet, in the database: the first executor's offer wins (a race of two
        starting together included); every other executor reads it."""
        offer = await asyncio.to_thread(vapid.candidate_pem, self.config.data_dir)
        pem = await self.store.fleet_secret(vapid.SECRET_NAME, offer.decode(), offered_by=self.name)
        return Vapid.from_pem(pem.encode())

    async def run(self, sub: Subscription) -> None:
        try:
            await consume.consume("notifier", sub, {"journal": [self.notify], "notify_queue": [self.notify]},
                                  DUTY_RETRY_S if self.duty is not None else POLL_S,
                                  database.availability(self.pool), debounce_s=BURST_S)
        finally:
            if self.duty is not None:
                await self.duty.release()

    async def notify(self) -> bool:
        """One pass, if this executor holds the duty (another executor notifies; this one takes over if that one
        dies); whether it sent anything."""
        if self.duty is not None and not await self.duty.held():
            return False
        return bool(await self.pass_once())

    async def pass_once(self) -> list[Note]:
        for request_id in await self.store.claim_test_requests():
            note = Note("test", "petal-dispatch", "Notifications work. This is the test you asked for.", "/#chat")
            outcome, detail = await self.deliver([note])
            await self._record(note, outcome, detail)
            await self.store.finish_test_request(request_id, "done" if outcome == "sent" else "failed",
                                                 None if outcome == "sent" else outcome)
        cursor = await self.store.cursor()
        rows = await self.store.candidates(cursor.last_seq, PAGE)
        quiet = self.config.quiet is not None and self.config.quiet.active(datetime.now(UTC))
        due: list[Note] = []
        if rows:
            notes = [n for n in (said.note_for(r) for r in rows) if n is not None]
            due = await self._hold_back(notes, quiet)
            for n in (n for n in due if said.later(n)):
                await self._record(n, "deferred", {})  # for the next digest
            await self._send([n for n in due if not said.later(n)])
            # a full page: the next pass goes on after it; else the head, past records none of which is notable
            last = rows[-1].seq if len(rows) == PAGE else max(rows[-1].seq, cursor.head)
            await self.store.advance_cursor(last)
        else:
            await self.store.advance_cursor(cursor.head)
        await self._digest_due(quiet)
        return due

    async def _send(self, due: list[Note]) -> None:
        if len(due) > self.config.digest_after:
            digest = self._digest(due)
            outcome, detail = await self.deliver([digest])
            for n in due:
                await self._record(n, "digested" if outcome == "sent" else outcome, detail)
            await self._record(digest, outcome, detail)
        else:
            for n in due:
                outcome, detail = await self.deliver([n])
                await self._record(n, outcome, detail)

    async def _digest_due(self, quiet: bool) -> None:
        """The finished runs held for a digest, sent once the oldest has waited `digest_s` (one alone as itself),
        unless it is quiet or the user is looking at a page (they wait on)."""
        waiting = await self.store.deferred()
        if not waiting or waiting[0].waited_s < self.config.digest_s or quiet or \
                await self.store.page_visible(self.config.presence_s):
            return
        batch = [Note(d.kind, d.title, d.body, d.url, d.task_id, d.thread_id, d.seq, d.detail or {})
                 for d in waiting]
        note = batch[0] if len(batch) == 1 else self._digest(batch)
        outcome, detail = await self.deliver([note])
        await self.store.finish_deferred([d.id for d in waiting],
                                         outcome if len(batch) == 1 or outcome != "sent" else "digested",
                                         dict(detail))
        if len(batch) > 1:
            await self._record(note, outcome, detail)

    async def _held(self, n: Note, quiet: bool, visible: list[bool]) -> str | None:
        """Why a note is not pushed now (recorded as its outcome), or None: its thread is muted; it is quiet
        (but for a card that holds up work, when the user asked for those); a page is in front of the user."""
        if await self.store.muted(n.task_id, n.thread_id):
            return "muted"
        if quiet and not (n.gate and self.config.quiet is not None and self.config.quiet.allow_gates):
            return "quiet"
        if not said.later(n):  # a finished run waits for the digest, which waits for the page to close
            if not visible:
                visible.append(await self.store.page_visible(self.config.presence_s))
            if visible[0]:
                return "page_visible"
        return None

    async def _hold_back(self, notes: list[Note], quiet: bool = False) -> list[Note]:
        """Drop what is held (muted, quiet, seen on a page), what the rate limit holds back, turns someone is
        watching and a routine run's turns."""
        due: list[Note] = []
        seen: set[tuple[str, str]] = set()
        visible: list[bool] = []  # asked once a pass, when a note needs it
        for n in notes:
            if why := await self._held(n, quiet, visible):
                await self._record(n, why, {})
                continue
            if n.kind == "turn_finished" and n.thread_id is not None:
                if await self.store.thread_watched(n.thread_id, self.config.presence_s):
                    continue
            if n.question_id is not None:  # each question is the user's to answer: one note each, never one a task
                key = (n.kind, str(n.question_id))
                recent = await self.store.question_notified(n.kind, n.task_id, n.question_id, self.config.rate_limit_s)
            else:
                key = (n.kind, str(n.task_id or n.thread_id))
                recent = await self.store.recently_notified(n.kind, n.task_id, n.thread_id, self.config.rate_limit_s)
            if key in seen or recent:
                await self._record(n, "rate_limited", {})
                continue
            seen.add(key)
            due.append(n)
        return due

    @staticmethod
    def _digest(batch: list[Note]) -> Note:
        kinds: dict[str, int] = {}
        for n in batch:
            kinds[n.kind] = kinds.get(n.kind, 0) + 1
        words = {"question": "question", "escalation": "escalation", "stalled": "stalled task",
                 "turn_finished": "finished turn"}
        parts = [f"{c} {words.get(k) or (k[8:] + ' routine run' if k.startswith('routine_') else k)}"
                 f"{'s' if c > 1 else ''}" for k, c in kinds.items()]
        if all(said.later(n) for n in batch):  # the finished runs' digest: nothing waits on the user
            threads = {n.thread_id for n in batch}
            url = f"/#chat/{threads.pop()}" if len(threads) == 1 and None not in threads else "/#tasks"
            return Note("digest", f"{len(batch)} runs finished", said.line(", ".join(parts)), url)
        url = "/#asks" if kinds.get("question") or kinds.get("escalation") else "/#tasks"
        return Note("digest", f"{len(batch)} things need you", said.line(", ".join(parts)), url)

    async def deliver(self, notes: list[Note]) -> tuple[Outcome, Delivery]:
        """Send each note on every channel; ('sent' | 'no_channel' | 'failed', what happened)."""
        subs = await self.store.subscriptions()
        if not subs and not self.config.ntfy_url:
            return "no_channel", {}
        import aiohttp

        ok, ntfy = False, None
        pushed: list[str] = []
        # push endpoints are user-supplied: their connections refuse inside addresses (ntfy is configured)
        async with endpoints.guarded_session(allow_loopback=self.config.allow_loopback_push,
                                             timeout_s=SEND_TIMEOUT_S) as push_http, \
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SEND_TIMEOUT_S)) as ntfy_http:
            for note in notes:
                token = await self._token(note, "push") if subs else None
                for s in subs:
                    result = await self._push(s, note, push_http, token)
                    pushed.append(result)
                    ok = ok or result == "sent"
                if self.config.ntfy_url:
                    ntfy = await self._ntfy(note, ntfy_http)
                    ok = ok or ntfy == "sent"
        return ("sent" if ok else "failed"), Delivery(push=pushed, ntfy=ntfy)

    async def _token(self, note: Note, channel: str) -> str | None:
        """A one-use token for this note's answer buttons on `channel`, or None (no buttons: the note has no
        choices, or its question is no longer pending)."""
        if not note.choices or note.question_id is None:
            return None
        return await self.store.action_token(note.question_id, channel, ACTION_TTL_S)

    async def _push(self, s: PushSubscription, note: Note, http: aiohttp.ClientSession, token: str | None) -> str:
        import aiohttp
        from pywebpush import WebPushException, webpush_async

        assert self.vapid is not None
        info = {"endpoint": s.endpoint, "keys": {"p256dh": s.p256dh, "auth": s.auth}}
        # checked again here: a stored row (or a name that now resolves elsewhere) must not reach inside
        refused = await endpoints.refusal(s.endpoint, allow_loopback=self.config.allow_loopback_push)
        if refused:
            await self.store.push_failed(s.id, refused[:300])
            log.warning("push_endpoint_refused", reason=refused)
            return "refused"
        try:
            await webpush_async(info, note.payload(token), vapid_private_key=self.vapid,
                                vapid_claims={"sub": self.config.vapid_subject}, ttl=PUSH_TTL_S,
                                aiohttp_session=http, timeout=aiohttp.ClientTimeout(total=SEND_TIMEOUT_S))
        except WebPushException as exc:
            if exc.status_code in GONE:  # the browser unsubscribed or the subscription expired
                await self.store.delete_subscription(s.id)
                log.info("push_subscription_removed", status=exc.status_code)
                return f"gone {exc.status_code}"
            await self.store.push_failed(s.id, str(exc)[:300])
            return f"failed {exc.status_code}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            await self.store.push_failed(s.id, repr(exc)[:300])
            return "failed"
        await self.store.push_succeeded(s.id)
        return "sent"

    async def _ntfy(self, note: Note, http: aiohttp.ClientSession) -> str:
        import aiohttp

        assert self.config.ntfy_url
        headers = {"Title": note.title, "Tags": note.kind}
        if self.config.public_url:
            headers["Click"] = self.config.public_url.rstrip("/") + note.url
        if self.config.ntfy_token:
            headers["Authorization"] = f"Bearer {self.config.ntfy_token.get_secret_value()}"
            # only on a topic that needs a token to read: the ntfy server sees what it relays
            if actions := await self._ntfy_actions(note):
                headers["Actions"] = actions
        try:
            async with http.post(self.config.ntfy_url, data=note.body.encode(), headers=headers) as r:
                return "sent" if r.status < 300 else f"failed {r.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return f"failed {type(exc).__name__}"

    async def _ntfy_actions(self, note: Note) -> str | None:
        """ntfy's action buttons for a question (its JSON form, ASCII), sent by the ntfy app to the ingress; None
        without choices or without the page's address to send them to."""
        base = self.config.public_url.rstrip("/")
        if not base or not (token := await self._token(note, "ntfy")):
            return None
        buttons: list[dict[str, object]] = [
            {"action": "http", "label": said.line(choice, 40), "url": base + ACT_PATH, "method": "POST",
             "headers": {"Content-Type": "application/json"}, "clear": True,
             "body": json.dumps({"token": token, "choice": choice})} for choice in note.choices]
        buttons.append({"action": "view", "label": "Reply", "url": base + note.url, "clear": True})
        return json.dumps(buttons)  # ensure_ascii: a header carries ASCII only

    async def _record(self, note: Note, outcome: str, detail: Delivery) -> None:
        await self.store.record(Sent(note.kind, note.task_id, note.thread_id, note.seq, note.title, note.body,
                                     note.url, outcome, {**note.detail, **detail}))
