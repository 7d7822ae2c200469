"""A fake query layer for unit tests: named queries answered from a script, keyed by query name.

    unit = FakeWork({"get_project_workdir": {"workdir": "/srv/repo"}, "insert_task": {"id": task_id}})
    await dispatch.request_task(unit, request)
    assert unit.names() == ["get_project_workdir", "insert_task"]

It fails loudly, naming the query: a name the script does not answer, a scripted name the real registry
does not have (a typo would otherwise pass), and a call whose parameters leave out a `%(name)s` of the
real query's text (psycopg would refuse it). Each call is kept (`calls`), and what the code emits too
(`events`: the unit of work's records), so a test asserts what was run and what would be journaled.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import psycopg

from executor.sql import queries as executor_queries
from shared.query import FromRow, Registry
from shared.work import Work

# What a scripted name answers: `one` a row (or None), `all` a list of rows, `execute` a row count; or a
# function of the call's parameters that returns one of those.
Answer = Any | Callable[[Mapping[str, Any]], Any]


class UnknownQuery(AssertionError):
    """A query the fake was not told how to answer, or that the registry does not have."""


@dataclass(frozen=True)
class Call:
    name: str
    params: Mapping[str, Any]


class FakeWork(Work):
    """A unit of work over no database: `execute`, `one` and `all` answer from `answers`."""

    def __init__(self, answers: Mapping[str, Answer], registry: Registry = executor_queries):
        super().__init__(cast(psycopg.AsyncConnection[Any], None), registry)
        unknown = sorted(set(answers) - set(registry))
        if unknown:
            raise UnknownQuery(f"scripted queries not in the registry: {', '.join(unknown)}")
        self.answers = dict(answers)
        self.calls: list[Call] = []

    def _answer(self, name: str, params: Mapping[str, Any] | None) -> Any:
        if name not in self.answers:
            raise UnknownQuery(f"query {name!r} was run but the test gave no answer for it "
                               f"(answered: {', '.join(sorted(self.answers)) or 'none'})")
        given = dict(params or {})
        missing = sorted(set(_placeholders(self.sql(name))) - set(given))
        if missing:
            raise UnknownQuery(f"query {name!r} was run without its parameters {', '.join(missing)}")
        self.calls.append(Call(name, given))
        answer = self.answers[name]
        return answer(given) if callable(answer) else answer

    def names(self) -> list[str]:
        """The queries run, in order."""
        return [c.name for c in self.calls]

    def params(self, name: str) -> Mapping[str, Any]:
        """The parameters of the one call of `name`."""
        found = [c.params for c in self.calls if c.name == name]
        if len(found) != 1:
            raise AssertionError(f"query {name!r} was run {len(found)} times, not once")
        return found[0]

    async def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        return int(self._answer(name, params) or 0)

    async def one(self, name: str, params: Mapping[str, Any] | None = None, *,
                  into: Callable[..., Any] | None = None) -> Any:
        row = self._answer(name, params)
        return _made(into, row) if row is not None else None

    async def all(self, name: str, params: Mapping[str, Any] | None = None, *,
                  into: Callable[..., Any] | None = None) -> list[Any]:
        rows = list(self._answer(name, params) or [])
        return [_made(into, r) for r in rows]

    async def append(self) -> None:
        raise AssertionError("a fake unit of work journals nothing: read `events`")


def _made(into: Callable[..., Any] | None, row: Mapping[str, Any]) -> Any:
    """A row as the real layer gives it: a dict, `into.from_row(row)` or `into(**row)`."""
    if into is None:
        return dict(row)
    if isinstance(into, type) and issubclass(into, FromRow):
        return into.from_row(row)
    return into(**row)


def _placeholders(sql: str) -> list[str]:
    return re.findall(r"%\((\w+)\)s", sql)
