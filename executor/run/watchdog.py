"""The watchdog: which running task is stalled, blocked on its user, or past its runtime cap.

`assess` is the whole judgement, pure (a running task's facts and the clock in, a verdict out); the
`Watchdog` loop gathers the facts, applies the verdicts and brings the rows up to date (through
`TaskStore.save_activity`, the one writer of `tasks.activity`). It looks every interval, on a timer
(shared/timers.py): an outage is waited out (silence is still watched from memory; the rows catch up when
the database is back), a failed look is logged and the next one comes."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from executor.journal.writer import JournalWriter
from executor.run.task_store import TaskStore
from shared import timers
from shared.database import Availability
from shared.models import NewEvent

if TYPE_CHECKING:
    from executor.run.running import Running
    from executor.run.task_run import TaskRunner

RUNNING, AWAITING_USER, STALLED = "running", "awaiting_user", "stalled"
MAX_RUNTIME = "max_runtime"  # the stop reason of a run past its cap


@dataclass(frozen=True)
class Limits:
    # silence longer than this marks a running task stalled (a separate limit from max_runtime_s)
    stall_timeout_s: float
    max_runtime_s: float | None = None


@dataclass(frozen=True)
class Watched:
    """What the watchdog knows of one live run (monotonic seconds)."""

    started: float
    last_output: float
    stalled_since: float | None
    awaiting_user: bool  # as last recorded
    asking: bool  # a question of its own is pending now


@dataclass(frozen=True)
class Verdict:
    stop: str | None  # a stop reason: past the runtime cap
    activity: str | None  # the activity to record, None when it did not change
    awaiting_user: bool
    last_output: float  # silence counts from here
    stalled_since: float | None
    stalled_after_s: float | None  # set when the run just stalled: how long it had been silent


def assess(w: Watched, now: float, limits: Limits) -> Verdict:
    """One look at one live run (pure)."""
    stop = MAX_RUNTIME if limits.max_runtime_s is not None and now - w.started > limits.max_runtime_s else None
    same = Verdict(stop, None, w.awaiting_user, w.last_output, w.stalled_since, None)
    if w.stalled_since is not None:
        return same  # already said; its next output says it resumed
    if w.asking:
        # blocked on the user is not a stall; its silence starts counting when the answer lands
        return Verdict(stop, None if w.awaiting_user else AWAITING_USER, True, now, None, None)
    activity = RUNNING if w.awaiting_user else None
    silent = now - w.last_output
    if silent >= limits.stall_timeout_s:
        return Verdict(stop, STALLED, False, w.last_output, now, silent)
    return Verdict(stop, activity, False, w.last_output, None, None)


class Watchdog:
    def __init__(self, store: TaskStore, writer: JournalWriter, runner: TaskRunner,
                 runs: Callable[[], Collection[Running]], limits: Limits, interval_s: float,
                 availability: Availability, *, clock: timers.Clock = timers.MONOTONIC):
        self.store = store
        self.writer = writer
        self.runner = runner
        self.runs = runs
        self.limits = limits
        self.interval_s = interval_s
        self.clock = clock  # the runs' times are this clock's (time.monotonic)
        self.timer = timers.every("watchdog", interval_s, self.tick, clock=clock, availability=availability)

    async def run(self) -> None:
        """Look every interval until cancelled."""
        await self.timer.run()

    async def tick(self) -> None:
        now = self.clock.now()
        for r in [r for r in self.runs() if r.unsaved]:
            await self.runner.apply_unsaved(r)
        dirty = [r for r in self.runs() if r.output_dirty and r.last_output_at is not None]
        if dirty:
            for r in dirty:
                r.output_dirty = False
            await self.store.touch_output([r.task_id for r in dirty],
                                          [r.last_output_at for r in dirty if r.last_output_at is not None])
        live = [r for r in self.runs() if r.proc.returncode is None]
        if not live:
            return
        asking = await self.store.asking_tasks([r.task_id for r in live])
        for r in live:
            verdict = assess(Watched(r.started, r.last_output, r.stalled_since, r.awaiting_user,
                                     r.task_id in asking), now, self.limits)
            await self.apply(r, verdict)

    async def apply(self, r: Running, v: Verdict) -> None:
        # the run's state first, with no await since the look: its reader may move it on meanwhile
        r.awaiting_user, r.last_output, r.stalled_since = v.awaiting_user, v.last_output, v.stalled_since
        if v.stop is not None:
            await self.runner.request_stop(r, v.stop)
        if v.stalled_after_s is not None:
            await self.writer.put(NewEvent("task.stalled", {
                "silent_s": round(v.stalled_after_s, 3), "threshold_s": self.limits.stall_timeout_s},
                task_id=r.task_id, session_id=r.session_id, project_id=r.project_id))
        if v.activity is not None:
            await self.runner.set_activity(r, v.activity)
