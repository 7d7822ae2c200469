"""The fast tier: pure functions only, no PostgreSQL, no CLI, no sockets (`pytest tests/unit` runs in seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
# the fixtures that start or need a database (tests/conftest.py)
DATABASE_FIXTURES = {"cluster", "db", "empty_db", "executor_db", "pool"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            used = DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
            if used:
                raise pytest.UsageError(f"{item.nodeid} is in the unit tier but uses {sorted(used)}: "
                                        "move it beside the end-to-end tests")
