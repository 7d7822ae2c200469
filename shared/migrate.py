"""Numbered .sql migrations: each pending file once, in its own transaction, under an advisory lock."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

from shared import errors, failover, logs, migration_manifest
from shared.sql import queries

log = logs.get(__name__)

_FILENAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @property
    def checksum(self) -> str:
        return migration_manifest.sha256(self.path)


def migrations_dir() -> Path:
    """The repository's migrations/, or the copy packaged inside `shared` by a wheel build."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "migrations", here / "_migrations"):
        if candidate.is_dir():
            return candidate
    raise errors.MigrationError(f"no migrations directory next to {here}")


def discover(directory: Path | None = None) -> list[Migration]:
    directory = directory or migrations_dir()
    found = []
    for path in sorted(directory.iterdir()):
        m = _FILENAME.match(path.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), path))
        elif path.suffix == ".sql":
            raise errors.MigrationError(f"{path.name}: migration files are named NNNN_name.sql")
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise errors.MigrationError("two migration files share a version number")
    return found


@dataclass(frozen=True, slots=True)
class MigrationStatus:
    applied: list[int]
    pending: list[int]

    @property
    def current(self) -> bool:
        return not self.pending


def _check_applied(applied: dict[int, tuple[str, str]], available: list[Migration],
                   manifest: dict[str, migration_manifest.Entry]) -> list[tuple[Migration, str]]:
    """Refuse a database that applied a migration this code lacks or has changed; returns the applied
    migrations whose recorded checksum is an earlier equivalent of the file's (see migrations/checksums.json)."""
    by_version = {m.version: m for m in available}
    equivalent: list[tuple[Migration, str]] = []
    for version, (name, checksum) in applied.items():
        mig = by_version.get(version)
        if mig is None:
            raise errors.MigrationError(f"database has migration {version:04d}_{name}, which this code lacks")
        if mig.checksum == checksum:
            continue
        entry = manifest.get(mig.path.name)
        # equivalents were declared against the manifest's bytes: a file that differs from those has none
        if entry is not None and entry.sha256 == mig.checksum and entry.accepts(checksum):
            equivalent.append((mig, checksum))
            continue
        as_applied = "" if name == mig.name else f" (applied as {version:04d}_{name}.sql)"
        raise errors.MigrationError(
            f"migration {mig.path.name} changed after it was applied{as_applied}: the database has sha256 "
            f"{checksum[:12]}, this code {mig.checksum[:12]}, not a known equivalent ({migration_manifest.MANIFEST}); "
            "run the release that made this database, or restore it from a backup")
    return equivalent


def status(dsn: str, directory: Path | None = None) -> MigrationStatus:
    """What is applied and pending (read-only: an equivalent checksum is accepted, and recorded by `migrate`)."""
    directory = directory or migrations_dir()
    available = discover(directory)
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute(queries["check_migrations_table_exists"]).fetchone()
        rows = conn.execute(queries["list_applied_migrations"]).fetchall() if exists and exists[0] else []
    applied = {v: (n, c) for v, n, c in rows}
    _check_applied(applied, available, migration_manifest.load(directory))
    return MigrationStatus(
        applied=sorted(applied), pending=[m.version for m in available if m.version not in applied]
    )


def require_current(dsn: str) -> None:
    """Refuse to run a service on a schema that is behind the code."""
    state = status(dsn)
    if not state.current:
        pending = ", ".join(f"{v:04d}" for v in state.pending)
        raise errors.MigrationError(f"migrations pending ({pending}): run `petal-dispatch migrate` first")


def migrate(dsn: str, directory: Path | None = None) -> list[Migration]:
    """Apply pending migrations; returns what was applied (empty when already current).

    An applied migration recorded with an earlier equivalent checksum gets the current one recorded, so later
    starts (and `db status`) see the file's own.
    """
    directory = directory or migrations_dir()
    available = discover(directory)
    done: list[Migration] = []
    # a multi-host DSN: the primary, never a standby listed first
    with psycopg.connect(failover.primary_dsn(dsn), autocommit=True) as conn:
        conn.execute(queries["lock_migrations"])
        try:
            conn.execute(queries["create_migrations_table"])
            applied = {v: (n, c) for v, n, c in conn.execute(queries["list_applied_migrations"]).fetchall()}
            for mig, earlier in _check_applied(applied, available, migration_manifest.load(directory)):
                conn.execute(queries["update_migration_checksum"],
                             {"version": mig.version, "earlier": earlier, "checksum": mig.checksum})
                log.info("migration_checksum_updated", version=mig.version, name=mig.name, earlier=earlier,
                         checksum=mig.checksum)
            for mig in available:
                if mig.version in applied:
                    continue
                try:
                    with conn.transaction():
                        conn.execute(mig.sql.encode())
                        conn.execute(
                            queries["record_migration"],
                            {"version": mig.version, "name": mig.name, "checksum": mig.checksum},
                        )
                except psycopg.Error as exc:
                    raise errors.MigrationError(f"{mig.path.name}: {exc}") from exc
                log.debug("migration_applied", version=mig.version, name=mig.name)
                done.append(mig)
        finally:
            conn.execute(queries["unlock_migrations"])
    if done:  # one line: a first start applies them all (48 lines of it were most of what `up` printed)
        log.info("migrations_applied", count=len(done), versions=f"{done[0].version:04d}-{done[-1].version:04d}",
                 **({"names": [m.name for m in done]} if len(done) <= 5 else {}))
    return done
