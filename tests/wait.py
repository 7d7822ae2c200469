"""Waiting in tests: for a condition, with a deadline. A fixed sleep standing in for a condition is slow when
the machine is idle and flaky when it is loaded; a fixed sleep is right only for a window in which something
must *not* happen."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, overload

T = TypeVar("T")


def _said(what: str | Callable[[], str]) -> str:
    return what() if callable(what) else what  # a callable is read only on failure (logs, the last rows)


# The first overload takes a check that returns a coroutine, the second any other; the first's `| None` makes
# both read the same for a coroutine, so mypy does not give up (and answer Any) when the result holds an Any.
# A check says "not yet" with None (or any falsy value); a coroutine check whose value holds an Any (JSON, a
# row) keeps its type when it is declared `-> X | None`.
@overload
async def until(check: Callable[[], Coroutine[Any, Any, T | None] | None], what: str | Callable[[], str],
                timeout: float = 120, every: float = 0.1) -> T: ...
@overload
async def until(check: Callable[[], T | None], what: str | Callable[[], str], timeout: float = 120,
                every: float = 0.1) -> T: ...
async def until(check: Callable[[], object], what: str | Callable[[], str], timeout: float = 120,
                every: float = 0.1) -> object:
    """`check()`'s first truthy value (`check` may return an awaitable); fails naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {_said(what)}")
        await asyncio.sleep(every)


def until_blocking(check: Callable[[], T | None], what: str | Callable[[], str], timeout: float = 120,
                   every: float = 0.1) -> T:
    """`until` for a test with no event loop of its own."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {_said(what)}")
        time.sleep(every)
    return value


async def one_step() -> None:
    """Let every task that is ready run one step: a yield to the event loop, not a wait on the clock (a unit test
    orders its own tasks with it; nothing outside the process is waited for)."""
    await asyncio.sleep(0)
