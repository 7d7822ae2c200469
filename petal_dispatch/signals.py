"""Stopping on SIGTERM or SIGINT: how every long-running command (`up`, `executor`, `ingress`) is told to stop."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from shared import logs

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# A service whose stop outlasts its deadline logs what it is still waiting on and exits with this (EX_SOFTWARE):
# a stop that hangs (a loop that crashed, then a step of the orderly stop that never returns) would otherwise
# leave a live process that serves nothing, which `Restart=on-failure` and `up` never restart.
STOP_OVERDUE_EXIT = 70
OVERDUE_LOG_S = 5.0  # how long saying what the stop waits on may take before the process exits anyway
C = TypeVar("C")
log = logs.get(__name__)


def on_stop(stop: Callable[[], object]) -> None:
    """Call `stop()` on SIGTERM or SIGINT: through the running event loop when there is one (so `stop` may set
    an asyncio.Event), else as a plain handler (a synchronous loop polls what `stop` sets)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda signum, frame: stop())
        return
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)


def serve_until_stopped(serve: Callable[[C, asyncio.Event], Awaitable[None]], config: C, *,
                        stop_within_s: float) -> None:
    """A service's `serve(config, stop)` in a new event loop, `stop` set by SIGTERM or SIGINT, or by the
    service itself (a crashed loop). Once `stop` is set, the service has `stop_within_s` to come down: past
    that, what it still waits on is logged and the process exits with STOP_OVERDUE_EXIT."""

    stop = _Stop(stop_within_s)

    async def run() -> None:
        on_stop(stop.set)
        try:
            await serve(config, stop)
        except BaseException:
            stop.set()  # a failed start: asyncio.run's own end (tasks cancelled, threads joined) is under the deadline
            raise

    # What the imports made lives as long as the process: out of the collector's sight, a full collection walks
    # only what the service made since (it was a request's slowest milliseconds: bench_ask's POST p99 6.3 ->
    # 4.6 ms with nothing else changed).
    gc.collect()  # the imports' own garbage goes first, not frozen with them
    gc.freeze()
    try:
        asyncio.run(run())  # its own end (the default executor's threads joined) is under the deadline as well
    finally:
        stop.disarm()


class _Stop(asyncio.Event):
    """The service's `stop`: setting it, from a signal or a crashed loop, starts the deadline's timer, a thread (it
    fires even when the event loop is stuck in a blocking call); the process exits before it fires when the stop
    completes."""

    def __init__(self, within_s: float):
        super().__init__()
        self.within_s = within_s
        self.timers: list[threading.Timer] = []

    def set(self) -> None:
        super().set()
        if not self.timers:
            # the second only exits: the first's log line may itself wait (a write to a full pipe, under the
            # logger's lock, is what the stop may be stuck on)
            self.timers = [threading.Timer(self.within_s, _overdue, (asyncio.get_running_loop(), self.within_s)),
                           threading.Timer(self.within_s + OVERDUE_LOG_S, os._exit, (STOP_OVERDUE_EXIT,))]
            for timer in self.timers:
                timer.daemon = True
                timer.start()

    def disarm(self) -> None:
        for timer in self.timers:
            timer.cancel()


def _overdue(loop: asyncio.AbstractEventLoop, within_s: float) -> None:
    log.error("stop_overdue", within_s=within_s, waiting=_stacks(loop))
    sys.stderr.flush()  # where the log goes; os._exit flushes nothing
    os._exit(STOP_OVERDUE_EXIT)


def _stacks(loop: asyncio.AbstractEventLoop) -> list[str]:
    """Where each of the loop's tasks, and each thread, stands (read from this thread: for the log only)."""
    for _ in range(3):  # the set of tasks may change while it is copied
        try:
            tasks = list(asyncio.all_tasks(loop))
            break
        except RuntimeError:
            continue
    else:
        tasks = []
    found = [f"task {task.get_name()}:\n{''.join(traceback.format_list(_awaits(task)))}" for task in tasks]
    for ident, frame in sys._current_frames().items():
        if ident != threading.get_ident():
            found.append(f"thread {ident}:\n{''.join(traceback.format_stack(frame, limit=12))}")
    return found


def _awaits(task: asyncio.Task[Any]) -> traceback.StackSummary:
    """A suspended task's chain of awaits, outermost first (`Task.get_stack` gives only the outermost frame of a
    suspended coroutine): where it waits is the last line."""
    frames = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            break
        frames.append((frame, frame.f_lineno))
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return traceback.StackSummary.extract(frames)
