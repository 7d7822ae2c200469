"""Named queries, loaded once from the .sql files beside this module.

Each query sits under a `-- name: verb_noun --` header and lives in one registry only (a query both
services run is here, in shared/sql); code runs it through `shared.query.Queries(pool, queries)`.
Verbs: `get_` one row, `list_` rows, `count_` a number, `check_` a row only when the thing holds (so
`await q.one("check_…") is not None` is the answer), and what the statement does for writes
(`insert_`, `claim_`, `mark_`, `enqueue_` …).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType
from typing import LiteralString, cast

_HEADER = re.compile(r"^-- name: (\w+)\s*--\s*$", re.MULTILINE)


def load(package: str) -> Mapping[str, LiteralString]:
    """Every named query of the .sql files inside `package`, read-only.

    The text is the project's own (files shipped in the package, never input), so it is typed
    `LiteralString`, as psycopg's `execute` asks: a query built from a value at run time is a type error.
    """
    found: dict[str, LiteralString] = {}
    for entry in resources.files(package).iterdir():
        if not entry.name.endswith(".sql"):
            continue
        parts = _HEADER.split(entry.read_text(encoding="utf-8"))
        for name, body in zip(parts[1::2], parts[2::2]):
            if name in found:
                raise RuntimeError(f"query {name} is defined twice")
            found[name] = cast(LiteralString, body.strip())
    return MappingProxyType(found)


queries: Mapping[str, LiteralString] = load(__name__)
