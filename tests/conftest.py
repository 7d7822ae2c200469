from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from psycopg_pool import AsyncConnectionPool

from shared.database import Database
from tests.pg import DB, Cluster, PgUnavailable
from tests.resilience import OwnServer

# The tiers are folders; each test carries its folder's marker (`-m unit`, `-m "not web"` …).
TIERS = ("unit", "store", "e2e", "web", "fault")
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(item.path).resolve().relative_to(HERE).parts
        if len(parts) > 1 and parts[0] in TIERS:
            item.add_marker(parts[0])


# pytest's exit code when the PostgreSQL asked for (PETAL_TEST_PG_IMAGE) cannot be had
PG_UNAVAILABLE_EXIT = 4


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
