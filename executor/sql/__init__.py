"""The executor's named queries (the `-- name: verb_noun --` headers of the .sql files here)."""

from collections.abc import Mapping
from typing import LiteralString

from shared.sql import load

queries: Mapping[str, LiteralString] = load(__name__)
