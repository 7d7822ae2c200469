"""The embedded server's files: the data directory it lives in, kept private, and its pg_hba.conf.

The data directory (PETAL_DATA_DIR) holds pgdata, the run files and the passwords (dbpasswords.py); it is made
0700 (0711 as root, so the wheel's server user can pass through to pgdata). Every login needs its password:
pg_hba.conf says scram-sha-256 for every connection type, and a data directory made in the wheel's `trust` days
gets this file when a handle is next taken (dbprocess.py).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from petal_dispatch.config import Settings
from shared import errors

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


def hba_trusts(pgdata: Path) -> bool:
    """Whether pg_hba.conf lets any connection in without a password (`trust`, the wheel's default)."""
    try:
        text = (pgdata / "pg_hba.conf").read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    return any("trust" in line.split("#", 1)[0].split() for line in text.splitlines())


def write_hba(pgdata: Path) -> None:
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
