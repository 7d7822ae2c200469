"""Size and complexity: every module of the packages at most MAX_LINES lines, no function or method graded worse
than WORST_RANK by radon (cyclomatic complexity: D is 21 and up). A module or function past either is named,
with its size or grade, and the check fails; the few that may pass are listed, each with its reason, in
pyproject.toml's [tool.petal-sizes.exceptions] ("path" for a module's lines, "path:Class.method" for a function).
An exception that excuses nothing (its module or function is within the limits now, or gone) fails the check too:
the list holds only what still needs it.

    .venv/bin/python .ci/sizes.py            # from the checkout's root, as .ci/run does
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from radon.complexity import cc_rank, cc_visit

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("executor", "ingress", "shared", "petal_dispatch")
MAX_LINES = 400
WORST_RANK = "C"


def functions(blocks: list[Any]) -> Iterator[Any]:
    """Every function and method radon graded (a class's methods, an inner class's too)."""
    for block in blocks:
        if hasattr(block, "methods"):
            yield from block.methods
            yield from functions(block.inner_classes)
        else:
            yield block


def findings(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """What passes a limit: its key (a module's path, or path:function) -> what is wrong."""
    found: dict[str, str] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            text = path.read_text(encoding="utf-8")
            lines = len(text.splitlines())
            if lines > MAX_LINES:
                found[name] = f"{lines} lines (at most {MAX_LINES})"
            for f in functions(cc_visit(text)):
                rank = cc_rank(f.complexity)
                if rank > WORST_RANK:
                    found[f"{name}:{f.fullname}"] = f"radon {rank} ({f.complexity}; at most {WORST_RANK}), line {f.lineno}"
    return found


def exceptions(pyproject: Path) -> dict[str, str]:
    table = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {}).get("petal-sizes", {})
    listed: dict[str, str] = table.get("exceptions", {})
    return listed


def report(found: Mapping[str, str], allowed: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(the failures, one line each; the exceptions that excuse nothing, which fail too)."""
    failures = [f"{key}: {what}" for key, what in found.items() if key not in allowed]
    stale = [key for key in allowed if key not in found]
    return failures, stale


def main(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> int:
    """Print what fails, to stderr; 1 when anything does (a module or function over the limits, or a stale
    exception), else 0."""
    failures, stale = report(findings(root, packages), exceptions(root / "pyproject.toml"))
    for key in stale:
        print(f"sizes: {key} is within the limits now (or gone): remove its exception from pyproject.toml", file=sys.stderr)
    for line in failures:
        print(f"sizes: {line}", file=sys.stderr)
    if failures:
        print(f"sizes: {len(failures)} over the limits: split the module or the function (CONTRIBUTING.md), or list "
              "it with its reason in pyproject.toml [tool.petal-sizes.exceptions]", file=sys.stderr)
    return 1 if failures or stale else 0


if __name__ == "__main__":
    sys.exit(main())
