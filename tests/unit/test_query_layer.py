"""The one way code runs a named query (shared/query.py) over a connection that is a stand-in: database errors become
the project's own, rows become the types asked for, and an unknown name is a bug said with the name."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any, cast

import psycopg
import pytest
from psycopg import errors as pgerrors
from psycopg import pq

from shared import errors
from shared.models import NewEvent
from shared.query import FromRow, Transaction, translate
from shared.work import Work

pytestmark = pytest.mark.unit

REGISTRY = {"get_thing": "SELECT %(id)s AS id", "touch_thing": "UPDATE things SET x = 1"}


@pytest.mark.parametrize(("raised", "becomes"), [
    (pgerrors.UniqueViolation, errors.Conflict),
    (pgerrors.ExclusionViolation, errors.Conflict),
    (pgerrors.ForeignKeyViolation, errors.Missing),
    (pgerrors.CheckViolation, errors.Invalid),
    (pgerrors.NotNullViolation, errors.Invalid),
    (pgerrors.InvalidTextRepresentation, errors.Invalid),  # a DataError: a value the column cannot hold
    (pgerrors.DeadlockDetected, errors.Contended),
    (pgerrors.SerializationFailure, errors.Contended),
    (pgerrors.ReadOnlySqlTransaction, errors.DatabaseUnavailable),  # a standby: wait for a primary
    (psycopg.OperationalError, errors.DatabaseUnavailable),
])
def test_each_database_error_becomes_the_projects_own(raised: type[psycopg.Error], becomes: type[Exception]) -> None:
    found = translate(raised("what the server said\nDETAIL: more"))
    assert type(found) is becomes
    assert str(found) == "what the server said"  # its first line


def test_a_contention_is_not_an_outage_and_a_refusal_is_not_either() -> None:
    assert not isinstance(translate(pgerrors.DeadlockDetected("d")), errors.DatabaseUnavailable)
    assert isinstance(translate(pgerrors.UniqueViolation("u")), errors.DatabaseRefused)


@pytest.mark.parametrize("raised", [pgerrors.SyntaxError, pgerrors.UndefinedColumn, psycopg.ProgrammingError])
def test_a_programming_error_translates_to_nothing_it_is_a_bug(raised: type[psycopg.Error]) -> None:
    assert translate(raised("no such column")) is None


def test_an_error_without_a_message_is_named_by_its_type() -> None:
    assert str(translate(pgerrors.UniqueViolation())) == "UniqueViolation"


class _Cursor:
    def __init__(self, conn: _Conn, row_factory: Any):
        self.conn, self.row_factory = conn, row_factory
        self.rowcount = -1

    async def __aenter__(self) -> _Cursor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def execute(self, sql: str, params: Mapping[str, Any] | None) -> None:
        self.conn.ran.append((sql, params))
        if self.conn.fails is not None:
            raise self.conn.fails
        self.rowcount = len(self.conn.rows)

    def _made(self, values: tuple[Any, ...]) -> Any:
        # what psycopg's row factories read of a cursor: its result's column names
        columns = self.conn.columns

        class Result:
            status = pq.ExecStatus.TUPLES_OK
            nfields = len(columns)

            def fname(self, i: int) -> bytes:
                return columns[i].encode()

        class Cur:
            pgresult = Result()
            _encoding = "utf-8"
        return self.row_factory(Cur())(values) if self.row_factory is not None else values

    async def fetchone(self) -> Any:
        return self._made(self.conn.rows[0]) if self.conn.rows else None

    async def fetchall(self) -> list[Any]:
        return [self._made(r) for r in self.conn.rows]


class _Conn:
    """What a Transaction asks of its connection: cursors, each running one statement."""

    def __init__(self, columns: tuple[str, ...] = (), rows: list[tuple[Any, ...]] | None = None,
                 fails: Exception | None = None):
        self.columns, self.rows, self.fails = columns, rows or [], fails
        self.ran: list[tuple[str, Mapping[str, Any] | None]] = []

    def cursor(self, row_factory: Any = None) -> _Cursor:
        return _Cursor(self, row_factory)


def _tx(conn: _Conn) -> Transaction:
    return Transaction(cast(psycopg.AsyncConnection[Any], conn), REGISTRY)


async def test_a_statements_error_is_raised_as_the_projects_with_the_database_error_as_its_cause() -> None:
    refused = pgerrors.UniqueViolation("duplicate key value violates unique constraint")
    with pytest.raises(errors.Conflict) as caught:
        await _tx(_Conn(fails=refused)).execute("touch_thing")
    assert caught.value.__cause__ is refused


async def test_a_bug_in_a_statement_stays_the_database_error() -> None:
    with pytest.raises(pgerrors.SyntaxError):
        await _tx(_Conn(fails=pgerrors.SyntaxError("syntax error at or near"))).one("get_thing", {"id": 1})


async def test_the_named_text_runs_with_the_given_parameters_and_execute_gives_the_row_count() -> None:
    conn = _Conn(columns=("id",), rows=[(1,), (2,)])
    assert await _tx(conn).execute("touch_thing") == 2
    await _tx(conn).all("get_thing", {"id": 7})
    assert conn.ran == [(REGISTRY["touch_thing"], None), (REGISTRY["get_thing"], {"id": 7})]


async def test_an_unknown_query_name_is_a_key_error_naming_it_and_nothing_runs() -> None:
    conn = _Conn()
    with pytest.raises(KeyError, match="no query named 'get_thnig'"):
        await _tx(conn).one("get_thnig")
    assert conn.ran == []


@dataclasses.dataclass(frozen=True)
class Thing(FromRow):
    id: uuid.UUID
    name: str


@dataclasses.dataclass(frozen=True)
class Plain:
    id: uuid.UUID
    name: str


async def test_rows_are_dicts_or_the_type_asked_for() -> None:
    thing_id = uuid.uuid4()
    conn = _Conn(columns=("id", "name", "extra"), rows=[(thing_id, "a", 1)])
    assert await _tx(conn).one("get_thing", {"id": thing_id}) == {"id": thing_id, "name": "a", "extra": 1}
    # a FromRow type takes the columns its fields name and leaves the others
    assert await _tx(conn).all("get_thing", {"id": thing_id}, into=Thing) == [Thing(thing_id, "a")]
    # any other callable gets every column as a keyword: a column it lacks is an error, not dropped silently
    with pytest.raises(TypeError, match="extra"):
        await _tx(conn).one("get_thing", {"id": thing_id}, into=Plain)


async def test_no_row_is_none() -> None:
    assert await _tx(_Conn(columns=("id",))).one("get_thing", {"id": 1}, into=Thing) is None


def test_a_from_row_subclass_converts_a_column_and_leaves_fields_outside_init_alone() -> None:
    @dataclasses.dataclass(frozen=True)
    class Tagged(FromRow):
        tags: tuple[str, ...]
        shown: str = dataclasses.field(init=False, default="computed")

        @classmethod
        def from_row(cls, row: Mapping[str, Any]) -> Tagged:
            return cls(tags=tuple(row["tags"]))

    assert Tagged.from_row({"tags": ["a", "b"], "shown": "from the row"}) == Tagged(("a", "b"))
    assert Tagged.from_row({"tags": []}).shown == "computed"


def test_a_from_row_class_that_is_no_dataclass_is_a_type_error() -> None:
    class NotAData(FromRow):
        pass

    with pytest.raises(TypeError):
        NotAData.from_row({"id": 1})


async def test_a_unit_of_work_keeps_what_it_emits_in_order_and_gives_it_up_once() -> None:
    unit = Work(cast(psycopg.AsyncConnection[Any], _Conn()), REGISTRY)
    a, b, c = NewEvent("a"), NewEvent("b"), NewEvent("c")
    unit.emit(a)
    unit.emit(b, c)
    assert unit.take() == [a, b, c]
    assert unit.take() == [] and unit.events == []
    await unit.append()  # nothing emitted: nothing appended, no statement run
    assert cast(_Conn, unit.conn).ran == []
