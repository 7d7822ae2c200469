"""Errors that cross module boundaries, in one tree under `PetalError`. Callers catch these, never psycopg's:
a database error becomes one of them in one place, `shared.query.translate` (the journal's appends go
through it too), and one that translates to nothing is a bug and stays as it is.

    PetalError
    ├── ConfigError, MigrationError
    ├── DatabaseUnavailable                 the database is away (an outage: retried, or 503)
    ├── DatabaseRefused                     refused for its content: Conflict, Missing, Invalid
    └── JournalWriteError                   a batch was not appended (the database stayed away)
        └── JournalRefused                  ... because it was refused (its cause: a DatabaseRefused)
            └── UnknownEventType
"""

from __future__ import annotations


class PetalError(Exception):
    """Base of the project's errors."""


class ConfigError(PetalError):
    """The configuration cannot work as given."""


class MigrationError(PetalError):
    """A migration could not be applied, or an applied one was changed."""


class JournalWriteError(PetalError):
    """A batch could not be appended; nothing of it was written."""


class JournalRefused(JournalWriteError):
    """The database refused the batch's content (retrying the same batch cannot help)."""


class UnknownEventType(JournalRefused):
    """An event names an (event_type, tier) pair that is not registered in event_types."""

    def __init__(self, pairs: list[tuple[str, str]]):
        self.pairs = pairs
        names = ", ".join(f"{t!r} (tier {tier})" for t, tier in pairs)
        super().__init__(
            f"unknown event type {names}: register it with "
            "INSERT INTO event_types (name, tier, description) VALUES (...)"
        )


class DatabaseUnavailable(PetalError):
    """The database is away: refused, cut, or no pooled connection in time. Nothing was written."""


class Contended(PetalError):
    """The database aborted the transaction in favour of a concurrent one (a deadlock, a serialization
    failure): nothing was written, and the same work again is expected to get through. Not an outage."""


class DatabaseRefused(PetalError):
    """The database refused a write for its content; `constraint` names the rule, when there is one."""

    def __init__(self, message: str, *, constraint: str | None = None):
        super().__init__(message)
        self.constraint = constraint


class Conflict(DatabaseRefused):
    """A unique or exclusion constraint: the thing already exists."""


class Missing(DatabaseRefused):
    """A foreign key: the thing referred to does not exist."""


class Invalid(DatabaseRefused):
    """A check, a not-null or a value the column cannot hold."""
