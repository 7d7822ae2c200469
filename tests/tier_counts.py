"""The test functions defined in each tier (tests/<tier>/), and whether the unit tier holds its share.

    python -m tests.tier_counts [--min-unit PERCENT]

A function counts once however it is parametrised: what is counted is what someone wrote, `def test_*` and
`async def test_*` at any depth of a test module (a method of a test class too). Exits 1 when the unit tier is
under its share of the total (45% by default): the fast tier is where a change is first checked, so it should
hold most of what can be checked without a database, the CLI or a browser.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

TIERS = ("unit", "store", "e2e", "web", "fault", "shipped")
MIN_UNIT_PERCENT = 45.0
HERE = Path(__file__).resolve().parent


def count_tests(source: str) -> int:
    """The `def test_*` / `async def test_*` in one module's source."""
    return sum(1 for node in ast.walk(ast.parse(source))
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"))


def tier_counts(root: Path = HERE) -> dict[str, int]:
    """Each tier's count of test functions, over its test_*.py and *_test.py files."""
    counts = {}
    for tier in TIERS:
        files = [p for p in sorted((root / tier).rglob("*.py"))
                 if p.name.startswith("test_") or p.name.endswith("_test.py")]
        counts[tier] = sum(count_tests(p.read_text(encoding="utf-8")) for p in files)
    return counts


def report(counts: dict[str, int]) -> tuple[str, float]:
    """The line printed, and the unit tier's share in percent."""
    total = sum(counts.values()) or 1
    share = {tier: 100.0 * n / total for tier, n in counts.items()}
    shown = ", ".join(f"{tier} {n} ({share[tier]:.0f}%)" for tier, n in counts.items())
    return f"test functions by tier: {shown}; total {sum(counts.values())}", share.get("unit", 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the test functions defined in each tier")
    parser.add_argument("--min-unit", type=float, default=MIN_UNIT_PERCENT, help="the unit tier's least share, in %%")
    args = parser.parse_args(argv)
    line, unit = report(tier_counts())
    print(line)
    if unit < args.min_unit:
        print(f"error: the unit tier is {unit:.1f}% of the test functions, under {args.min_unit:g}%: "
              "test the logic without a database, the CLI or a browser where it can be (tests/unit)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
