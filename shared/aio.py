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


async def resolved(value: T) -> T:
    """An awaitable of a value at hand (a branch of a gather that has nothing to ask)."""
    return value


async def finished(coro: Coroutine[Any, Any, T]) -> T:
    """Await `coro` in a task of its own that a cancellation of the caller does not interrupt: the caller is
    cancelled at once, the work runs to its end. For a short query whose interruption costs more than it
    saves (psycopg closes a connection whose query was cancelled mid-flight). Its error, once no one waits,
    is dropped."""
    task = asyncio.ensure_future(coro)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return await asyncio.shield(task)
