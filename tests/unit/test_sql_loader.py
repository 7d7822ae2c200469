"""The named-query loader (shared/sql/__init__.py) over packages made for the test: each `-- name: verb_noun --`
header starts a query, a name is defined once, and the registry cannot be changed by the code that reads it."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.sql import load

pytestmark = pytest.mark.unit


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An importable package of .sql files, named for this test alone."""
    name = f"sqlpkg_{tmp_path.name.replace('-', '_')}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield root
    sys.modules.pop(name, None)


def test_each_header_starts_a_query_whose_text_runs_to_the_next(package: Path) -> None:
    (package / "things.sql").write_text(
        "-- what this file is for: a comment before the first header belongs to no query\n\n"
        "-- name: get_thing --\n-- why it reads what it reads\nSELECT *\nFROM things\nWHERE id = %(id)s\n\n"
        "-- name: list_things --   \nSELECT * FROM things\n")
    found = load(package.name)
    assert set(found) == {"get_thing", "list_things"}
    assert found["get_thing"] == "-- why it reads what it reads\nSELECT *\nFROM things\nWHERE id = %(id)s"
    assert found["list_things"] == "SELECT * FROM things"  # spaces after the header's closing dashes too


def test_queries_of_every_sql_file_are_loaded_and_other_files_are_not(package: Path) -> None:
    (package / "a.sql").write_text("-- name: get_a --\nSELECT 1\n")
    (package / "b.sql").write_text("-- name: get_b --\nSELECT 2\n")
    (package / "notes.txt").write_text("-- name: get_c --\nSELECT 3\n")
    assert dict(load(package.name)) == {"get_a": "SELECT 1", "get_b": "SELECT 2"}


def test_a_name_defined_twice_is_refused_naming_it(package: Path) -> None:
    (package / "a.sql").write_text("-- name: get_a --\nSELECT 1\n")
    (package / "b.sql").write_text("-- name: get_a --\nSELECT 2\n")
    with pytest.raises(RuntimeError, match="query get_a is defined twice"):
        load(package.name)


def test_a_header_must_be_a_line_of_its_own(package: Path) -> None:
    (package / "a.sql").write_text("-- name: get_a --\nSELECT 1 -- name: get_b --\n  -- name: get_c --\n")
    assert list(load(package.name)) == ["get_a"]


def test_the_registry_is_read_only(package: Path) -> None:
    (package / "a.sql").write_text("-- name: get_a --\nSELECT 1\n")
    found = load(package.name)
    with pytest.raises(TypeError):
        found["get_a"] = "DROP TABLE things"  # type: ignore[index]  # the point: no writes


def test_the_shipped_registries_hold_no_empty_query() -> None:
    for name in ("shared.sql", "executor.sql", "ingress.sql"):
        assert [q for q, text in load(name).items() if not text.strip()] == [], name
