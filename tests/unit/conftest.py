"""Pure tests: no database, no CLI. `pytest tests/unit` must never start PostgreSQL."""

from __future__ import annotations

import pytest

_DATABASE_FIXTURES = {"cluster", "db", "empty_db", "executor_db", "pool"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = _DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
        if used and "tests/unit/" in str(item.path):
            raise pytest.UsageError(f"{item.nodeid} uses {sorted(used)}: unit tests stay off the database")
