"""asyncio helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def wait_for(aw: Awaitable[T], seconds: float) -> T:
    """Like asyncio.wait_for (raises TimeoutError), but runs `aw` in the calling task.

    Python 3.11's asyncio.wait_for can swallow a cancellation that lands as the inner await finishes
    (it returns the result instead of raising CancelledError), so a `while True` loop around it may
    never stop; asyncio.timeout() cancels only what it started and re-raises anyone else's cancel.
    """
    async with asyncio.timeout(seconds):
        return await aw


async def cancel_and_wait(*tasks: asyncio.Task[Any], again_s: float = 0.5) -> None:
    """Cancel the tasks and wait until each has ended, cancelling again one that goes on: Python 3.11's
    asyncio.wait_for (psycopg_pool waits for a connection in one) swallows a cancellation that lands as its wait
    ends, and a loop cancelled once then ran on, and whoever waited for it waited forever. Their errors are read
    (the caller reports them its own way), not raised."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=again_s)
    for t in tasks:
        if not t.cancelled():
            t.exception()


def raise_if_cancelled() -> None:
    """Raise CancelledError if the current task was cancelled though nothing raised it (a callee swallowed it, as
    above): a loop calls this at each step, so it ends there rather than running on."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def resolved(value: T) -> T:
    """An awaitable of a value at hand (a branch of a gather that has nothing to ask)."""
    return value


# work `finished` goes on with after its caller went: kept referenced until done
_detached: set[asyncio.Task[Any]] = set()


def _settled(task: asyncio.Task[Any]) -> None:
    _detached.discard(task)
    if not task.cancelled():
        task.exception()  # read, so an error no one waits for is not reported as never retrieved


async def finished(coro: Coroutine[Any, Any, T], *, detached_s: float) -> T:
    """Await `coro` in a task of its own that a cancellation of the caller does not interrupt: the caller is
    cancelled at once, the work runs to its end, or is cancelled (once, as plain asyncio does) `detached_s`
    after its caller went. For a short query whose interruption costs more than it saves (psycopg closes a
    connection whose query a repeated cancellation interrupts, as anyio's cancel scopes deliver it). Its
    error, once no one waits, is dropped."""
    task = asyncio.ensure_future(coro)
    _detached.add(task)
    task.add_done_callback(_settled)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            handle = asyncio.get_running_loop().call_later(detached_s, task.cancel)
            task.add_done_callback(lambda _: handle.cancel())
        raise
