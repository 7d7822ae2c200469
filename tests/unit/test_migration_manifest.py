"""Applied migrations are immutable: each committed migration's bytes match migrations/checksums.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared import migrate, migration_manifest


@pytest.fixture
def copied(tmp_path: Path) -> Path:
    """Two landed migrations and their manifest, as `--add` writes it."""
    target = tmp_path / "migrations"
    target.mkdir()
    (target / "0001_first.sql").write_text("CREATE TABLE first (x int);\n")
    (target / "0002_second.sql").write_text("-- why\nCREATE TABLE second (x int);\n")
    assert migration_manifest.add_missing(target) == ["0001_first.sql", "0002_second.sql"]
    assert migration_manifest.problems(target) == []
    return target


def test_every_migration_in_the_repository_has_its_landed_checksum_in_the_manifest() -> None:
    assert migration_manifest.problems(migrate.migrations_dir()) == []


def test_an_edited_migration_is_named_with_the_fix_add_a_new_migration_instead(copied: Path) -> None:
    second = copied / "0002_second.sql"
    second.write_text(second.read_text() + "\n-- a comment added after it landed\n")

    found = migration_manifest.problems(copied)

    assert len(found) == 1
    assert found[0].startswith("migrations/0002_second.sql differs from the checksum it landed with")
    assert "add a new migration instead" in found[0]
    assert migration_manifest.main(["--dir", str(copied)]) == 1


def test_a_new_migration_without_an_entry_fails_until_add_writes_it_and_add_never_rewrites_an_entry(
        copied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (copied / "0999_new_table.sql").write_text("CREATE TABLE new_table (x int);\n")
    second = copied / "0002_second.sql"
    second.write_text(second.read_text() + "\n-- edited\n")
    before = json.loads((copied / migration_manifest.MANIFEST).read_text())

    assert any("0999_new_table.sql has no entry" in line for line in migration_manifest.problems(copied))
    assert migration_manifest.main(["--dir", str(copied), "--add"]) == 1  # the edited 0002 still fails

    after = json.loads((copied / migration_manifest.MANIFEST).read_text())
    assert after["migrations"]["0999_new_table.sql"] == {
        "sha256": migration_manifest.sha256(copied / "0999_new_table.sql")}
    assert after["migrations"]["0002_second.sql"] == before["migrations"]["0002_second.sql"]
    assert "added 0999_new_table.sql" in capsys.readouterr().out
    second.write_text(second.read_text().removesuffix("\n-- edited\n"))
    assert migration_manifest.main(["--dir", str(copied)]) == 0


def test_a_removed_migration_is_named(copied: Path) -> None:
    (copied / "0001_first.sql").unlink()
    assert [line.split(",")[0] for line in migration_manifest.problems(copied)] == [
        "migrations/checksums.json names 0001_first.sql"]


def test_an_entry_accepts_its_own_checksum_and_its_listed_equivalents_only() -> None:
    entry = migration_manifest.load(migrate.migrations_dir())["0017_gates.sql"]
    [earlier] = entry.equivalent

    assert entry.accepts(entry.sha256)
    assert entry.accepts(earlier["sha256"])
    assert not entry.accepts("0" * 64)
