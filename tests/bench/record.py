"""What a benchmark reports to `python -m tests.bench.report`: each headline figure (with its baseline, ratio, n
and goal) and the samples behind it, appended as JSON lines to the file named by $PETAL_BENCH_RECORD. Without
that variable nothing is written: a benchmark run by hand prints exactly what it printed before.

Figures go through tests/bench/stats.py: a percentile is the exact nearest-rank sample, None (shown "-") when the
samples cannot support it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.bench import stats

ENV = "PETAL_BENCH_RECORD"
# samples kept per series for a distribution plot: enough for its shape, small enough for a diff
MAX_PLOTTED = 2000


def _bench() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = spec.name if spec is not None else Path(sys.argv[0]).stem
    return str(name).rsplit(".", 1)[-1]


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"bench": _bench(), **record}) + "\n")


def _met(value: float | None, goal: tuple[str, float] | None) -> bool | None:
    if value is None or goal is None:
        return None
    op, limit = goal
    return value <= limit if op == "<=" else value >= limit


def _goal_text(goal: tuple[str, float] | None, unit: str) -> str:
    if goal is None:
        return "printed"
    op, limit = goal
    return f"{'≤' if op == '<=' else '≥'} {limit:g}{unit}"


def _thinned(values: Sequence[float]) -> list[float]:
    """Every k-th sample of the sorted values (the distribution's shape, its extremes kept)."""
    ordered = sorted(values)
    if len(ordered) <= MAX_PLOTTED:
        return ordered
    step = (len(ordered) - 1) / (MAX_PLOTTED - 1)
    return [ordered[round(i * step)] for i in range(MAX_PLOTTED)]


def latency(key: str, figure: str, values: Sequence[float], baseline: Sequence[float], q: float, *,
            baseline_label: str, goal: tuple[str, float] | None, scale: float = 1000.0, unit: str = "ms") -> None:
    """A latency against its same-run baseline at the q-th percentile: the figure, and both sample sets for
    the distribution plot. `goal` bounds the ratio (("<=", 2.5): the figure at most 2.5x its baseline)."""
    value, base = stats.percentile(values, q), stats.percentile(baseline, q)
    ratio = stats.ratio(values, baseline, q)
    _write({"kind": "figure", "key": key, "figure": figure, "stat": f"p{q:g}",
            "value": None if value is None else value * scale, "unit": unit, "n": len(values),
            "baseline": None if base is None else base * scale, "baseline_label": baseline_label,
            "baseline_n": len(baseline), "ratio": ratio, "goal": _goal_text(goal, "×"), "met": _met(ratio, goal)})
    _write({"kind": "samples", "key": key, "figure": figure, "unit": unit,
            "series": {figure: [v * scale for v in _thinned(values)],
                       baseline_label: [v * scale for v in _thinned(baseline)]},
            "counts": {figure: len(values), baseline_label: len(baseline)}})


def value(key: str, figure: str, amount: float | None, unit: str, *, n: int | None = None, stat: str = "",
          baseline: float | None = None, baseline_label: str = "", baseline_n: int | None = None,
          ratio: float | None = None, goal: tuple[str, float] | None = None, goal_on: str = "ratio") -> None:
    """Any other figure: a rate, a memory figure, a paired difference. `goal` bounds `ratio` (goal_on="ratio")
    or the figure itself (goal_on="value")."""
    checked = ratio if goal_on == "ratio" else amount
    _write({"kind": "figure", "key": key, "figure": figure, "stat": stat, "value": amount, "unit": unit, "n": n,
            "baseline": baseline, "baseline_label": baseline_label, "baseline_n": baseline_n, "ratio": ratio,
            "goal": _goal_text(goal, "×" if goal_on == "ratio" else f" {unit}"), "met": _met(checked, goal)})


def series(key: str, title: str, x_label: str, y_label: str, lines: dict[str, list[tuple[Any, float]]], *,
           kind: str = "line", log_x: bool = False) -> None:
    """Points for a plot other than a distribution: fan-out per client (kind "line", x numbers), a store's reads
    against its baseline (kind "barh", x the names of the bars)."""
    _write({"kind": "series", "key": key, "title": title, "x_label": x_label, "y_label": y_label,
            "lines": lines, "plot": kind, "log_x": log_x})


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
