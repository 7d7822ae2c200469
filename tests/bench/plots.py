"""The report's plots, drawn by matplotlib as SVG from what the benchmarks recorded (tests/bench/record.py): a
latency's distribution against its baseline's, a figure per client against the clients, a store's reads against
its baseline. Deterministic output (no date, a fixed hash salt), so a plot changes only when its data does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

plt.rcParams.update({"svg.hashsalt": "petal-dispatch", "svg.fonttype": "none", "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
METADATA = {"Date": None, "Creator": "python -m tests.bench.report"}
# points drawn per distribution: its shape at a glance, a small file
DRAWN = 400


def _save(fig: Any, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, format="svg", metadata=METADATA)
    plt.close(fig)


def distribution(record: dict[str, Any], out: Path) -> None:
    """Each series' empirical distribution (share of samples at or below x), x on a log scale; n in the legend
    (every sample's, though a long series is drawn from evenly spaced ones of its sorted samples)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for label, values in record["series"].items():
        if not values:
            continue
        ordered = sorted(values)
        n = len(ordered)
        count = record.get("counts", {}).get(label, n)
        at = sorted({round(i * (n - 1) / (DRAWN - 1)) for i in range(DRAWN)}) if n > DRAWN else range(n)
        ax.step([ordered[i] for i in at], [(i + 1) / n for i in at], where="post", label=f"{label} (n={count:,})")
    ax.set_xscale("log")
    ax.set_xlabel(f"latency ({record['unit']}, log scale)")
    ax.set_ylabel("share of samples at or below")
    for q in (0.5, 0.99):
        ax.axhline(q, color="grey", linewidth=0.6, linestyle=":")
    ax.set_title(record["figure"], fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    _save(fig, out)


def lines(record: dict[str, Any], out: Path) -> None:
    """A figure against a variable, one line per series (kind "line"), or one bar per name (kind "barh")."""
    if record.get("plot") == "barh":
        _bars(record, out)
        return
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for label, points in record["lines"].items():
        xs, ys = zip(*sorted(points)) if points else ((), ())
        ax.plot(xs, ys, marker="o", label=label)
    if record.get("log_x"):
        ax.set_xscale("log")
    values = [y for points in record["lines"].values() for _, y in points if y > 0]
    if values and max(values) / min(values) > 50:  # series of different scales on one axis: each readable
        ax.set_yscale("log")
    ax.set_xlabel(record["x_label"])
    ax.set_ylabel(record["y_label"])
    ax.set_title(record["title"], fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, out)


def _bars(record: dict[str, Any], out: Path) -> None:
    [(label, points)] = list(record["lines"].items())[:1]
    names = [str(name) for name, _ in points]
    fig, ax = plt.subplots(figsize=(6.4, max(2.0, 0.22 * len(names) + 1)))
    ax.barh(names, [v for _, v in points], label=label)
    ax.invert_yaxis()
    ax.set_xlabel(record["y_label"])
    ax.set_title(record["title"], fontsize=9)
    ax.tick_params(axis="y", labelsize=7)
    _save(fig, out)
