"""The journal append API: ordered, batched, atomic appends with one NOTIFY per batch."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg.rows import class_row
from psycopg_pool import AsyncConnectionPool

from shared import errors, logs
from shared.models import Event, NewEvent
from shared.sql import queries

log = logs.get(__name__)

# A lost connection is retried on a fresh one; the batch is atomic, so a retry writes it at most once.
APPEND_ATTEMPTS = 5
APPEND_RETRY_DELAY_S = 0.2


@dataclass(frozen=True, slots=True)
class Appended:
    first_seq: int
    last_seq: int


def _clean_nul(value: Any) -> Any:
    # jsonb cannot hold U+0000; a process may print it. Replace it rather than lose the line.
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_clean_nul(k): _clean_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean_nul(v) for v in value]
    return value


def encode_payload(payload: Any) -> str:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    if "\\u0000" in text:
        text = json.dumps(_clean_nul(payload), ensure_ascii=False, separators=(",", ":"))
    return text


async def _write_batch(conn: psycopg.AsyncConnection, events: Sequence[NewEvent]) -> Appended:
    now = datetime.now(UTC)
    async with conn.transaction():
        cur = await conn.execute(queries["advance_journal_head"], {"n": len(events)})
        row = await cur.fetchone()
        assert row is not None
        last = row[0]
        seq = last - len(events)
        async with conn.cursor().copy(queries["copy_journal"]) as copy:
            for ev in events:
                seq += 1
                await copy.write_row(
                    (
                        ev.event_id,
                        seq,
                        ev.project_id,
                        ev.session_id,
                        ev.task_id,
                        ev.parent_id,
                        ev.message_id,
                        ev.event_type,
                        ev.tier,
                        ev.created_at or now,
                        encode_payload(ev.payload),
                    )
                )
        await conn.execute(queries["notify_journal"], {"seq": str(last)})
    return Appended(first_seq=last - len(events) + 1, last_seq=last)


async def append_on(conn: psycopg.AsyncConnection, events: Sequence[NewEvent]) -> Appended:
    """Append inside the caller's transaction (a savepoint), so a row and its event commit together.

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


async def append(pool: AsyncConnectionPool, events: Sequence[NewEvent]) -> Appended:
    """Append `events` in one transaction, in the given order, and NOTIFY `journal` with the last seq.

    Either the whole batch is written or none of it. If the connection drops, the batch is retried on
    a new connection; when the drop happened after the commit, the retry finds the batch and returns
    its seqs instead of writing it twice (event_ids are the caller's, so the batch is recognisable).

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
                if attempt > 1:
                    found = await _already_written(conn, events)
                    if found is not None:
                        return found
                try:
                    return await _write_batch(conn, events)
                except pgerrors.ForeignKeyViolation as exc:
                    if exc.diag.constraint_name == "journal_event_type_fkey":
                        raise await _unknown_type_error(conn, events) from exc
                    raise errors.JournalWriteError(f"journal refused the batch: {exc.diag.message_detail}") from exc
                except pgerrors.UniqueViolation as exc:
                    raise errors.JournalWriteError(f"journal refused the batch: {exc.diag.message_detail}") from exc
                except (pgerrors.DataError, pgerrors.IntegrityError) as exc:
                    raise errors.JournalWriteError(f"journal refused the batch: {exc}") from exc
        except psycopg.OperationalError as exc:
            last_exc = exc
            log.warning("journal_append_retry", attempt=attempt, error=str(exc))
            await asyncio.sleep(APPEND_RETRY_DELAY_S * attempt)
    raise errors.JournalWriteError(f"journal unreachable after {APPEND_ATTEMPTS} attempts") from last_exc


async def register_event_type(pool: AsyncConnectionPool, name: str, tier: str, description: str = "") -> None:
    """Extend the open set of event types (an INSERT; a no-op when the name exists)."""
    async with pool.connection() as conn:
        await conn.execute(queries["register_event_type"], {"name": name, "tier": tier, "description": description})


async def head(conn: psycopg.AsyncConnection) -> int:
    cur = await conn.execute(queries["journal_head"])
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
