"""The named-query registries: a query lives in one registry only, under a `verb_noun` name."""

from __future__ import annotations

import re
from importlib import resources

from shared.sql import load

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
