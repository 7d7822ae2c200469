"""A database that applied a migration's earlier bytes listed as equivalent in migrations/checksums.json is
accepted, and its recorded checksum brought up to the file's; any other difference is still refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import psycopg
import pytest

from shared import errors, migrate, migration_manifest
from tests.pg import DB

# 0017_gates.sql as released in 0.1.0: one comment named the module by its path before the executor's rooms
CURRENT_COMMENT = "executor/gates/classify.py rule_covers"
RELEASED_COMMENT = "executor/gates.py rule_covers"


def _recorded(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT version, checksum FROM schema_migrations").fetchall())


def _copy(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(migrate.migrations_dir(), target)
    return target


@pytest.fixture
def released(tmp_path: Path) -> Path:
    """The migrations with 0017 as 0.1.0 shipped it (rebuilt from today's file, checked against the manifest)."""
    directory = _copy(tmp_path, "released")
    gates = directory / "0017_gates.sql"
    gates.write_bytes(gates.read_bytes().replace(CURRENT_COMMENT.encode(), RELEASED_COMMENT.encode()))
    entry = migration_manifest.load(migrate.migrations_dir())["0017_gates.sql"]
    assert [e["sha256"] for e in entry.equivalent] == [migration_manifest.sha256(gates)]
    return directory


def test_a_database_migrated_by_the_release_before_the_comment_edit_is_accepted_and_brought_current(
        empty_db: DB, released: Path) -> None:
    migrate.migrate(empty_db.admin_dsn, released)
    earlier = migration_manifest.sha256(released / "0017_gates.sql")
    assert _recorded(empty_db.admin_dsn)[17] == earlier

    assert migrate.status(empty_db.admin_dsn).current  # read-only: accepted, nothing written
    assert _recorded(empty_db.admin_dsn)[17] == earlier
    assert migrate.migrate(empty_db.admin_dsn) == []
    after = _recorded(empty_db.admin_dsn)
    assert migrate.migrate(empty_db.admin_dsn) == []

    current = migrate.migrations_dir()
    assert after == {m.version: m.checksum for m in migrate.discover(current)}
    assert _recorded(empty_db.admin_dsn) == after


def test_without_the_manifest_s_equivalent_the_same_database_is_refused(
        empty_db: DB, released: Path, tmp_path: Path) -> None:
    migrate.migrate(empty_db.admin_dsn, released)
    before = _recorded(empty_db.admin_dsn)
    stripped = _copy(tmp_path, "stripped")
    manifest = json.loads((stripped / migration_manifest.MANIFEST).read_text())
    del manifest["migrations"]["0017_gates.sql"]["equivalent"]
    (stripped / migration_manifest.MANIFEST).write_text(json.dumps(manifest))

    with pytest.raises(errors.MigrationError, match="migration 0017_gates.sql changed after it was applied"):
        migrate.migrate(empty_db.admin_dsn, stripped)
    with pytest.raises(errors.MigrationError, match="changed after it was applied"):
        migrate.status(empty_db.admin_dsn, stripped)
    assert _recorded(empty_db.admin_dsn) == before


def test_a_truly_changed_migration_is_still_refused_naming_both_checksums(
        empty_db: DB, released: Path) -> None:
    gates = released / "0017_gates.sql"
    gates.write_text(gates.read_text() + "\nCREATE TABLE gate_extra (x int);\n")
    migrate.migrate(empty_db.admin_dsn, released)
    applied = migration_manifest.sha256(gates)

    with pytest.raises(errors.MigrationError) as refused:
        migrate.migrate(empty_db.admin_dsn)
    assert str(refused.value).startswith("migration 0017_gates.sql changed after it was applied: the database has "
                                         f"sha256 {applied[:12]}, this code ")
    assert _recorded(empty_db.admin_dsn)[17] == applied


def test_a_file_edited_away_from_its_manifest_entry_gets_no_equivalents(
        empty_db: DB, released: Path, tmp_path: Path) -> None:
    # the equivalents were declared against the manifest's bytes, not against whatever the file holds now
    migrate.migrate(empty_db.admin_dsn, released)
    edited = _copy(tmp_path, "edited")
    gates = edited / "0017_gates.sql"
    gates.write_text(gates.read_text() + "\n-- edited after it landed\n")

    with pytest.raises(errors.MigrationError, match="changed after it was applied"):
        migrate.migrate(empty_db.admin_dsn, edited)
