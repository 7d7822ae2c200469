"""The supervisor's side tasks (executor/run/side_tasks.py): one that fails or ends on its own is logged and ends
the run at once (the body of the task group is cancelled and its cleanup runs), never lost silently."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from structlog.testing import capture_logs

from executor.run.side_tasks import SideTaskEnded, SideTasks, first_error
from shared import aio
from tests.wait import one_step


async def forever() -> None:
    await asyncio.Event().wait()


async def run_with(side_task: BaseException | None) -> tuple[BaseException, list[str]]:
    """A run whose body waits forever beside `side_task` and a well-behaved one: what it raised, and what its
    cleanup saw (the body's finally runs before the group ends)."""
    closing = asyncio.Event()
    seen: list[str] = []

    async def failing() -> None:
        await one_step()
        if side_task is not None:
            raise side_task

    try:
        async with asyncio.timeout(5), asyncio.TaskGroup() as group:
            side = SideTasks(group, closing)
            side.start("fine", forever())
            side.start("odd", failing())
            try:
                await forever()
            finally:
                seen.append("cleanup")
                closing.set()
                await side.cancel()
    except BaseExceptionGroup as failed:
        return first_error(failed), seen
    raise AssertionError("the run ended without an error")


async def test_a_side_task_that_fails_is_logged_and_ends_the_run_with_its_error() -> None:
    with capture_logs() as logged:
        raised, seen = await run_with(ValueError("a bug"))
    assert isinstance(raised, ValueError) and str(raised) == "a bug" and seen == ["cleanup"]
    assert [(e["event"], e["task"]) for e in logged] == [("supervisor_side_task_failed", "odd")]


async def test_a_side_task_that_returns_while_the_run_goes_on_ends_it() -> None:
    with capture_logs() as logged:
        raised, seen = await run_with(None)
    assert isinstance(raised, SideTaskEnded) and "odd" in str(raised) and seen == ["cleanup"]
    assert [(e["event"], e["task"]) for e in logged] == [("supervisor_side_task_ended", "odd")]


async def test_a_side_task_that_may_end_ends_alone_and_the_run_goes_on() -> None:
    closing = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        side = SideTasks(group, closing)
        side.start("fine", forever())
        side.start("warm-turns", one_step(), may_end=True)  # as the warm loop with no warm turns asked
        await asyncio.wait([side.tasks[1]])
        await one_step()
        assert not side.tasks[0].done()  # the run goes on
        closing.set()
        await side.cancel()


async def test_a_side_task_that_returns_once_the_run_is_closing_is_no_failure() -> None:
    closing = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        side = SideTasks(group, closing)
        ended = asyncio.Event()

        async def until_closed() -> None:
            await ended.wait()

        side.start("spares", until_closed())
        closing.set()
        ended.set()  # as a pool's loop returns once it is closed
    assert side.tasks[0].done() and side.tasks[0].exception() is None


def test_the_first_error_of_nested_groups_is_the_one_raised() -> None:
    inner = BaseExceptionGroup("inner", [KeyError("k"), ValueError("v")])
    assert isinstance(first_error(BaseExceptionGroup("outer", [inner, RuntimeError("r")])), KeyError)


@pytest.mark.parametrize("closing", [False, True])
async def test_cancelling_the_side_tasks_ends_them_quietly(closing: bool) -> None:
    flag = asyncio.Event()
    if closing:
        flag.set()
    with capture_logs() as logged:
        async with asyncio.TaskGroup() as group:
            side = SideTasks(group, flag)
            side.start("watchdog", forever())
            await one_step()
            await side.cancel()
    assert logged == [] and side.tasks[0].cancelled()


async def test_a_run_stopped_before_its_side_tasks_ran_leaves_no_loop_never_awaited() -> None:
    closing = asyncio.Event()
    loop = forever()
    async with asyncio.TaskGroup() as group:
        side = SideTasks(group, closing)
        side.start("unstarted", loop)
        closing.set()
        await side.cancel()  # before the task got its first step: its loop never ran
    assert inspect.getcoroutinestate(loop) == inspect.CORO_CLOSED  # not left for the collector to warn about


async def test_a_task_that_swallows_its_cancellation_is_cancelled_again_until_it_ends() -> None:
    """As a loop whose wait for a pool connection (Python 3.11's asyncio.wait_for) swallowed the cancel: one cancel
    and a wait for its end waited forever (the executor's stop once did)."""
    swallowed = asyncio.Event()

    async def swallows_once() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.set()
        await asyncio.Event().wait()  # runs on as if never cancelled

    task = asyncio.create_task(swallows_once())
    await one_step()
    async with asyncio.timeout(5):
        await aio.cancel_and_wait(task, again_s=0.05)
    assert swallowed.is_set() and task.cancelled()

