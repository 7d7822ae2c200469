from __future__ import annotations

import functools
import json
import os
import ssl
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx._transports.default as httpx_transports
import pytest
from psycopg_pool import AsyncConnectionPool

from shared.database import Database
from tests import cpu_clock
from tests.pg import DB, Cluster, PgUnavailable
from tests.resilience import OwnServer

# Warm turns off in every service a test starts, in-process or as a process (tests/harness.config_for does the same
# for the in-process executor): each would start a CLI after every turn, and retire it with a journal record while
# the executor stops, after a test's readers have finished. tests/e2e/test_warm_turns.py turns them on.
os.environ.setdefault("PETAL_WARM_TURNS", "0")

# Every httpx client a test makes loads the CA bundle into a TLS context of its own (49 ms of CPU, for clients that
# speak plain HTTP to loopback, hundreds of times a run): the default context is made once and shared (a context
# serves any number of connections), any other is made as asked.
_make_tls = httpx.create_ssl_context


@functools.cache
def _default_tls() -> ssl.SSLContext:
    return _make_tls()


def _shared_tls(verify: Any = True, cert: Any = None, trust_env: bool = True) -> ssl.SSLContext:
    if verify is True and cert is None and trust_env:
        return _default_tls()
    return _make_tls(verify=verify, cert=cert, trust_env=trust_env)


setattr(httpx_transports, "create_ssl_context", _shared_tls)  # where the clients look it up

# The tiers are folders; each test carries its folder's marker (`-m unit`, `-m "not web"` …).
TIERS = ("unit", "store", "e2e", "web", "fault", "shipped")
HERE = Path(__file__).resolve().parent


# Tests that must not share the machine with other tests: `.ci/run` runs them after the parallel pass, alone
# (marked `serial`). Each says why; a test belongs here when its outcome depends on the cores being its own.
SERIAL = {
    # answers timed to 50 ms either side of the ask's timeout: both outcomes must happen
    "tests/fault/test_resilience.py::test_an_answer_racing_the_asks_timeout_closes_the_question_exactly_once":
        "races a timeout to the 50 ms",
    # benchmark-like: 50 000 lines through the journal and the SSE buffer while one reader lags; whether the reader
    # is cut off (what the test proves) depends on the writer outpacing it, on cores of its own
    "tests/fault/test_resilience.py::test_a_worker_flooding_50000_lines_while_a_client_reads_slowly_loses_no_line":
        "throughput: the writer must outpace a slow reader",
    # a takeover timed to half a second within 1.5 leases of 3 s: on shared cores a renewal or the reap pass comes late
    "tests/fault/test_fleet.py::test_a_killed_executors_tasks_crash_as_executor_lost_within_its_lease_and_are_retried_on_another":
        "lease timing to the half second",
    # eight workers at once on two executors with a 3 s lease: on busy cores the first executor's renewal can
    # fall behind its lease, and then its namesake (which must be refused) may rightly take the name over
    "tests/fault/test_fleet.py::test_eight_workers_spread_over_two_executors_within_capacity_labels_placed_and_a_namesake_refused":
        "eight workers against a 3 s lease",
    # the "fast" SSE client must keep up with 400 frames of 20 kB while the slow one is cut off: on busy cores it
    # falls behind its 50-frame buffer too, and is rightly cut off as well
    "tests/store/test_ingress.py::test_a_client_that_stops_reading_is_cut_off_without_delaying_others_and_resumes_exactly":
        "a reader that must keep up with a flood",
    # reads where a 60-line turn stands while it lands, scrolling to follow it: on busy cores the end of the turn can
    # overtake the scroll (seen failing only in the parallel pass; the page's follow under load is left open)
    "tests/web/test_web_live.py::test_a_long_turn_keeps_its_newest_steps_in_view_folds_the_rest_once_each_and_follows_only_a_reader_at_the_bottom":
        "a follow timed against a turn that is still landing",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    names = {item.nodeid.split("[", 1)[0] for item in items}
    files = {name.split("::", 1)[0] for name in names}
    if stale := [name for name in SERIAL if name.split("::", 1)[0] in files and name not in names]:
        raise pytest.UsageError(f"tests/conftest.py SERIAL names tests that do not exist: {stale}")
    for item in items:
        if item.nodeid.split("[", 1)[0] in SERIAL:
            item.add_marker(pytest.mark.serial)
        parts = Path(item.path).resolve().relative_to(HERE).parts
        if len(parts) > 1 and parts[0] in TIERS:
            item.add_marker(parts[0])
        # the tests of a module on a server of its own (`own`, module-scoped) stay on one xdist worker: one
        # server per module, as without xdist, and no two of them restarting it under each other
        if "own" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(f"own:{item.nodeid.split('::', 1)[0]}"))
        # likewise the failover tests' primary and standby (`rig`, module-scoped: tests/replica.py)
        if "rig" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(f"rig:{item.nodeid.split('::', 1)[0]}"))
    _group_suffix(config, items)


def _group_suffix(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--dist loadgroup` groups by a "@group" suffix of the node id, which pytest-xdist 3.8 adds through
    `Item._nodeid`, an attribute pytest 9 no longer reads (it reads `_id`): without this each test of a group may
    land on another worker (and make a module-scoped server, or the shipped tier's set-up, of its own)."""
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        return
    from _pytest.nodeid import coerce_node_id  # pytest 9 (before it, xdist's own suffix holds)

    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if groups and "@" not in item.nodeid:
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(groups)}")


def _tier(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else "other"


class TierClock:
    """Each tier's wall time in this run: from the start of its first test's setup to the end of its last test's
    teardown (under xdist the controller sees every worker's reports, so tiers that overlap are each timed whole).
    Printed in the summary, and with `--tier-times FILE` appended to FILE as one JSON line (`.ci/run` adds up its
    passes; an option, not a variable, so that the pytest runs some tests start do not write there too)."""

    def __init__(self, out: str | None) -> None:
        self.out = out
        self.spans: dict[str, list[float]] = {}
        self.cpu: dict[str, float] = {}  # each tier's CPU seconds, where measured (tests/cpu_clock.py)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.start:
            return
        tier = _tier(report.nodeid)
        span = self.spans.setdefault(tier, [report.start, report.stop])
        span[0], span[1] = min(span[0], report.start), max(span[1], report.stop)
        if (spent := cpu_clock.cost(report)) is not None:
            self.cpu[tier] = self.cpu.get(tier, 0.0) + spent

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.spans:
            terminalreporter.write_line("tier wall time: " + ", ".join(
                f"{tier} {stop - start:.1f} s" for tier, (start, stop) in sorted(self.spans.items())))
        if self.cpu:
            terminalreporter.write_line("tier CPU time: " + ", ".join(
                f"{tier} {spent:.0f} s" for tier, spent in sorted(self.cpu.items())))

    def pytest_sessionfinish(self) -> None:
        if self.out and self.spans:
            with open(self.out, "a") as f:
                f.write(json.dumps({"wall": {tier: stop - start for tier, (start, stop) in self.spans.items()},
                                    "cpu": self.cpu}) + "\n")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--tier-times", metavar="FILE", help="append each tier's wall time to FILE (a JSON line)")


def pytest_configure(config: pytest.Config) -> None:
    worker = hasattr(config, "workerinput")
    if not worker:  # the controller (or a run without xdist), not an xdist worker
        config.pluginmanager.register(TierClock(config.getoption("tier_times")), "petal-tier-clock")
    if worker or not config.getoption("numprocesses", None):  # a process that runs tests: what they cost
        clock = cpu_clock.CpuClock.make()
        if clock is not None:
            config.pluginmanager.register(clock, "petal-cpu-clock")
            config.add_cleanup(clock.close)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # Under xdist each worker starts a container of its own; without Docker each would stop its own run, and the
    # controller would see crashed workers, not the reason. Asked once here instead (nothing is started).
    image = os.environ.get("PETAL_TEST_PG_IMAGE")
    if image and not os.environ.get("PETAL_TEST_DSN") and session.config.getoption("numprocesses", None) \
            and not hasattr(session.config, "workerinput"):
        try:
            Cluster.container_class(image)
        except PgUnavailable as exc:
            pytest.exit(str(exc), returncode=PG_UNAVAILABLE_EXIT)


# pytest's exit code when the PostgreSQL asked for (PETAL_TEST_PG_IMAGE) cannot be had
PG_UNAVAILABLE_EXIT = 4


@pytest.fixture(scope="session", autouse=True)
async def _shared_browser_closed() -> AsyncIterator[None]:
    """The browser the web tests share in this process (tests/web/test_web_client.py `browser`), closed at the end
    on the session's loop, where it was launched."""
    yield
    shared = sys.modules.get("tests.web.test_web_client")
    if shared is not None:
        await shared.close_browser()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        c = Cluster.start(tmp_path_factory.mktemp("cluster"))
    except PgUnavailable as exc:  # a configuration problem: say so once, not as a traceback per test
        pytest.exit(str(exc), returncode=PG_UNAVAILABLE_EXIT)
    yield c
    c.drop_all()
    c.close()


@pytest.fixture
def db(cluster: Cluster) -> Iterator[DB]:
    """A migrated database of its own for this test."""
    d = cluster.create_migrated()
    yield d
    cluster.drop(d)


@pytest.fixture
def empty_db(cluster: Cluster) -> Iterator[DB]:
    d = cluster.create_empty()
    yield d
    cluster.drop(d)


@pytest.fixture
async def executor_db(db: DB) -> AsyncIterator[Database]:
    async with Database(db.executor_dsn, name="test-executor", max_size=6) as database:
        yield database


@pytest.fixture
def pool(executor_db: Database) -> AsyncConnectionPool:
    return executor_db.pool


# A PostgreSQL server of the module's own (the fault suites stop, kill and restart it), and a migrated
# database on it per test.
@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OwnServer, Cluster]]:
    server = OwnServer.start(tmp_path_factory.mktemp("own-pg"))
    cluster = Cluster(server.root_dsn)
    yield server, cluster
    cluster.drop_all()
    server.stop()


@pytest.fixture
def odb(own: tuple[OwnServer, Cluster]) -> Iterator[DB]:
    d = own[1].create_migrated()
    yield d
    own[1].drop(d)
