"""Ids as the commands take them: a whole id, or a prefix of one as `status` prints it (8 characters).

A unique prefix resolves to its id; an unknown or ambiguous one is a one-line error naming it
(shared/sql/ids.sql looks them up, at most two rows: one is the answer, two say ambiguous)."""

from __future__ import annotations

import re
import uuid

from psycopg_pool import AsyncConnectionPool

from shared import errors
from shared.query import Queries, Transaction
from shared.sql import queries as shared_sql

# what a prefix of a UUID's text may hold (and nothing LIKE reads as a wildcard)
_PREFIX = re.compile(r"[0-9a-f-]{1,36}")
# the table each kind is looked up in (its query in shared/sql/ids.sql)
KINDS = {"task": "list_task_ids_like", "thread": "list_thread_ids_like", "routine": "list_routine_ids_like",
         "project": "list_project_ids_like"}


def _prefix(kind: str, text: str) -> str:
    prefix = text.strip().lower()
    if not _PREFIX.fullmatch(prefix):
        raise errors.ConfigError(f"{text!r} is not a {kind} id (a UUID, or the start of one as `status` prints it)")
    return prefix


async def resolve(q: Queries | Transaction, kind: str, text: str) -> uuid.UUID:
    """The id `text` names: itself when whole, else the one id of this kind that starts with it."""
    prefix = _prefix(kind, text)
    rows = await q.all(KINDS[kind], {"prefix": prefix})
    if not rows:
        raise errors.ConfigError(f"no {kind} {text}")
    if len(rows) > 1:
        raise errors.ConfigError(f"{kind} id {text} is ambiguous: it starts more than one {kind}'s id "
                                 f"({rows[0]['id']}, {rows[1]['id']}, …); give more of it")
    found: uuid.UUID = rows[0]["id"]
    return found


async def resolve_on(pool: AsyncConnectionPool, kind: str, text: str) -> uuid.UUID:
    """`resolve` on a pool of either service's role (both read what ids.sql reads)."""
    return await resolve(Queries(pool, shared_sql), kind, text)
