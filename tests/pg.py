"""Test databases on a real PostgreSQL: PETAL_TEST_DSN when set; else a container of the image
PETAL_TEST_PG_IMAGE (e.g. postgres:14 … postgres:18) when that is set, through testcontainers and a Docker
engine (the optional `containers` extra); else an embedded server.

A template database is migrated once per test session and cloned per test (CREATE DATABASE ...
TEMPLATE), so every test starts from the same schema and nothing leaks between tests.
"""

from __future__ import annotations

import os
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from petal_dispatch import dbpasswords, dbprocess, dbserver
from shared import migrate
from tests.wait import until

# how long the Docker engine may take to answer a ping before "no Docker" is the answer
DOCKER_PING_TIMEOUT_S = 5


@dataclass(frozen=True)
class DB:
    name: str
    admin_dsn: str
    executor_dsn: str
    ingress_dsn: str


class PgUnavailable(Exception):
    """The PostgreSQL the environment asks for cannot be had; the message says why and what to do."""


class Cluster:
    def __init__(self, root_dsn: str, container: Any = None):
        self.root_dsn = root_dsn
        self.prefix = f"petal_t{uuid.uuid4().hex[:8]}"
        self.template: str | None = None
        self._container = container

    @classmethod
    def start(cls, workdir: Path) -> Cluster:
        dsn = os.environ.get("PETAL_TEST_DSN")
        if dsn:
            return cls(dsn)
        image = os.environ.get("PETAL_TEST_PG_IMAGE")
        if image:
            return cls.from_image(image)
        # The wheel as the project runs it (a scrubbed environment), but with the wheel's own trust: a
        # throwaway server of the tests, whose roles log in without passwords (tests/store/test_pg_auth.py covers
        # the project's passwords).
        workdir.mkdir(parents=True, exist_ok=True)
        server = dbprocess.wheel().get_server(workdir / "pgdata", cleanup_mode="delete")
        cluster = cls(server.get_uri())
        # A throwaway server: no fsync, so a test's DROP DATABASE (a checkpoint: 150 ms with fsync, beside two other
        # workers' servers) does not wait on the disk. A killed server loses nothing by it (the writes are in the
        # kernel's cache); the servers the fault tests stop and kill are their own (tests/resilience.py).
        with psycopg.connect(cluster.root_dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("ALTER SYSTEM SET full_page_writes = off")
            conn.execute("SELECT pg_reload_conf()")
        return cluster

    @classmethod
    def from_image(cls, image: str) -> Cluster:
        """A throwaway server in a container of `image`, started and removed by testcontainers.

        Raises:
            PgUnavailable: testcontainers is not installed, or no Docker engine answers.
        """
        container_class = cls.container_class(image)
        # trust: the executor and ingress roles log in without passwords, as on the embedded test servers
        container = container_class(image, driver=None).with_env("POSTGRES_HOST_AUTH_METHOD", "trust")
        container.start()
        return cls(container.get_connection_url(), container=container)

    @staticmethod
    def container_class(image: str) -> Any:
        """testcontainers' PostgresContainer, once a Docker engine has answered (nothing is started: the xdist
        controller asks this before its workers each start a container of their own).

        Raises:
            PgUnavailable: testcontainers is not installed, or no Docker engine answers.
        """
        try:
            import docker
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                try:
                    from testcontainers.community.postgres import PostgresContainer
                except ImportError:  # testcontainers before the community package
                    from testcontainers.postgres import PostgresContainer
        except ImportError:
            raise PgUnavailable(f"PETAL_TEST_PG_IMAGE={image} needs testcontainers: pip install -e '.[containers]' "
                                "(or unset PETAL_TEST_PG_IMAGE to use the embedded server)") from None
        try:
            docker.from_env(timeout=DOCKER_PING_TIMEOUT_S).ping()
        except Exception as exc:  # noqa: BLE001 - whatever the docker client raised, the answer is "no engine"
            raise PgUnavailable(
                f"PETAL_TEST_PG_IMAGE={image} needs a Docker engine, and none answers "
                f"(DOCKER_HOST={os.environ.get('DOCKER_HOST', 'unset')}: {type(exc).__name__}). Start Docker, or unset "
                "PETAL_TEST_PG_IMAGE to use the embedded server (or PETAL_TEST_DSN for a server of your own)"
            ) from None
        return PostgresContainer

    def close(self) -> None:
        if self._container is not None:
            self._container.stop()
            self._container = None

    def _exec(self, statement: sql.Composed) -> None:
        with psycopg.connect(self.root_dsn, autocommit=True) as conn:
            conn.execute(statement)

    def dsn_for(self, dbname: str) -> str:
        return make_conninfo(self.root_dsn, dbname=dbname)

    def create_empty(self) -> DB:
        name = f"{self.prefix}_{uuid.uuid4().hex[:10]}"
        self._exec(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self._testdb(name)

    def create_migrated(self) -> DB:
        if self.template is None:
            tpl = self.create_empty()
            migrate.migrate(tpl.admin_dsn)
            self.template = tpl.name
        name = f"{self.prefix}_{uuid.uuid4().hex[:10]}"
        self._exec(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(self.template))
        )
        return self._testdb(name)

    def _testdb(self, name: str) -> DB:
        admin = self.dsn_for(name)
        return DB(
            name=name,
            admin_dsn=admin,
            executor_dsn=dbserver.role_dsn(admin, dbpasswords.EXECUTOR_ROLE),
            ingress_dsn=dbserver.role_dsn(admin, dbpasswords.INGRESS_ROLE),
        )

    def drop(self, db: DB) -> None:
        self._exec(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db.name)))

    def drop_all(self) -> None:
        with psycopg.connect(self.root_dsn, autocommit=True) as conn:
            names = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [self.prefix + "%"])
            for (name,) in names.fetchall():
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


async def lock_waiter(admin_dsn: str, where: str, params: list[Any] | None = None, timeout: float = 30) -> int:
    """The pid of a session of this database waiting on a lock and matching `where` (SQL over
    pg_stat_activity), once there is one: how a test knows a racing statement has reached its lock."""
    async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as conn:
        async def waiting() -> int | None:
            cur = await conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                                     f" AND wait_event_type = 'Lock' AND ({where})", params or [])
            row = await cur.fetchone()
            return int(row[0]) if row else None
        return await until(waiting, f"a session waiting on a lock where {where}", timeout, every=0.01)
