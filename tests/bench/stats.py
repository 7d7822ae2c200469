"""Honest figures for the benchmarks: exact order statistics with their sample counts.

A percentile is the nearest-rank value of the samples (the smallest sample with at least q% of the
samples at or below it), so it is always a value that was observed and never past the maximum. A
percentile is printed only from enough samples to mean something: at least ten samples beyond it
(p50 from 20, p90 from 100, p99 from 1,000); otherwise the line says how many were missing.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass


def min_samples(q: float) -> int:
    """The fewest samples that put ten beyond the q-th percentile: p50 20, p90 100, p99 1,000."""
    return math.ceil(round(10 / (1 - q / 100), 6))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The exact nearest-rank q-th percentile, or None when there are too few samples for it."""
    if not 0 < q < 100:
        raise ValueError(f"percentile {q} is outside (0, 100)")
    if len(values) < min_samples(q):
        return None
    ordered = sorted(values)
    return ordered[math.ceil(q / 100 * len(ordered)) - 1]


def fmt_pct(values: Sequence[float], q: float, *, scale: float = 1000.0, unit: str = "ms", digits: int = 2) -> str:
    """`p99 12.34 ms (n=1200)`, or `p99 - (n=40 < 1000)` when the samples cannot support it."""
    label = f"p{q:g}"
    value = percentile(values, q)
    if value is None:
        return f"{label} - (n={len(values)} < {min_samples(q)})"
    return f"{label} {value * scale:.{digits}f} {unit} (n={len(values)})"


def summary(values: Sequence[float], qs: Sequence[float] = (50, 99), **kw: object) -> str:
    # fmt_pct's keyword options, passed through
    return "  ".join(fmt_pct(values, q, **kw) for q in qs)  # type: ignore[arg-type]


def ratio(num: Sequence[float], den: Sequence[float], q: float) -> float | None:
    """Ratio of the q-th percentiles of two sample sets; None when either cannot support it."""
    a, b = percentile(num, q), percentile(den, q)
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt_ratio(value: float | None, goal: str) -> str:
    return f"{value:.2f}x  ({goal})" if value is not None else f"-  (too few samples; {goal})"


def median(values: Sequence[float]) -> float:
    """The lower median of a handful of trial figures (an observed value, any n >= 1)."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


@dataclass(frozen=True)
class Load:
    """How busy the machine was while a benchmark ran: its figures are only as good as this."""

    loadavg_1m: float
    cpus: int

    def __str__(self) -> str:
        return f"load average {self.loadavg_1m:.2f} on {self.cpus} CPUs"


def machine_load() -> Load:
    return Load(os.getloadavg()[0], os.cpu_count() or 1)


def _run_queue_wait_s() -> float:
    """Seconds this thread spent runnable but waiting for a CPU (Linux schedstat; 0 where unavailable)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class CpuClock:
    """This process's CPU time against wall time, and the time it waited for a CPU: a load generator had
    headroom only if it neither used most of a core nor sat in the run queue (a starved generator
    uses little CPU and still cannot keep up)."""

    def __init__(self) -> None:
        self.wall0 = time.monotonic()
        self.cpu0 = self._cpu()
        self.wait0 = _run_queue_wait_s()

    @staticmethod
    def _cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def _wall(self) -> float:
        return max(time.monotonic() - self.wall0, 1e-9)

    def busy(self) -> float:
        """Fraction of one CPU used since the clock started (1.0 = a full core)."""
        return (self._cpu() - self.cpu0) / self._wall()

    def starved(self) -> float:
        """Fraction of the wall time spent runnable but waiting for a CPU."""
        return (_run_queue_wait_s() - self.wait0) / self._wall()
