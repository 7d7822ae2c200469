"""The supervisor's side tasks (executor/run/supervisor.py) in its task group, watched as procrastinate's worker
watches its own: one that fails, or returns while the run goes on, is logged and ends the run, never lost."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from shared import aio, logs

log = logs.get(__name__)


class SideTaskEnded(RuntimeError):
    """A side task of the supervisor returned although nobody stopped it."""


class SideTasks:
    """The supervisor's side tasks in its task group. One that fails is logged and fails the group (the claim
    loop is cancelled at once and the run ends in order); one that returns while the run goes on (unless it
    may) fails it too: a side task is never lost silently."""

    def __init__(self, group: asyncio.TaskGroup, closing: asyncio.Event):
        self.group = group
        self.closing = closing
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, name: str, loop: Coroutine[Any, Any, None], *, may_end: bool = False) -> None:
        task = self.group.create_task(self._watched(name, loop, may_end), name=name)
        # a run stopped before the task first ran cancels it unstarted: its loop, never awaited, is closed (else
        # "coroutine ... was never awaited" when it is collected); a loop that ran is finished by then (a no-op)
        task.add_done_callback(lambda _: loop.close())
        self.tasks.append(task)

    async def _watched(self, name: str, loop: Coroutine[Any, Any, None], may_end: bool) -> None:
        try:
            await loop
        except Exception:
            log.exception("supervisor_side_task_failed", task=name)
            raise
        if not may_end and not self.closing.is_set():
            log.error("supervisor_side_task_ended", task=name)
            raise SideTaskEnded(f"the supervisor's {name} task ended on its own")

    async def cancel(self) -> None:
        """Cancel them all and wait for their ends (one that swallowed its cancellation is cancelled again)."""
        await aio.cancel_and_wait(*self.tasks)


def first_error(failed: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first error of a task group's (the rest were logged where they happened)."""
    first = failed.exceptions[0]
    return first_error(first) if isinstance(first, BaseExceptionGroup) else first
