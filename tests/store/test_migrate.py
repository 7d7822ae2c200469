from __future__ import annotations

import shutil
import threading
from pathlib import Path

import psycopg
import pytest
from structlog.testing import capture_logs

from shared import errors, migrate
from tests.pg import DB


def _applied(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [v for (v,) in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]


def test_migrate_applies_every_file_once_and_a_second_run_is_a_no_op(empty_db: DB) -> None:
    files = migrate.discover()
    with capture_logs() as logged:
        first = migrate.migrate(empty_db.admin_dsn)
        second = migrate.migrate(empty_db.admin_dsn)
    # a first start says it in one line at info, not a line a migration
    said = [e for e in logged if e["log_level"] == "info"]
    assert [(e["event"], e["count"], e["versions"]) for e in said] == [
        ("migrations_applied", len(files), f"{files[0].version:04d}-{files[-1].version:04d}")]

    assert [m.version for m in first] == [m.version for m in files]
    assert second == []
    assert _applied(empty_db.admin_dsn) == [m.version for m in files]
    assert migrate.status(empty_db.admin_dsn).current


def test_concurrent_migrate_runs_apply_each_migration_exactly_once(empty_db: DB) -> None:
    results: list[list[int]] = []
    failures: list[BaseException] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        barrier.wait()
        try:
            results.append([m.version for m in migrate.migrate(empty_db.admin_dsn)])
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            failures.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert failures == []
    all_versions = [m.version for m in migrate.discover()]
    assert sorted(v for r in results for v in r) == all_versions
    assert _applied(empty_db.admin_dsn) == all_versions


def _copy_migrations(tmp_path: Path) -> Path:
    target = tmp_path / "migrations"
    shutil.copytree(migrate.migrations_dir(), target)
    return target


def test_a_failing_migration_leaves_nothing_behind_and_is_not_recorded(empty_db: DB, tmp_path: Path) -> None:
    directory = _copy_migrations(tmp_path)
    (directory / "0999_broken.sql").write_text("CREATE TABLE half_done (x int);\nSELECT no_such_function();\n")

    with pytest.raises(errors.MigrationError, match="0999_broken.sql"):
        migrate.migrate(empty_db.admin_dsn, directory)

    with psycopg.connect(empty_db.admin_dsn) as conn:
        assert conn.execute("SELECT to_regclass('half_done')").fetchone() == (None,)
    assert 999 not in _applied(empty_db.admin_dsn)
    assert migrate.status(empty_db.admin_dsn, directory).pending == [999]


def test_a_migration_edited_after_it_was_applied_is_refused(empty_db: DB, tmp_path: Path) -> None:
    directory = _copy_migrations(tmp_path)
    migrate.migrate(empty_db.admin_dsn, directory)
    first = sorted(directory.glob("0001_*.sql"))[0]
    first.write_text(first.read_text() + "\n-- edited\n")

    with pytest.raises(errors.MigrationError, match="changed after it was applied"):
        migrate.migrate(empty_db.admin_dsn, directory)


def test_a_migration_file_with_a_bad_name_is_refused(tmp_path: Path) -> None:
    directory = _copy_migrations(tmp_path)
    (directory / "5_oops.sql").write_text("SELECT 1;")
    with pytest.raises(errors.MigrationError, match="NNNN_name.sql"):
        migrate.discover(directory)
