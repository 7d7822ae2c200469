"""The settler: what must happen after a task ends, or after the user answers, is done by a loop over the
store, not by callbacks. It owns every follow-up of a worker's end:

- an end: a project worker's changes recorded (executor/settle/changes.py), then the step its end calls
  for, decided by a pure function (`route`): extraction, the gate, the policy, a thread's turn boundary;
- an answered escalation carried out (executor/settle/settlement.py);
- an answered approval carried out, and a late answer sent to its thread (executor/settle/approvals.py).

Each is claimed with `FOR UPDATE SKIP LOCKED` and writes its rows, its journal records and its marker
(`settled_at` and `changes_recorded_at`; the escalation's, approval's or late answer's own row) in ONE
transaction. A step that must start something (an extractor run, a retry) inserts the task row in that
transaction and the supervisor claims it. So an executor that dies between an end and its settlement
settles it after the restart, exactly once; a step that raises rolls back, is logged, and is retried with a
growing delay — never lost.

It is one `consume` loop (shared/consume.py): ends on `task_ended` (a status change into a final one, migration 0036),
the answers it acts on on `question_settle` (an approval's, an escalation's, a late one: migration 0035),
and everything on the poll.
"""

from __future__ import annotations

import dataclasses
import enum
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from executor.run.task_run import EXECUTOR_SHUTDOWN, PARKED_LIMIT
from executor.settle import approvals, changes, extraction, settlement
from executor.sql import queries
from shared import consume, database, journal, logs
from shared.listener import Subscription
from shared.models import NewEvent
from shared.query import Queries
from shared.work import Work

log = logs.get(__name__)

SHUTDOWN = EXECUTOR_SHUTDOWN  # a run the executor's own stop cut off
PARKED = PARKED_LIMIT  # a run parked on the user that the supervisor ended (its question stays answerable)


@dataclass(frozen=True)
class SettlerConfig:
    # whether finished workers are extracted and gated (off, an end is only marked settled)
    extract: bool = True
    backoff_base_s: float = 30.0
    # backstop for task_ended notifications lost while the LISTEN connection was down
    poll_interval_s: float = 1.0
    # a settlement that raised is retried after this, doubled per failure up to the cap
    retry_base_s: float = 1.0
    retry_cap_s: float = 60.0
    # whether a project worker's worktree stays after its changes are recorded (its branch always does)
    keep_worktrees: bool = False


class Step(enum.StrEnum):
    GATE = "gate"  # an extractor ended: validate its output, store the handoff or the failure, apply the policy
    EXTRACT = "extract"  # a worker with output ended: start its extractor (the policy waits for the handoff)
    POLICY = "policy"  # a thread's worker ended with nothing to extract: apply the policy to the end itself
    TELL_THREAD = "tell_thread"  # an orchestrator turn ended: the thread delivers what waited for the boundary
    RERUN_TURN = "rerun_turn"  # a turn cut off by the executor's shutdown: run its messages again
    TURN_FAILED = "turn_failed"  # a turn ended otherwise: record it in the chat and apply the turns' policy
    NOTHING = "nothing"  # nobody acts on this end; it stays visible


@dataclass(frozen=True)
class Ended:
    """An ended task as settlement sees it, read from the store."""

    id: uuid.UUID
    role: str
    status: str
    status_reason: str | None
    parent_task_id: uuid.UUID | None = None
    json_schema: dict[str, Any] | None = None
    extract_on_exit: bool = False
    thread_turn: bool = False  # one of a thread's orchestrator turns
    thread_id: uuid.UUID | None = None  # the thread whose turn dispatched it
    exited: dict[str, Any] | None = None  # its task.exited record (None: reconciled, or cancelled while pending)
    changes_due: bool = False  # a project worker's branch whose changes are not recorded yet

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Ended:
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})

    @property
    def is_extractor(self) -> bool:
        return self.json_schema is not None and self.parent_task_id is not None

    @property
    def printed(self) -> bool:
        """Whether its run printed anything (an end with no output has nothing to extract)."""
        return bool((self.exited or {}).get("lines"))

    @property
    def started(self) -> bool:
        return (self.exited or {}).get("spawned", True) is not False


def route(ended: Ended, *, extract: bool) -> Step:
    """The step an end calls for (pure)."""
    if ended.thread_turn:
        # a deploy is never the turn's fault, and the messages it carried must not be dropped
        if ended.status == "crashed" and ended.status_reason == SHUTDOWN:
            return Step.RERUN_TURN
        # ended while it waited on the user, past PETAL_MAX_PARKED: a boundary, not a failure (the answer resumes it)
        if ended.status_reason == PARKED:
            return Step.TELL_THREAD
        return Step.TELL_THREAD if ended.status == "success" else Step.TURN_FAILED
    if not extract:
        return Step.NOTHING
    if ended.is_extractor:
        return Step.GATE
    if ended.extract_on_exit and ended.printed:
        return Step.EXTRACT
    if ended.thread_id is not None:
        return Step.POLICY
    return Step.NOTHING


def retry_delay(failures: int, base_s: float, cap_s: float) -> float:
    """How long a settlement that failed `failures` times in a row waits before the next try (pure)."""
    return min(cap_s, base_s * 2.0 ** max(0, failures - 1))


class Settler:
    def __init__(self, pool: AsyncConnectionPool, config: SettlerConfig, on_settled: Callable[[], None] = lambda: None):
        self.pool = pool
        self.q = Queries(pool, queries)
        self.config = config
        self.on_settled = on_settled  # the threads loop: a turn boundary or a harness message waits for it
        self.escalations = settlement.Settlement(pool)
        # task id → (failures in a row, monotonic time of the next try); memory only, the store keeps the work
        self._failures: dict[uuid.UUID, tuple[int, float]] = {}

    async def run(self, sub: Subscription) -> None:
        await consume.consume("settler", sub, self.passes_by_channel(), self.config.poll_interval_s,
                              database.availability(self.pool))

    def passes_by_channel(self) -> dict[str, list[consume.Pass]]:
        return {
            # an approval is owed also when its worker was stopped meanwhile (a status change)
            "task_ended": [self.settle_pending, self.apply_approvals],
            # only for the questions these passes act on (migration 0035): not on every answer
            "question_settle": [self.apply_escalations, self.apply_approvals, self.deliver_late_answers],
            consume.POLL_ONLY: [self.record_leftover_changes],  # rare by construction
        }

    # ---- the passes: each does one batch and says whether it found work (consume runs it again) -------

    async def settle_pending(self) -> int:
        """Settle every ended task not yet settled (those whose last try failed wait for their retry time);
        returns how many were settled."""
        settled = 0
        tried: set[uuid.UUID] = set()
        while True:
            now = time.monotonic()
            skip = tried | {tid for tid, (_, at) in self._failures.items() if at > now}
            result = await self._settle_one(list(skip))
            if result is None:
                return settled
            task_id, ok = result
            tried.add(task_id)
            settled += ok

    async def apply_escalations(self) -> int:
        return self._told(await self.escalations.apply_escalations())

    async def apply_approvals(self) -> int:
        return self._told(await approvals.apply_answered(self.pool))

    async def deliver_late_answers(self) -> int:
        return self._told(await approvals.deliver_late_answers(self.pool))

    async def record_leftover_changes(self) -> bool:
        """Record the changes of one end settled without them; whether there was one."""
        async with self.q.transaction() as tx:
            row = await tx.one("claim_unrecorded_changes")
            if row is None:
                return False
            events = await changes.record_on(tx.conn, row["id"], keep_worktree=self.config.keep_worktrees)
            if events:
                await journal.append_on(tx.conn, events)
        return True

    def _told(self, acted: int) -> int:
        if acted:
            self.on_settled()  # the harness messages it enqueued wait for a turn boundary
        return acted

    async def _settle_one(self, skip: list[uuid.UUID]) -> tuple[uuid.UUID, bool] | None:
        ended: Ended | None = None
        step = Step.NOTHING
        try:
            async with self.q.transaction() as tx:
                ended = await tx.one("claim_unsettled_task", {"skip": skip}, into=Ended)
                if ended is None:
                    return None
                step = route(ended, extract=self.config.extract)
                # first: an extractor's gate reads the changes for the handoff's artifacts
                events = await changes.record_on(tx.conn, ended.id, keep_worktree=self.config.keep_worktrees) \
                    if ended.changes_due else []
                events += await self._carry_out(tx.conn, ended, step)
                await tx.execute("mark_task_settled", {"id": ended.id})
                if events:  # last: the journal head stays locked until the commit
                    await journal.append_on(tx.conn, events)
        except Exception:
            if ended is None:
                raise  # the claim itself failed: the pass fails and the loop retries
            failures = self._failures.get(ended.id, (0, 0.0))[0] + 1
            delay = retry_delay(failures, self.config.retry_base_s, self.config.retry_cap_s)
            self._failures[ended.id] = (failures, time.monotonic() + delay)
            # rolled back: the end stays unsettled, and is tried again after the delay
            log.exception("settlement_failed", task_id=str(ended.id), step=str(step), failures=failures,
                          retry_in_s=delay)
            return ended.id, False
        self._failures.pop(ended.id, None)
        log.info("task_settled", task_id=str(ended.id), status=ended.status, step=str(step))
        if step is not Step.NOTHING:
            self.on_settled()
        return ended.id, True

    async def _carry_out(self, conn: AsyncConnection[Any], ended: Ended, step: Step) -> list[NewEvent]:
        if step is Step.GATE:
            gated = await extraction.gate_on(conn, {"id": ended.id, "status": ended.status,
                                                    "status_reason": ended.status_reason,
                                                    "parent_task_id": ended.parent_task_id,
                                                    "json_schema": ended.json_schema})
            if gated is None:
                return []
            return [*gated.events, *await settlement.apply_policy(
                conn, gated.worker_id, gated.record_type, gated.payload, backoff_base_s=self.config.backoff_base_s)]
        if step is Step.EXTRACT:
            unit = Work(conn, queries)
            await extraction.request_on(unit, ended.id)
            return unit.take()
        if step is Step.POLICY:
            return await settlement.apply_policy(
                conn, ended.id, "task.exited", {"status": ended.status, "reason": ended.status_reason},
                backoff_base_s=self.config.backoff_base_s, started=ended.started)
        if step is Step.RERUN_TURN:
            _, events = await settlement.rerun_turn(conn, ended.id, requested_by="settler",
                                                    reason=ended.status_reason)
            return events
        if step is Step.TURN_FAILED:
            return await settlement.apply_turn_policy(conn, ended.id, backoff_base_s=self.config.backoff_base_s,
                                                      started=ended.started)
        return []  # TELL_THREAD: nothing to write; the threads loop reads the boundary from the store
