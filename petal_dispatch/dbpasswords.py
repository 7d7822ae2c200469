"""The embedded server's passwords: made once per data directory, kept in a libpq passfile, set on its roles.

Every login (superuser and both roles, socket and TCP) needs its scram-sha-256 password. The passwords live in
`secrets/pgpass` (0600, in a 0700 directory beside pgdata); the DSNs name that file, never a password.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import re
import secrets
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from petal_dispatch.config import Settings
from petal_dispatch.dbfiles import private_dir
from shared import errors

EMBEDDED_DBNAME = "petal"
EXECUTOR_ROLE = "petal_executor"
INGRESS_ROLE = "petal_ingress"
# the superuser the wheel's initdb makes (`-U postgres`)
SUPERUSER = "postgres"
# PETAL_DATA_DIR/secrets/pgpass: the embedded server's passwords, as a libpq passfile
SECRETS_DIR = "secrets"
PASSFILE = "pgpass"
PASSWORD_BYTES = 32


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


def embedded_dsn(uri: str, passfile_path: Path, *, user: str = SUPERUSER, dbname: str = EMBEDDED_DBNAME) -> str:
    """A DSN of the embedded server (the wheel's URI) as `user`, its password in the passfile."""
    params = conninfo_to_dict(uri)
    params.pop("password", None)
    params.update(user=user, dbname=dbname, passfile=str(passfile_path))
    return make_conninfo("", **params)
