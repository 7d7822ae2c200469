"""Work an HTTP request leaves for after its response: run once the response is sent.

What a handler writes that its client does not wait for (an answered question's record, its task's activity
set back) competes with the response on its way out when it runs as the handler returns: the executor's loop
and the machine's two cores serve its queries first, and the response waits. `AfterResponse`, an ASGI
middleware, gives each request a list; `defer` puts work on it (the request's context reaches the tasks the
handler runs in), and the middleware runs the list in order once the app has returned — the response sent,
or the request ended otherwise — in a task of its own, which a cancelled request does not cancel. Work put
after that, or outside a request, runs at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar

from starlette.types import ASGIApp, Receive, Scope, Send

Work = Callable[[], Awaitable[None]]


class _Later:
    def __init__(self) -> None:
        self.work: list[tuple[Work, asyncio.Future[None]]] = []
        self.closed = False


_later: ContextVar[_Later | None] = ContextVar("after_response", default=None)
_running: set[asyncio.Task[None]] = set()  # referenced until done


def in_request() -> bool:
    """Whether `defer` would wait for a response (inside a request the middleware serves, not yet ended)."""
    later = _later.get()
    return later is not None and not later.closed


def defer(work: Work) -> asyncio.Future[None]:
    """`work` run once the current request's response is sent (at once outside one); a future of its outcome."""
    later = _later.get()
    if later is None or later.closed:
        return asyncio.ensure_future(_call(work))
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    later.work.append((work, done))
    return done


async def _call(work: Work) -> None:
    await work()


async def _run(later: _Later) -> None:
    for i, (work, done) in enumerate(later.work):
        try:
            await work()
        except asyncio.CancelledError:  # the loop is ending: none of the rest runs, and each says so
            for _, rest in later.work[i:]:
                rest.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - each outcome goes to its own future
            done.set_exception(exc)
        else:
            done.set_result(None)


class AfterResponse:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        later = _Later()
        token = _later.set(later)
        try:
            await self.app(scope, receive, send)
        finally:
            _later.reset(token)
            later.closed = True
            if later.work:
                task = asyncio.ensure_future(_run(later))
                _running.add(task)
                task.add_done_callback(_running.discard)
