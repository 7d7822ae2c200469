"""Named queries, loaded once from the .sql files beside this module.

Each query sits under a `-- name: verb_noun --` header; code says `queries["verb_noun"]`.
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
