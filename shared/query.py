"""The one way code runs a named query: `Queries(pool, registry)` with `execute`, `one` and `all`, and the
same inside `transaction()`. Database errors become the project's error types here, in one place:

- the database is away (refused, cut, no pooled connection in time) → `DatabaseUnavailable`, which the
  outage handling (`shared.database.OUTAGE_ERRORS`, the ingress's 503) already knows; so is a server that
  takes no writes (25006, a standby reached through a DSN that allowed one: wait for a primary);
- a transaction aborted for a concurrent one (a deadlock, 40P01; a serialization failure, 40001) →
  `Contended`: the database is there and the same work again is expected to get through (the ingress's 409);
- a unique or exclusion constraint → `Conflict`; a foreign key → `Missing`; a check, not-null or bad
  value → `Invalid`.

Programming errors (a syntax error, an unknown column) are left as they are: they are bugs, not states.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
import dataclasses
from typing import Any, LiteralString, Self, TypeVar, cast, overload

import psycopg
from psycopg import pq
from psycopg import errors as pgerrors
from psycopg.rows import dict_row, kwargs_row
from psycopg_pool import AsyncConnectionPool

from shared.errors import Conflict, Contended, DatabaseUnavailable, Invalid, Missing, PetalError

T = TypeVar("T")
Params = Mapping[str, Any] | None
Row = dict[str, Any]
Registry = Mapping[str, LiteralString]
"""Named queries (`shared.sql.load`): the SQL text is the project's own, never built from a value."""


# class 40 (transaction rollback): PostgreSQL aborted the transaction for a concurrent one. psycopg's classes
# are flat (each an OperationalError), so each is named.
CONTENDED_PG = (pgerrors.TransactionRollback, pgerrors.SerializationFailure, pgerrors.DeadlockDetected)


def translate(exc: psycopg.Error) -> PetalError | None:
    """The project's error for a database error, or None for one that is a bug. (The journal's appends
    classify their failures with it too: shared/journal.py.)"""
    message = (exc.diag.message_primary or str(exc)).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, (pgerrors.UniqueViolation, pgerrors.ExclusionViolation)):
        return Conflict(message, constraint=exc.diag.constraint_name)
    if isinstance(exc, pgerrors.ForeignKeyViolation):
        return Missing(message, constraint=exc.diag.constraint_name)
    if isinstance(exc, (pgerrors.IntegrityError, pgerrors.DataError)):
        return Invalid(message, constraint=exc.diag.constraint_name)
    if isinstance(exc, CONTENDED_PG):  # OperationalErrors, but no outage
        return Contended(message)
    if isinstance(exc, (psycopg.OperationalError, pgerrors.ReadOnlySqlTransaction)):
        return DatabaseUnavailable(message)
    return None


class _Runner:
    """`execute`/`one`/`all` over whatever gives a connection (the pool, or one held in a transaction)."""

    def __init__(self, registry: Registry):
        self.registry = registry

    def _conn(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        raise NotImplementedError

    def sql(self, name: str) -> LiteralString:
        """The text of a named query; an unknown name is a bug, said with the name."""
        try:
            return self.registry[name]
        except KeyError:
            raise KeyError(f"no query named {name!r} in this registry") from None

    async def execute(self, name: str, params: Params = None) -> int:
        """Run a statement; the number of rows it touched."""
        try:
            async with self._conn() as conn, conn.cursor() as cur:
                await cur.execute(self.sql(name), params)
                return cur.rowcount
        except psycopg.Error as exc:
            raise (translate(exc) or exc) from exc

    @overload
    async def one(self, name: str, params: Params = None) -> Row | None: ...
    @overload
    async def one(self, name: str, params: Params = None, *, into: Callable[..., T]) -> T | None: ...

    async def one(self, name: str, params: Params = None, *, into: Callable[..., Any] | None = None) -> Any:
        """The first row (a dict, or `into(**row)`, e.g. a frozen dataclass), or None."""
        try:
            async with self._conn() as conn, conn.cursor(row_factory=_factory(into)) as cur:
                await cur.execute(self.sql(name), params)
                return await cur.fetchone()
        except psycopg.Error as exc:
            raise (translate(exc) or exc) from exc

    @overload
    async def all(self, name: str, params: Params = None) -> list[Row]: ...
    @overload
    async def all(self, name: str, params: Params = None, *, into: Callable[..., T]) -> list[T]: ...

    async def all(self, name: str, params: Params = None, *, into: Callable[..., Any] | None = None) -> list[Any]:
        """Every row (dicts, or `into(**row)` each)."""
        try:
            async with self._conn() as conn, conn.cursor(row_factory=_factory(into)) as cur:
                await cur.execute(self.sql(name), params)
                return await cur.fetchall()
        except psycopg.Error as exc:
            raise (translate(exc) or exc) from exc


class FromRow:
    """A frozen dataclass that rows become (`into=`): `from_row` takes the columns its fields name, and
    leaves any other column (a store's row type says what it reads, as procrastinate's `Job.from_row`).
    A subclass overrides it to convert a column (a path, a tuple)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        fields = dataclasses.fields(cast(Any, cls))  # a TypeError when a subclass is not a dataclass
        return cls(**{f.name: row[f.name] for f in fields if f.init})


def _factory(into: Callable[..., Any] | None) -> Any:
    if into is None:
        return dict_row
    if isinstance(into, type) and issubclass(into, FromRow):
        from_row = into.from_row

        def by_name(cursor: Any) -> Callable[[Any], Any]:
            as_dict = dict_row(cursor)
            return lambda values: from_row(as_dict(values))

        return by_name
    return kwargs_row(into)


class Transaction(_Runner):
    """Queries on one connection inside one transaction; `conn` for what needs the connection itself
    (a journal append, a COPY)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], registry: Registry):
        super().__init__(registry)
        self.conn = conn

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        yield self.conn


class Queries(_Runner):
    """Named queries over a pool. Each statement outside `transaction()` commits on its own (the pool's
    connections are autocommit)."""

    def __init__(self, pool: AsyncConnectionPool, registry: Registry):
        super().__init__(registry)
        self.pool = pool

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self.pool.connection() as conn:
            yield conn

    @asynccontextmanager
    async def transaction(self, *, pipelined: bool = False) -> AsyncIterator[Transaction]:
        """One transaction: committed when the block ends, rolled back when it raises. `pipelined`: in
        psycopg's pipeline mode, a statement whose result nobody waits for (an `execute`) goes out with the
        next one, in one round trip (BEGIN with the first); the server still runs them one after another,
        each with its own snapshot. An error of such a statement is raised by the next one that waits; its
        `execute` returns before its result, so its row count says nothing (-1)."""
        try:
            async with self.pool.connection() as conn:
                try:
                    async with AsyncExitStack() as modes:
                        if pipelined:
                            await modes.enter_async_context(conn.pipeline())
                        await modes.enter_async_context(conn.transaction())
                        yield Transaction(conn, self.registry)
                finally:
                    # psycopg only warns when it cannot leave pipeline mode (a cancellation mid-sync): such a
                    # connection would hang its next user, so the pool gets it closed and replaces it
                    if conn.pgconn.pipeline_status != pq.PipelineStatus.OFF:
                        await conn.close()
        except psycopg.Error as exc:
            raise (translate(exc) or exc) from exc
