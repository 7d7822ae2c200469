"""The executor's named queries (the `-- name: verb_noun --` headers of the .sql files here)."""

from shared.sql import load

queries: dict[str, str] = load(__name__)
