"""The query layer: named statements over the pool, database errors as the project's own types."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from psycopg_pool import AsyncConnectionPool

from shared.database import OUTAGE_ERRORS, Database
from shared.errors import Conflict, DatabaseUnavailable, Invalid, Missing
from shared.query import Queries
from tests.pg import DB

REGISTRY = {
    "create_things": "CREATE TABLE IF NOT EXISTS qt_parent (id int PRIMARY KEY);"
                     "CREATE TABLE IF NOT EXISTS qt (a int PRIMARY KEY, b text NOT NULL CHECK (b <> 'x'),"
                     " parent int REFERENCES qt_parent (id))",
    "insert_thing": "INSERT INTO qt (a, b, parent) VALUES (%(a)s, %(b)s, %(parent)s)",
    "get_thing": "SELECT a, b FROM qt WHERE a = %(a)s",
    "list_things": "SELECT a, b FROM qt ORDER BY a",
}


@dataclass(frozen=True)
class Thing:
    a: int
    b: str


@pytest.fixture
async def queries(db: DB) -> AsyncIterator[Queries]:
    # the owner's connection: the services' roles may not create tables
    async with Database(db.admin_dsn, name="query-test", max_size=2) as database:
        q = Queries(database.pool, REGISTRY)
        await q.execute("create_things")
        yield q


async def test_rows_come_back_as_dicts_or_as_the_type_asked_for(queries: Queries) -> None:
    assert await queries.execute("insert_thing", {"a": 1, "b": "one", "parent": None}) == 1
    assert await queries.one("get_thing", {"a": 1}) == {"a": 1, "b": "one"}
    assert await queries.one("get_thing", {"a": 1}, into=Thing) == Thing(1, "one")
    assert await queries.all("list_things", into=Thing) == [Thing(1, "one")]
    assert await queries.one("get_thing", {"a": 2}) is None


@pytest.mark.parametrize(("row", "error", "constraint"), [
    ({"a": 1, "b": "again", "parent": None}, Conflict, "qt_pkey"),
    ({"a": 2, "b": "x", "parent": None}, Invalid, "qt_b_check"),
    ({"a": 3, "b": "ok", "parent": 99}, Missing, "qt_parent_fkey"),
])
async def test_a_refused_write_is_the_projects_error_naming_the_rule(
        queries: Queries, row: dict[str, object], error: type[Exception], constraint: str) -> None:
    await queries.execute("insert_thing", {"a": 1, "b": "one", "parent": None})
    with pytest.raises(error) as caught:
        await queries.execute("insert_thing", row)
    assert getattr(caught.value, "constraint") == constraint
    assert await queries.all("list_things", into=Thing) == [Thing(1, "one")]  # nothing written


async def test_a_transaction_that_fails_writes_nothing(queries: Queries) -> None:
    with pytest.raises(Conflict):
        async with queries.transaction() as tx:
            await tx.execute("insert_thing", {"a": 5, "b": "five", "parent": None})
            await tx.execute("insert_thing", {"a": 5, "b": "five again", "parent": None})
    assert await queries.all("list_things") == []
    async with queries.transaction() as tx:
        await tx.execute("insert_thing", {"a": 6, "b": "six", "parent": None})
        assert await tx.one("get_thing", {"a": 6}, into=Thing) == Thing(6, "six")
    assert await queries.all("list_things", into=Thing) == [Thing(6, "six")]


async def test_a_database_that_is_away_is_an_outage_not_a_driver_error(db: DB) -> None:
    pool = AsyncConnectionPool("postgresql://postgres@127.0.0.1:1/postgres", min_size=0, max_size=1, timeout=0.5,
                               open=False)
    await pool.open(wait=False)
    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            await Queries(pool, REGISTRY).one("get_thing", {"a": 1})
        assert isinstance(caught.value, OUTAGE_ERRORS)  # every loop that waits out an outage knows it
    finally:
        await pool.close()
