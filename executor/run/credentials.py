"""The per-spawn harness credential: a fresh token in a private MCP config file the CLI reads, only its hash
in the store, and revoked the moment its process has exited."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import uuid
from collections.abc import Callable
from pathlib import Path

from executor.run import substrate
from executor.run.task_store import TaskStore
from shared import logs
from shared.database import OUTAGE_ERRORS, Availability

log = logs.get(__name__)


def token_digest(token: str) -> bytes:
    """What the store keeps of a credential, and what a presented one is looked up by (the harness,
    executor/harness/identity.py): its sha256. The one place a credential is hashed."""
    return hashlib.sha256(token.encode()).digest()


class Credentials:
    def __init__(self, store: TaskStore, run_dir: Path, mcp_url: str | None, mcp_timeout_ms: int | None,
                 availability: Availability):
        self.store = store
        self.directory = run_dir / "mcp"
        self.mcp_url = mcp_url
        self.mcp_timeout_ms = mcp_timeout_ms
        self.availability = availability
        # told when a spawn's credential dies (the harness MCP forgets the callers it confirmed)
        self.on_revoked: Callable[[uuid.UUID], None] | None = None

    async def grant(self, task_id: uuid.UUID, session_id: uuid.UUID) -> Path | None:
        """The per-spawn MCP config carrying a fresh credential; only its hash reaches the database."""
        written = self.write(f"mcp-{task_id}.json")
        if written is None:
            return None
        path, digest = written
        try:
            await self.bind(digest, task_id, session_id)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path

    def write(self, name: str) -> tuple[Path, bytes] | None:
        """A fresh credential in a private MCP config file, not yet anyone's: (its path, its hash). A warm
        turn's process reads it at start and sends it on every request; the harness refuses it until `bind`
        (executor/run/spawn/warm_pool.py)."""
        if not self.mcp_url:
            return None
        token = secrets.token_urlsafe(32)
        # the credential is the caller's identity: readable by this user only, from the first byte
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # an older or hand-made directory may be wider
        path = self.directory / name
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(substrate.mcp_config(self.mcp_url, token, self.mcp_timeout_ms)))
        return path, token_digest(token)

    async def bind(self, digest: bytes, task_id: uuid.UUID, session_id: uuid.UUID) -> None:
        """The credential is the task's from now on (the harness answers its calls as the task's)."""
        await self.store.grant_credential(digest, task_id, session_id)

    async def revoke(self, task_id: uuid.UUID, config: Path) -> bool:
        """The credential dies with its process, before the task's end is settled (a Bash grandchild that
        survives the CLI and read the config cannot call as the task meanwhile). True when the database was
        away: revoke again once the end is recorded."""
        config.unlink(missing_ok=True)
        if self.on_revoked is not None:
            self.on_revoked(task_id)
        try:
            await self.store.revoke_credential(task_id)
        except OUTAGE_ERRORS as exc:
            # the harness already forgot the caller (above); the task's final status refuses the credential
            # until it is revoked, once the end is recorded
            self.availability.failed(exc, "credential_revoke")
            return True
        except Exception:  # noqa: BLE001 - the task's end must still be recorded; its status refuses it then
            log.exception("credential_revoke_failed", task_id=str(task_id))
        return False

    def sweep(self) -> None:
        """Configs left by processes of a previous executor (a crash): their credentials are dead anyway."""
        if self.directory.is_dir():
            for stale in self.directory.glob("mcp-*.json"):
                stale.unlink(missing_ok=True)
