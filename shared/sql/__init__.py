"""Named queries, loaded once from the .sql files beside this module.

Each query sits under a `-- name: verb_noun --` header and lives in one registry only (a query both
services run is here, in shared/sql); code runs it through `shared.query.Queries(pool, queries)`.
Verbs: `get_` one row, `list_` rows, `count_` a number, `check_` a row only when the thing holds (so
`await q.one("check_…") is not None` is the answer), and what the statement does for writes
(`insert_`, `claim_`, `mark_`, `enqueue_` …).
"""

from __future__ import annotations

import re
from importlib import resources

_HEADER = re.compile(r"^-- name: (\w+)\s*--\s*$", re.MULTILINE)


def load(package: str) -> dict[str, str]:
    """Every named query of the .sql files inside `package`."""
    found: dict[str, str] = {}
    for entry in resources.files(package).iterdir():
        if not entry.name.endswith(".sql"):
            continue
        parts = _HEADER.split(entry.read_text(encoding="utf-8"))
        for name, body in zip(parts[1::2], parts[2::2]):
            if name in found:
                raise RuntimeError(f"query {name} is defined twice")
            found[name] = body.strip()
    return found


queries: dict[str, str] = load(__name__)
