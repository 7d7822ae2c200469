"""Reconciliation at start-up (and after a rejoin): nothing of a dead run of this executor stays "running"."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

from executor.journal.writer import JournalWriter
from executor.run import process, substrate
from executor.run.fleet import Lease
from executor.run.task_store import TaskStore
from shared import logs
from shared.models import NewEvent

log = logs.get(__name__)

# At start-up, how long a dead executor's leftover processes get to end on their own (its CLI was sent
# SIGTERM by its parent-death signal and takes about two seconds to end its Bash children) before SIGKILL.
ORPHAN_GRACE_S = 5.0


async def reconcile(store: TaskStore, writer: JournalWriter, lease: Lease, labels: tuple[str, ...],
                    stale_s: float) -> dict[str, Any]:
    """The dead run's tasks become crashed, their surviving processes are killed, claimed queue rows go
    back to pending, their questions close. `stale_s`: with other executors alive, a claimed row is taken
    back only when it was claimed longer ago than this (a lease)."""
    orphans = await store.orphaned_tasks(lease.name)
    events: list[NewEvent] = []
    crashed = []
    for task in orphans:
        survivors = await asyncio.to_thread(process.find_by_env, substrate.TASK_ENV_VAR, str(task.id))
        killed = await asyncio.to_thread(process.reap_orphans, survivors, ORPHAN_GRACE_S)
        # durable in the journal before the row says crashed: the settler acts on the row at once
        await writer.write([NewEvent("task.crashed", {"reason": "executor_restart", "status": "crashed",
                                                      "killed_pids": killed},
                                     task_id=task.id, session_id=task.session_id, project_id=task.project_id)])
        await store.crash(task.id, "executor_restart")
        crashed.append(str(task.id))
    requeued = await store.requeue_claimed(lease.name, stale_s)
    closed = await store.cancel_orphaned_questions()
    for q in closed:
        events.append(NewEvent("question.cancelled", {"question_id": str(q.id), "reason": "executor_restart"},
                               task_id=q.task_id))
    summary = {"crashed_tasks": crashed, "requeued": asdict(requeued),
               "cancelled_questions": [str(q.id) for q in closed]}
    events.append(NewEvent("executor.started", {"reconciled": summary, "name": lease.name,
                                                "epoch": lease.epoch, "labels": list(labels)}))
    await writer.write(events)
    log.info("executor_reconciled", **summary)
    # A task that died with the old executor ended like any other: its final status is all that is
    # written here; the settler (executor/settle/settler.py) acts on the end (the policy, the thread).
    return summary
