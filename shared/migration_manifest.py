"""migrations/checksums.json: each migration's sha256 as it landed, and the earlier bytes known to be equivalent.

A database records the sha256 of every migration it applied, and refuses code whose file differs: so a landed
migration is never edited. The manifest makes such an edit fail CI (`python -m shared.migration_manifest`), not a
user's upgrade. An edit that did land and changed only comments or whitespace is listed under its migration's
`equivalent`: a database that applied those bytes has the same schema, and `migrate` accepts it.

    python -m shared.migration_manifest          check: every migration has an entry and its bytes match it
    python -m shared.migration_manifest --add    write the entry of each migration that has none
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "checksums.json"
_MIGRATION = re.compile(r"^\d{4}_[a-z0-9_]+\.sql$")
ABOUT = ("Each migration's sha256 as it landed: a landed migration is never edited (add a new one instead). "
         "'equivalent': earlier bytes of it that shipped and differ only in comments or whitespace; a database "
         "that applied them is accepted. CONTRIBUTING.md says how to add an entry.")


@dataclass(frozen=True, slots=True)
class Entry:
    sha256: str
    # earlier shipped sha256s of the same migration, each with where it shipped and why it is equivalent
    equivalent: tuple[dict[str, str], ...] = ()

    def accepts(self, applied: str) -> bool:
        return applied == self.sha256 or any(e["sha256"] == applied for e in self.equivalent)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def migration_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if _MIGRATION.match(p.name))


def load(directory: Path) -> dict[str, Entry]:
    """The manifest's entries by file name; none when the directory has no manifest."""
    path = directory / MANIFEST
    if not path.exists():
        return {}
    raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))["migrations"]
    return {name: Entry(e["sha256"], tuple(e.get("equivalent", ()))) for name, e in raw.items()}


def problems(directory: Path) -> list[str]:
    """What differs between the migration files and the manifest, one line each (none: all is well)."""
    entries = load(directory)
    found: list[str] = []
    files = migration_files(directory)
    for path in files:
        entry = entries.get(path.name)
        if entry is None:
            found.append(f"migrations/{path.name} has no entry in migrations/{MANIFEST}: "
                         "run `python -m shared.migration_manifest --add`")
        elif (actual := sha256(path)) != entry.sha256:
            found.append(f"migrations/{path.name} differs from the checksum it landed with (sha256 {actual[:12]}, "
                         f"the manifest has {entry.sha256[:12]}): databases that applied it would refuse this "
                         "code; restore the file and add a new migration instead")
    names = {p.name for p in files}
    for name in sorted(set(entries) - names):
        found.append(f"migrations/{MANIFEST} names {name}, which is gone: databases that applied it would refuse "
                     "this code; restore it (a migration is never removed; add a new migration instead)")
    return found


def add_missing(directory: Path) -> list[str]:
    """Write an entry for each migration that has none (an existing entry is never changed); returns their names."""
    path = directory / MANIFEST
    raw: dict[str, Any] = (json.loads(path.read_text(encoding="utf-8")) if path.exists()
                           else {"about": ABOUT, "migrations": {}})
    added = [p.name for p in migration_files(directory) if p.name not in raw["migrations"]]
    for name in added:
        raw["migrations"][name] = {"sha256": sha256(directory / name)}
    if added:
        raw["migrations"] = dict(sorted(raw["migrations"].items()))
        path.write_text(json.dumps(raw, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return added


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.migration_manifest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--add", action="store_true", help="write the entry of each migration that has none")
    parser.add_argument("--dir", type=Path, help="the migrations directory (default: this checkout's migrations/)")
    args = parser.parse_args(argv)
    directory = args.dir or Path(__file__).resolve().parent.parent / "migrations"
    if args.add:
        for name in add_missing(directory):
            print(f"added {name}")
    if found := problems(directory):
        for line in found:
            print(f"error: {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
