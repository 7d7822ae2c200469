"""The embedded PostgreSQL, started the project's way, trusts no one: every login needs its password (from
the 0600 passfile in the data directory's 0700 secrets/), over the socket and over TCP; the server and its
children do not inherit the starting process's secrets; and a data directory of the trust days is upgraded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from petal_dispatch import dbfiles, dbpasswords, dbprocess, dbserver
from petal_dispatch.config import Settings
from shared import migrate
from tests.wait import until_blocking
from tests.served import free_port

ROOT = Path(__file__).resolve().parents[2]
ROLES = (dbpasswords.SUPERUSER, dbpasswords.EXECUTOR_ROLE, dbpasswords.INGRESS_ROLE)
# what the process that starts the server holds, and the server must not
LEAKS = {"PETAL_AUTH_TOKEN": "tok-4f1e9a-never-in-postgres", "DATABASE_URL": "",
         "PETAL_INGRESS_DSN": "", "ANTHROPIC_API_KEY": "sk-ant-never-in-postgres",
         "PGAPPNAME": "leaked-appname", "PGDATABASE": "leaked-db"}
# as root the wheel runs the server as its own user, who must pass through the data directory
DATA_DIR_MODE = 0o711 if os.geteuid() == 0 else 0o700


def _settings(data_dir: Path) -> Settings:
    return Settings(data_dir=data_dir, database_url=None, executor_dsn=None, ingress_dsn=None)


@dataclass
class Embedded:
    data_dir: Path
    handle: dbprocess.EmbeddedServer
    info: dbserver.ServerInfo


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Embedded]:
    data_dir = tmp_path_factory.mktemp("pgauth") / "var"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PGPASSWORD", raising=False)
        for name, value in LEAKS.items():
            mp.setenv(name, value)
        settings = _settings(data_dir)
        info = dbserver.resolve(settings)  # started and migrated the project's way
        handle = dbprocess.embedded(settings)
        yield Embedded(data_dir, handle, info)
        handle.release()


def _passwords(data_dir: Path) -> dict[str, str]:
    return dbpasswords.read_passwords(data_dir / "secrets" / "pgpass")


def _as(dsn: str, role: str, password: str | None, tmp: Path) -> str:
    """`dsn` as `role` with exactly this password (None: none at all; no passfile either)."""
    params = conninfo_to_dict(dsn)
    params.update(user=role, dbname="postgres", passfile=str(tmp / "no-passfile"), connect_timeout="5")
    params.pop("password", None)
    if password is not None:
        params["password"] = password
    return make_conninfo("", **params)


def _refused(dsn: str) -> str:
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(dsn).close()
    return str(caught.value)


def _check_logins(dsn: str, passwords: dict[str, str], tmp: Path) -> None:
    for role in ROLES:
        assert "no password supplied" in _refused(_as(dsn, role, None, tmp)), role
        assert "password authentication failed" in _refused(_as(dsn, role, "not-the-password", tmp)), role
        with psycopg.connect(_as(dsn, role, passwords[role], tmp)) as conn:  # the negative control
            assert conn.execute("SELECT current_user").fetchone() == (role,)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    assert LEAKS["PETAL_AUTH_TOKEN"].encode() not in raw and LEAKS["ANTHROPIC_API_KEY"].encode() not in raw
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _environ_unless_gone(proc: psutil.Process) -> dict[str, str] | None:
    """Its environment, or None when it exited after it was listed (the server starts short-lived children: a
    backend for a connection, an autovacuum worker); a process still there that cannot be read is an error.
    ESRCH and ENOENT are the kernel saying the process is gone (released between the lookup of its /proc entry and
    the open), whatever a second look at its pid finds afterwards: only a refusal is checked again."""
    try:
        return None if _gone(proc) else _environ(proc.pid)
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError:
        if not _gone(proc):
            raise
        return None


def _gone(proc: psutil.Process) -> bool:
    """Exited: no longer there, or a zombie (whose environment reads as empty)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _check_scrubbed(pid: int) -> None:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    read = 0
    for proc in procs:
        env = _environ_unless_gone(proc)
        if env is None:
            continue
        read += 1
        leaked = sorted(k for k in env if k.startswith("PETAL_") or k in LEAKS or k in (
            "PGPASSWORD", "PGPASSFILE", "PGHOST", "PGUSER", "PGSERVICE", "PGOPTIONS"))
        assert leaked == [], f"{proc.name()} {proc.pid} inherited {leaked}"
    # the postmaster and the children that live as long as it (checkpointer, writers, launchers) were read
    assert read > 3, f"read {read} of {len(procs)} processes: the rest exited while listed"
    # what it needs is still there (a child's /proc environ is where it writes its title: often empty)
    assert "PATH" in _environ(pid)


def test_every_role_needs_its_password_over_the_socket_and_the_dsns_carry_it(
        embedded: Embedded, tmp_path: Path) -> None:
    passwords = _passwords(embedded.data_dir)
    assert set(passwords) == set(ROLES) and all(len(p) >= 40 for p in passwords.values())
    assert len(set(passwords.values())) == 3
    assert str(conninfo_to_dict(embedded.info.admin_dsn or "")["host"]).startswith("/")  # the socket
    _check_logins(embedded.info.admin_dsn or "", passwords, tmp_path)
    # the services' DSNs name the passfile, not a password, and log in
    for dsn, role in ((embedded.info.admin_dsn, dbpasswords.SUPERUSER), (embedded.info.executor_dsn, dbpasswords.EXECUTOR_ROLE),
                      (embedded.info.ingress_dsn, dbpasswords.INGRESS_ROLE)):
        assert dsn is not None and "password" not in conninfo_to_dict(dsn)
        assert all(p not in dsn for p in passwords.values())
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (role,)
    with psycopg.connect(embedded.info.admin_dsn or "") as conn:
        rules = conn.execute("SELECT type, auth_method, error FROM pg_hba_file_rules").fetchall()
    assert rules and {(t, a, e) for t, a, e in rules} == {("local", "scram-sha-256", None),
                                                         ("host", "scram-sha-256", None)}


def test_the_server_and_its_children_inherit_none_of_the_starting_process_secrets(embedded: Embedded) -> None:
    pid = embedded.handle.pid()
    assert pid is not None
    _check_scrubbed(pid)


def test_a_process_that_exits_between_listing_and_reading_is_skipped_not_an_error() -> None:
    child = subprocess.Popen(["sleep", "60"], env={"PATH": os.environ["PATH"], "MARK": "here"})
    listed = psutil.Process(child.pid)
    until_blocking(lambda: listed.cmdline() == ["sleep", "60"], "the child to exec", 10)  # not the forked pytest
    assert _environ_unless_gone(listed) == {"PATH": os.environ["PATH"], "MARK": "here"}
    child.kill()
    child.wait()
    assert _environ_unless_gone(listed) is None
    with pytest.raises(OSError):  # what the check met before: the read of a listed process that is gone
        _environ(listed.pid)


def test_the_secrets_and_the_data_directory_are_the_service_user_s_alone(embedded: Embedded) -> None:
    def mode(p: Path) -> int:
        return p.stat().st_mode & 0o7777

    assert mode(embedded.data_dir / "secrets") == 0o700
    assert mode(embedded.data_dir / "secrets" / "pgpass") == 0o600
    assert mode(embedded.data_dir) == DATA_DIR_MODE
    assert mode(embedded.data_dir / "run") == 0o700
    assert mode(embedded.data_dir / "pgdata") == 0o700


def test_read_only_commands_use_the_passfile_against_the_running_server(embedded: Embedded) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PETAL_DATABASE_URL", "PGPASSWORD",
                                                            "PETAL_EXECUTOR_DSN", "PETAL_INGRESS_DSN")}
    env.update(PETAL_DATA_DIR=str(embedded.data_dir), PETAL_LOG_FORMAT="json")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "petal_dispatch.cli", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)

    status = run("db", "status", "--json")
    journal = run("journal")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["migrations"]["current"] is True
    assert journal.returncode == 0, journal.stderr
    assert all(p not in status.stdout + status.stderr for p in _passwords(embedded.data_dir).values())


def test_over_tcp_too_and_a_restart_after_a_crash_is_scrubbed_the_same(embedded: Embedded, tmp_path: Path) -> None:
    ep = dbprocess.wheel()
    handle, pgdata = embedded.handle, embedded.handle.pgdata
    passwords = _passwords(embedded.data_dir)
    user = handle.server.system_user
    # the wheel starts it on its socket only; run it with a TCP listener as well, through the wheel's pg_ctl
    port = free_port()
    socket_dir = conninfo_to_dict(embedded.info.admin_dsn or "")["host"]
    ep.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60)
    ep.pg_ctl(["-w", "-o", f"-h 127.0.0.1 -p {port} -k {socket_dir}", "-l", str(pgdata / "log"), "start"],
              pgdata=pgdata, user=user, timeout=60)
    try:
        _check_logins(f"host=127.0.0.1 port={port}", passwords, tmp_path)
    finally:
        ep.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60)
    assert handle.pid() is None
    handle.restart()  # as `up` does when the server died: the project's start again
    pid = handle.pid()
    assert pid is not None
    # a crash (SIGQUIT: an immediate stop, its children go too), then the project's restart
    os.kill(pid, signal.SIGQUIT)
    until_blocking(lambda: handle.pid() is None, "the server to die", timeout=20)
    handle.restart()
    second = handle.pid()
    assert second is not None and second != pid
    _check_scrubbed(second)
    _check_logins(embedded.info.admin_dsn or "", passwords, tmp_path)


def test_a_data_directory_of_the_trust_days_is_upgraded_on_the_next_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "var"
    data_dir.mkdir(mode=0o755)
    os.chmod(data_dir, 0o755)
    # as the code before this change made it: the wheel's initdb (trust), migrated, a row in it
    ep = dbprocess.wheel()
    old = ep.get_server(data_dir / "pgdata", cleanup_mode="stop")
    root = old.get_uri()
    with psycopg.connect(root, autocommit=True) as conn:
        conn.execute("CREATE DATABASE petal")
    petal = make_conninfo(root, dbname="petal")
    migrate.migrate(petal)
    with psycopg.connect(petal, autocommit=True) as conn:
        conn.execute("INSERT INTO projects (name) VALUES ('kept')")
    with psycopg.connect(dbserver.role_dsn(petal, dbpasswords.INGRESS_ROLE)) as conn:  # trust: no password at all
        assert conn.execute("SELECT current_user").fetchone() == (dbpasswords.INGRESS_ROLE,)
    old._cleanup()  # the last handle: the server stops
    assert dbfiles.hba_trusts(data_dir / "pgdata") and not (data_dir / "secrets").exists()

    settings = _settings(data_dir)
    info = dbserver.resolve(settings)
    handle = dbprocess.embedded(settings)
    try:
        assert not dbfiles.hba_trusts(data_dir / "pgdata")
        assert (data_dir / "secrets" / "pgpass").stat().st_mode & 0o7777 == 0o600
        assert data_dir.stat().st_mode & 0o7777 == DATA_DIR_MODE  # tightened
        _check_logins(info.admin_dsn or "", _passwords(data_dir), tmp_path)
        with psycopg.connect(info.ingress_dsn) as conn:
            assert conn.execute("SELECT name FROM projects").fetchall() == [("kept",)]
    finally:
        handle.release()
    # the next start finds it upgraded and changes nothing
    again = dbserver.resolve(settings)
    try:
        with psycopg.connect(again.executor_dsn) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (dbpasswords.EXECUTOR_ROLE,)
    finally:
        dbprocess.embedded(settings).release()


def test_the_commands_that_write_the_data_directory_make_it_private_whatever_the_umask(tmp_path: Path) -> None:
    data_dir = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PETAL_DATABASE_URL")}
    env.update(PETAL_DATA_DIR=str(data_dir), PETAL_LOG_FORMAT="json")
    out = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "migrate"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120, preexec_fn=lambda: os.umask(0o022) and None)
    assert out.returncode == 0, out.stderr
    assert data_dir.stat().st_mode & 0o7777 == DATA_DIR_MODE
    for path in (data_dir / "run", data_dir / "secrets"):
        assert path.stat().st_mode & 0o7777 == 0o700, path
    # what the command wrote itself (the handle list) is 0600, not the 0644 of umask 022
    assert (data_dir / "pgdata" / dbprocess.HANDLES_FILE).stat().st_mode & 0o7777 == 0o600
