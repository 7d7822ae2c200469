"""Errors that cross module boundaries. Callers catch these, never psycopg's."""

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
