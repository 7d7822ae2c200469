"""Calling the harness MCP as a spawn would (with a per-spawn credential) or as a stranger (without)."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx2
import psycopg
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests import tables
from tests.harness import Harness
from tests.pg import DB
from tests.wait import until

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)


@dataclass(frozen=True)
class Spawn:
    task_id: uuid.UUID
    session_id: uuid.UUID
    token: str


def add_spawn(db: DB, *, status: str = "running", role: str = "orchestrator",
              project: uuid.UUID | None = None, revoked: bool = False) -> Spawn:
    """A task row with a credential, as the supervisor records one when it spawns (only the hash is stored).

    Add a running one only after the executor reconciled (`wait_started`), or it is crashed as an orphan.
    """
    token = secrets.token_urlsafe(32)
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        session = tables.insert_thread(conn, project_id=project, role=role, lifecycle="running")
        task = tables.insert_task(conn, project_id=project, session_id=session, role=role, status=status,
                                  started_at=tables.NOW)
        tables.add(conn, "harness_credentials", token_sha256=hashlib.sha256(token.encode()).digest(), task_id=task,
                   session_id=session, revoked_at=tables.NOW if revoked else None)
    return Spawn(task, session, token)


async def wait_started(h: Harness, timeout: float = 30) -> None:
    """Until the executor has reconciled (after that, a running task added by a test stays running)."""
    async def started() -> bool:
        return any(e.event_type == "executor.started" for e in await h.events())
    await until(started, "the executor to reconcile (executor.started)", timeout, every=0.05)


@asynccontextmanager
async def mcp_client(url: str, token: str | None = None, headers: dict[str, str] | None = None) -> AsyncIterator[Client]:
    """The SDK's streamable-HTTP client, sending the credential (if any) and any other headers on every request."""
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    async with httpx2.AsyncClient(headers=sent, timeout=httpx2.Timeout(30, read=300)) as http, \
            Client(streamable_http_client(url, http_client=http)) as client:
        yield client
