"""What a process does when the database comes back as a *different* server: a standby promoted after the
primary was lost (Patroni, a managed service, `pg_ctl promote`).

Two things, both cheap while nothing happened:

- **Writes go to a primary only.** A DSN may list several hosts (`host=a,b`); unless it says otherwise, every
  connection asks for `target_session_attrs=read-write`, so libpq skips a server in recovery, and a session
  that finds none is an outage (waited out) rather than a write attempted on a standby (`primary_dsn`).
- **A seq is never given twice.** With an asynchronous standby, a commit the old primary acknowledged may never
  have reached the new one: the journal head it finds is below a seq this process already saw (an append's
  result, a frame an SSE client was sent). The writer's process remembers the highest seq it saw (`SeqMark`)
  and checks each new connection's head against it before the connection is used (`guard_journal_head`, the
  pool's `configure`). A head found below is raised past the lost range in one transaction with a
  `journal.seqs_lost` record naming it, and logged: the loss is a visible gap, not seqs silently reused (an SSE
  client resuming from a lost seq would skip the new events that took those numbers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from shared import journal, logs
from shared.models import NewEvent
from shared.sql import queries

log = logs.get(__name__)

SEQS_LOST = "journal.seqs_lost"
# what a connection asks of its server unless the DSN names its own target_session_attrs
PRIMARY_ATTRS = "read-write"


def primary_dsn(dsn: str) -> str:
    """`dsn` asking for a server that takes writes (`target_session_attrs=read-write`) unless it names its own
    target_session_attrs: a multi-host DSN then skips a standby, and a single host in recovery is refused."""
    params = conninfo_to_dict(dsn)
    if params.get("target_session_attrs"):
        return dsn
    return make_conninfo(dsn, target_session_attrs=PRIMARY_ATTRS)


@dataclass(frozen=True, slots=True)
class Loss:
    """Seqs a server lacks that this process saw committed: `after` the head it found, `upto` the highest seen."""

    after: int
    upto: int
    detected_by: str
    detected_at: str

    def as_dict(self) -> dict[str, Any]:
        return {"after": self.after, "upto": self.upto, "lost": self.upto - self.after,
                "detected_by": self.detected_by, "detected_at": self.detected_at}


class SeqMark:
    """The highest journal seq this process saw committed, and the losses it found below it."""

    def __init__(self, name: str):
        self.name = name
        self.high = 0
        self.losses: list[Loss] = []

    def saw(self, seq: int) -> None:
        self.high = max(self.high, seq)

    def lost(self, after: int, upto: int, by: str) -> Loss:
        loss = Loss(after, upto, by, datetime.now(UTC).isoformat())
        self.losses.append(loss)
        return loss


def seq_mark(pool: AsyncConnectionPool) -> SeqMark:
    """The mark of a pool made by `shared.database.Database` (a throwaway one for any other pool)."""
    found = getattr(pool, "seq_mark", None)
    return found if isinstance(found, SeqMark) else SeqMark(getattr(pool, "name", ""))


async def guard_journal_head(conn: psycopg.AsyncConnection[Any], mark: SeqMark) -> Loss | None:
    """A new connection's check (the executor's pool `configure`): the head is not below `mark.high`, or it is
    raised past it with a `journal.seqs_lost` record in one transaction. Returns the loss found, if any."""
    if mark.high == 0:
        return None
    started = time.monotonic()
    cur = await conn.execute(queries["get_journal_head"])
    row = await cur.fetchone()
    if row is None or row[0] >= mark.high:
        return None
    async with conn.transaction():
        # locked and read again: two connections opened together find the loss once
        cur = await conn.execute(queries["lock_journal_head"])
        row = await cur.fetchone()
        assert row is not None  # the journal_head row exists from the first migration on
        head = int(row[0])
        if head >= mark.high:
            return None
        upto = mark.high
        await conn.execute(queries["advance_journal_head_past"], {"seq": upto})
        loss = mark.lost(head, upto, mark.name)
        note = ("the database came back without seqs this process saw committed (a failover to a standby that "
                "lacked them: asynchronous replication); the head is raised past them so no seq is given twice")
        appended = await journal.append_on(conn, [NewEvent(SEQS_LOST, {**loss.as_dict(), "note": note})])
    mark.saw(appended.last_seq)
    log.error("journal_seqs_lost", service=mark.name, head_found=head, seen_upto=upto, lost=upto - head,
              record_seq=appended.last_seq, check_ms=round((time.monotonic() - started) * 1000, 1), note=note)
    return loss
