"""Who is calling the harness: resolved from the per-spawn credential alone, never from what the call declares.

Every spawn's `--mcp-config` carries a random credential as `Authorization: Bearer <token>` (see
substrate.mcp_config); the store keeps its hash with the task and session it was granted to. A call without
a valid one is refused before anything is done, and only the refusal is journaled (`harness.call_refused`,
within a budget per credential: executor/harness/refusals.py). What a valid caller may name in its arguments
is the tools' check (executor/harness/scope.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from executor.harness.refusals import RefusalBudget, anonymous_key, credential_key
from executor.journal.writer import JournalWriter
from executor.run import credentials
from executor.run.caller import Caller
from executor.run.task_store import TaskRows
from shared import logs
from shared.database import OUTAGE_ERRORS
from shared.models import NewEvent
from shared.query import Queries

log = logs.get(__name__)

# The per-spawn credential arrives as "Authorization: Bearer <token>" (see substrate.mcp_config).
CREDENTIAL_HEADER = "authorization"
# Headers older configs used to declare an identity; now ignored, only named in a refusal's record.
IGNORED_IDENTITY_HEADERS = ("x-petal-session", "x-petal-task")
# The CLI's id of the tool call being served, in the request's `_meta` (docs/claude-cli.md).
TOOL_USE_META = "claudecode/toolUseId"


@dataclass(frozen=True, slots=True)
class _Credential:
    """A `harness_caller` row: the credential's holder and whether it still counts."""

    task_id: uuid.UUID
    session_id: uuid.UUID
    revoked_at: datetime | None
    status: str
    role: str
    project_id: uuid.UUID | None
    thread_id: uuid.UUID | None

    def refusal(self) -> str | None:
        if self.status != "running":
            return f"the credential's task has ended ({self.status})"
        if self.revoked_at is not None:
            return "the credential's process has exited"
        return None


class CallRefused(ToolError):
    """A call without a valid credential: nothing was done, only the refusal was journaled."""


def bearer(headers: Mapping[str, str] | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    value = (headers or {}).get(CREDENTIAL_HEADER) or ""
    scheme, _, token = value.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def tool_use_id(ctx: Context) -> str | None:
    """The CLI's id of the tool call being served (from the request's `_meta`), if it sent one."""
    raw: Any = ctx.request_context.meta or {}
    # a plain dict in mcp 2.3.x; a model in some builds
    meta = raw.model_dump() if hasattr(raw, "model_dump") else dict(raw)
    found = meta.get(TOOL_USE_META)
    return found if isinstance(found, str) else None


def _peer(ctx: Context) -> str | None:
    client = getattr(getattr(ctx.request_context, "request", None), "client", None)
    return f"{client.host}:{client.port}" if client else None


class Identities:
    """Resolves each call's credential to its `Caller`, or refuses the call."""

    def __init__(self, q: Queries, writer: JournalWriter, refusals: RefusalBudget | None = None):
        self.q = q
        self.writer = writer
        # refused calls journaled within a budget per credential: a local loop of forged calls cannot fill
        # the journal, and one spawn's flood cannot use up the records of another's refusals
        self.refusals = refusals or RefusalBudget()
        # Callers whose credential the store confirmed, by its hash, while their process lives (the
        # supervisor forgets them at its exit, in this same process): during a database outage a live
        # worker's plainly safe tool calls are still checked and allowed, instead of every Bash call
        # failing closed.
        self._confirmed: dict[bytes, Caller] = {}

    def forget(self, task_id: uuid.UUID) -> None:
        """A task's process exited: its credential no longer counts, database or not."""
        for digest in [d for d, c in self._confirmed.items() if c.task_id == task_id]:
            del self._confirmed[digest]

    async def caller(self, ctx: Context, tool: str) -> Caller:
        """The caller behind the call's credential.

        Raises:
            CallRefused: no credential, an unknown one, or one whose process has exited or whose task
                is no longer running; the only thing written is a `harness.call_refused` record.
        """
        headers = ctx.headers or {}
        token = bearer(headers)
        found = None
        if token is None:
            reason = "no credential"
        else:
            digest = credentials.token_digest(token)
            try:
                found = await TaskRows(self.q).harness_caller(digest, _Credential)
            except OUTAGE_ERRORS:
                known = self._confirmed.get(digest)
                if known is None:
                    raise  # nothing confirmed it: the call fails, closed
                return known
            refused = "unknown credential" if found is None else found.refusal()
            if found is not None and refused is None:
                caller = Caller(task_id=found.task_id, session_id=found.session_id, thread_id=found.thread_id,
                                project_id=found.project_id, role=found.role)
                self._confirmed[digest] = caller
                return caller
            reason = refused or "unknown credential"
        await self._journal_refusal(ctx, tool, reason, headers, found)
        raise CallRefused(f"{tool} refused: {reason}. The harness answers only the processes it spawned, "
                          "identified by the credential in their per-spawn MCP config; nothing was done.")

    async def _journal_refusal(self, ctx: Context, tool: str, reason: str, headers: Mapping[str, str],
                               found: _Credential | None) -> None:
        payload: dict[str, Any] = {"tool": tool, "reason": reason, "peer": _peer(ctx)}
        declared = [h for h in IGNORED_IDENTITY_HEADERS if h in headers]
        if declared:
            payload["ignored_headers"] = declared
        if found is not None:  # an ended task's own credential: worth knowing whose it was
            payload["credential_task_id"] = str(found.task_id)
        # an ended or exited credential is still its task's: its refusals draw on that credential's budget
        key = credential_key(found.task_id) if found is not None else \
            anonymous_key((payload["peer"] or "").rpartition(":")[0] or None)
        left_out = self.refusals.admit(key)
        if left_out is not None:
            if left_out:
                payload["not_journaled_before"] = left_out
            await self.writer.write([NewEvent("harness.call_refused", payload)])
            log.warning("harness_call_refused", **payload)
