"""The named-query registries: a query lives in one registry only, under a `verb_noun` name."""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path

from shared.sql import load

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("executor.sql", "ingress.sql", "shared.sql")
VERBS = {"get", "list", "count", "check", "read", "find", "insert", "create", "update", "upsert", "delete", "set",
         "mark", "claim", "requeue", "finish", "enqueue", "take", "fail", "answer", "resolve", "cancel", "stop",
         "restore", "record", "store", "offer", "advance", "init", "try", "lock", "unlock", "register", "append",
         "copy", "revoke", "grant", "pin", "touch", "crash", "close", "await", "release", "apply", "join", "renew",
         "leave", "reap", "end"}
_HEADER = re.compile(r"^-- name: (\w+)\s*--\s*$", re.MULTILINE)


def _body(sql: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"--[^\n]*", "", sql)).strip().lower()


def test_a_query_name_is_defined_in_one_registry_only() -> None:
    owners: dict[str, list[str]] = {}
    for package in PACKAGES:
        for name in load(package):
            owners.setdefault(name, []).append(package)
    assert {name: where for name, where in owners.items() if len(where) > 1} == {}


def test_the_same_statement_is_not_kept_under_two_names() -> None:
    bodies: dict[str, set[str]] = {}
    for package in PACKAGES:
        for name, sql in load(package).items():
            bodies.setdefault(_body(sql), set()).add(f"{package}:{name}")
    twice = [frozenset(names) for names in bodies.values() if len(names) > 1]
    assert twice == []


def test_query_names_start_with_a_verb() -> None:
    bad = []
    for package in PACKAGES:
        for entry in resources.files(package).iterdir():
            if entry.name.endswith(".sql"):
                bad += [f"{package}/{entry.name}: {name}" for name in _HEADER.findall(entry.read_text())
                        if ("_" not in name or name.split("_", 1)[0] not in VERBS)]
    assert bad == []


def _stores() -> list[str]:
    """The modules the import contract lets import executor.sql (pyproject.toml), as paths."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (protected,) = [c for c in contracts if c["type"] == "protected" and c["protected_modules"] == ["executor.sql"]]
    return [m.replace(".", "/") + ".py" for m in protected["allowed_importers"]]


def test_each_executor_query_file_is_named_by_one_store_and_its_every_query_by_it() -> None:
    """One owner per table family: a query of executor/sql/x.sql is named (as a string) by x's store alone, and
    a query no module names is not kept."""
    modules = {p.relative_to(ROOT).as_posix(): p.read_text() for p in (ROOT / "executor").rglob("*.py")}
    stores = _stores()
    for sql in sorted((ROOT / "executor" / "sql").glob("*.sql")):
        names = _HEADER.findall(sql.read_text())
        naming = {path: [n for n in names if re.search(rf"[\"']{n}[\"']", text)] for path, text in modules.items()}
        owners = sorted(path for path, named in naming.items() if named)
        assert len(owners) == 1 and owners[0] in stores, f"{sql.name} is named by {owners}"
        assert sorted(naming[owners[0]]) == sorted(names), f"{sql.name}: unnamed {set(names) - set(naming[owners[0]])}"
