"""The CPU each test costs, everything it starts included (PostgreSQL's backends, the CLI, services, the browser).

CI's time on a small machine is bounded by CPU, not by waiting: with every core busy, a faster suite needs less
work, and this says where the work is. Each pytest process (an xdist worker, or a run without xdist) moves itself
into a cgroup v1 `cpuacct` group of its own, which everything it starts inherits; a test's cost is that group's
usage across it (its setup and teardown included), carried to the controller in the report's user_properties and
summed by tier (tests/conftest.py TierClock). Where no such group can be made (no cgroup v1 cpuacct hierarchy, not
root), nothing is measured and only wall times are printed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
PROPERTY = "cpu_s"


class CpuClock:
    """This process's cpuacct group, made at configure time and removed at the end (when it has emptied)."""

    def __init__(self, group: Path):
        self.group = group

    @classmethod
    def make(cls) -> CpuClock | None:
        for old in CPUACCT.glob("petal-tests-*"):  # an earlier run's, left while something of it still ran
            with contextlib.suppress(OSError):
                old.rmdir()  # only an empty group goes
        group = CPUACCT / f"petal-tests-{os.getpid()}"
        try:
            group.mkdir()
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            with contextlib.suppress(OSError):
                group.rmdir()
            return None
        return cls(group)

    def usage_s(self) -> float:
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        item.stash[_STARTED] = self.usage_s()
        yield

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.when == "teardown":  # the last report of the test: it carries the whole cost
            report.user_properties.append((PROPERTY, self.usage_s() - item.stash[_STARTED]))
        return report

    def close(self) -> None:
        """Back into the parent group, and the group removed if nothing of ours is left in it (the database server
        is often still stopping: the next run's `make` removes the group then)."""
        with contextlib.suppress(OSError):
            (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()


_STARTED = pytest.StashKey[float]()


def cost(report: pytest.TestReport) -> float | None:
    """A report's measured CPU seconds (its teardown report carries them), or None."""
    return next((float(v) for k, v in report.user_properties if k == PROPERTY and isinstance(v, float)), None)
