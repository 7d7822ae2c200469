"""The journal append API: ordered, batched, atomic appends with one NOTIFY per batch."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import psycopg
from psycopg import errors as pgerrors
from psycopg.rows import class_row
from psycopg_pool import AsyncConnectionPool

from shared import errors, logs
from shared.models import Event, NewEvent
from shared.query import Queries, translate
from shared.sql import queries

log = logs.get(__name__)

# A lost connection is retried on a fresh one; the batch is atomic, so a retry writes it at most once.
APPEND_ATTEMPTS = 5
APPEND_RETRY_DELAY_S = 0.2
# Batches up to this size go as one INSERT statement (latency); larger ones as COPY (throughput).
SMALL_BATCH = 64


@dataclass(frozen=True, slots=True)
class Appended:
    first_seq: int
    last_seq: int


def _clean(value: Any) -> Any:
    # jsonb holds neither U+0000 nor lone surrogates, and a process may print both (binary tool
    # output, a split emoji). Replace them rather than lose the line.
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def storable_json(text: str) -> bool:
    """Whether JSON text (known to parse) can go into jsonb as it is."""
    if "\\u" not in text:  # the usual line: one scan instead of three
        return True
    return "\\u0000" not in text and "\\ud" not in text and "\\uD" not in text


def encode_payload(payload: Any) -> str:
    try:
        text = orjson.dumps(payload).decode()
    except TypeError:  # lone surrogates, non-str keys: the slow, forgiving path
        return json.dumps(_clean(payload), ensure_ascii=False, separators=(",", ":"), default=str)
    if "\\u0000" in text:
        return orjson.dumps(_clean(payload)).decode()
    return text


def _copy_text(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


# uuid4's layout: the version (4) and the RFC 4122 variant in place of six of the random bits
_V4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_V4_SET = (4 << 76) | (0x8000 << 48)
_new_object = object.__new__
_set_slot = object.__setattr__


def new_event_ids(n: int) -> list[uuid.UUID]:
    """n random (version 4) UUIDs for the events of one read: one urandom call for all of them, each built
    the way CPython 3.14's own UUID._from_int does. uuid.uuid4() per line (a syscall and UUID's checking
    constructor) cost a flood of lines more than parsing them."""
    raw = os.urandom(16 * n)
    safe = uuid.SafeUUID.unknown
    ids = []
    for i in range(0, 16 * n, 16):
        u = _new_object(uuid.UUID)
        _set_slot(u, "int", (int.from_bytes(raw[i : i + 16], "big") & _V4_CLEAR) | _V4_SET)
        _set_slot(u, "is_safe", safe)
        ids.append(u)
    return ids


def _copy_rows(events: Sequence[NewEvent], first_seq: int, now: datetime) -> bytes:
    """COPY text format for the batch, built in one pass (one write instead of an await per row).

    A flood's batch repeats a few task/session ids and one read time per chunk of lines: each object is
    formatted once (memoised by identity; the events hold them alive for the call). UUIDs go as 32 hex
    digits, which the uuid type reads like the hyphenated form.
    """
    ids: dict[int, str] = {id(None): "\\N"}
    times: dict[int, str] = {}
    words: dict[str, str] = {}

    def hexed(value: uuid.UUID | None) -> str:
        text = ids[id(value)] = "\\N" if value is None else f"{value.int:032x}"
        return text

    def stamp(value: datetime) -> str:
        text = times[id(value)] = value.isoformat()
        return text

    def word(value: str) -> str:
        text = words[value] = _copy_text(value)
        return text

    out = []
    for seq, ev in enumerate(events, start=first_seq):
        payload = ev.payload_json if ev.payload_json is not None else encode_payload(ev.payload)
        created = ev.created_at or now
        out.append(
            f"{ev.event_id.int:032x}\t{seq}\t"
            f"{ids.get(id(ev.project_id)) or hexed(ev.project_id)}\t"
            f"{ids.get(id(ev.session_id)) or hexed(ev.session_id)}\t"
            f"{ids.get(id(ev.task_id)) or hexed(ev.task_id)}\t"
            f"{ids.get(id(ev.parent_id)) or hexed(ev.parent_id)}\t"
            f"{ids.get(id(ev.message_id)) or hexed(ev.message_id)}\t"
            f"{words.get(ev.event_type) or word(ev.event_type)}\t{words.get(ev.tier) or word(ev.tier)}\t"
            f"{times.get(id(created)) or stamp(created)}\t{_copy_text(payload)}"
        )
    out.append("")
    return "\n".join(out).encode()


def _small_batch_params(events: Sequence[NewEvent], now: datetime) -> dict[str, list[Any]]:
    return {
        "event_ids": [ev.event_id for ev in events],
        "project_ids": [ev.project_id for ev in events],
        "session_ids": [ev.session_id for ev in events],
        "task_ids": [ev.task_id for ev in events],
        "parent_ids": [ev.parent_id for ev in events],
        "message_ids": [ev.message_id for ev in events],
        "event_types": [ev.event_type for ev in events],
        "tiers": [ev.tier for ev in events],
        "created_ats": [ev.created_at or now for ev in events],
        "payloads": [ev.payload_json if ev.payload_json is not None else encode_payload(ev.payload)
                     for ev in events],
    }


async def _write_batch(conn: psycopg.AsyncConnection, events: Sequence[NewEvent],
                       on_sent: Callable[[], None] | None = None) -> Appended:
    now = datetime.now(UTC)
    if len(events) <= SMALL_BATCH and conn.autocommit:
        # latency path: one round trip instead of BEGIN, UPDATE, COPY, NOTIFY, COMMIT
        cur = await conn.execute(queries["append_small_batch"], _small_batch_params(events, now))
        row = await cur.fetchone()
        assert row is not None
        if on_sent is not None:
            on_sent()
        return Appended(first_seq=row[0] - len(events) + 1, last_seq=row[0])
    async with conn.transaction():
        cur = await conn.execute(queries["advance_journal_head"], {"n": len(events)})
        row = await cur.fetchone()
        assert row is not None
        last = row[0]
        async with conn.cursor().copy(queries["copy_journal"]) as copy:
            await copy.write(_copy_rows(events, last - len(events) + 1, now))
            if on_sent is not None:
                on_sent()
    return Appended(first_seq=last - len(events) + 1, last_seq=last)


async def append_on(conn: psycopg.AsyncConnection, events: Sequence[NewEvent]) -> Appended:
    """Append inside the caller's transaction, so a row and its event commit together (on the pools'
    autocommit connections, as one statement of it; on another connection, in a savepoint).

    Holds the journal head's lock until the caller commits: keep that transaction short.
    """
    try:
        return await _write_batch(conn, events)
    except pgerrors.ForeignKeyViolation as exc:
        if exc.diag.constraint_name == "journal_event_type_fkey":
            raise await _unknown_type_error(conn, events) from exc
        raise


async def _already_written(conn: psycopg.AsyncConnection, events: Sequence[NewEvent]) -> Appended | None:
    cur = await conn.execute(queries["find_event_seqs"], {"ids": [ev.event_id for ev in events]})
    seqs = sorted(seq for _, seq in await cur.fetchall())
    if not seqs:
        return None
    if len(seqs) != len(events):
        raise errors.JournalWriteError("part of a batch's event_ids are already in the journal")
    return Appended(first_seq=seqs[0], last_seq=seqs[-1])


async def _unknown_type_error(
    conn: psycopg.AsyncConnection, events: Sequence[NewEvent]
) -> errors.UnknownEventType:
    pairs = sorted({(ev.event_type, ev.tier) for ev in events})
    cur = await conn.execute(
        queries["find_unregistered_event_types"],
        {"names": [p[0] for p in pairs], "tiers": [p[1] for p in pairs]},
    )
    return errors.UnknownEventType([(n, t) for n, t in await cur.fetchall()])


async def append(pool: AsyncConnectionPool, events: Sequence[NewEvent], *, retried: bool = False,
                 on_sent: Callable[[], None] | None = None) -> Appended:
    """Append `events` in one transaction, in the given order, and NOTIFY `journal` with the last seq.

    Either the whole batch is written or none of it. If the connection drops, the batch is retried on
    a new connection; when the drop happened after the commit, the retry finds the batch and returns
    its seqs instead of writing it twice (event_ids are the caller's, so the batch is recognisable).
    `retried`: the caller tried this batch before (its first attempt looks for it too).
    `on_sent`: called once the batch is handed to the server, before a large one's end is awaited (the
    journal writer wakes its producers then: the server has the batch to work on while they read on).

    Raises:
        UnknownEventType: an (event_type, tier) pair is not registered; nothing was written.
        JournalWriteError: the batch was refused for another reason, or the database stayed away.
    """
    if not events:
        raise ValueError("append needs at least one event")
    last_exc: Exception | None = None
    for attempt in range(1, APPEND_ATTEMPTS + 1):
        try:
            async with pool.connection() as conn:
                if attempt > 1 or retried:
                    found = await _already_written(conn, events)
                    if found is not None:
                        return found
                try:
                    return await _write_batch(conn, events, on_sent)
                except pgerrors.ForeignKeyViolation as exc:
                    if exc.diag.constraint_name == "journal_event_type_fkey":
                        raise await _unknown_type_error(conn, events) from exc
                    raise
        except psycopg.Error as exc:
            # classified as every query's error is (shared/query.py): refused for its content, or away
            failure = translate(exc)
            if isinstance(failure, errors.DatabaseRefused):
                failure.__cause__ = exc
                detail = exc.diag.message_detail or str(failure)
                raise errors.JournalRefused(f"journal refused the batch: {detail}") from failure
            if not isinstance(failure, errors.DatabaseUnavailable):
                raise  # a bug, not a state
            last_exc = exc
            log.debug("journal_append_retry", attempt=attempt, error=str(exc))
            await asyncio.sleep(APPEND_RETRY_DELAY_S * attempt)
    raise errors.JournalWriteError(f"journal unreachable after {APPEND_ATTEMPTS} attempts") from last_exc


async def register_event_type(pool: AsyncConnectionPool, name: str, tier: str, description: str = "") -> None:
    """Extend the open set of event types (an INSERT; a no-op when the name exists)."""
    await Queries(pool, queries).execute("register_event_type", {"name": name, "tier": tier,
                                                                 "description": description})


async def head(conn: psycopg.AsyncConnection) -> int:
    cur = await conn.execute(queries["get_journal_head"])
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def read_since(
    conn: psycopg.AsyncConnection,
    after: int,
    *,
    limit: int = 1000,
    task_id: uuid.UUID | None = None,
    session_id: uuid.UUID | None = None,
) -> list[Event]:
    """Committed events with seq > after, in seq order."""
    async with conn.cursor(row_factory=class_row(Event)) as cur:
        await cur.execute(
            queries["read_journal"], {"after": after, "limit": limit, "task_id": task_id, "session_id": session_id}
        )
        return await cur.fetchall()


async def read_lines(pool: AsyncConnectionPool, *, after: int, task_id: uuid.UUID | None = None,
                     thread_id: uuid.UUID | None = None, limit: int = 500) -> list[Event]:
    """Events after a seq as `petal-dispatch journal` shows them: one task's, or one thread's with the
    workers its turns dispatched (stream deltas left out)."""
    return await Queries(pool, queries).all("read_journal_lines", {"after": after, "task_id": task_id,
                                                                   "thread_id": thread_id, "limit": limit},
                                            into=Event)
