"""asyncio helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

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
