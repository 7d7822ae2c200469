"""The warm pool's bookkeeping (executor/run/spawn/warm_pool.py): how many, which threads, when one is ended or
replaced, and its loop's passes, on a clock moved by hand (no test waits on real time but to let the loop run).
Processes are stand-ins; the real CLI's side is tests/e2e/test_warm_turns.py."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from structlog.testing import capture_logs

from executor.run import substrate
from executor.run.spawn.warm_pool import Warm, WarmConfig, WarmPool
from executor.run.task_rows import Template
from shared import timers
from tests.wait import one_step, until

pytestmark = pytest.mark.unit

T = TypeVar("T")


class _Proc:
    """What the pool reads of a process: its return code, and a wait for it."""

    def __init__(self) -> None:
        self.returncode: int | None = None
        self.pid = 4242
        self._exited = asyncio.Event()

    def die(self) -> None:
        self.returncode = -9
        self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode


class _Starter:
    def __init__(self, clock: timers.ManualClock) -> None:
        self.clock = clock
        self.started: list[Warm] = []
        self.ended: list[tuple[uuid.UUID, str]] = []

    async def start(self, template: Template) -> Warm | None:
        proc: Any = _Proc()
        warm = Warm(session_id=template.session_id, spawn_id=uuid.uuid4(), proc=proc,
                    spec=substrate.SpawnSpec(role="orchestrator", prompt="", session_uuid=str(template.session_id)),
                    cmd=["claude"], workdir=Path("."), project_id=None, mcp_config=None, digest=None, gateway=None,
                    transcript=(1, 1), started=self.clock.now())
        self.started.append(warm)
        return warm

    async def end(self, warm: Warm, reason: str) -> None:
        if warm.proc.returncode is None:
            warm.proc.die()  # type: ignore[attr-defined]  # the stand-in's
        self.ended.append((warm.session_id, reason))


def _thread(seen_s_ago: float | None) -> Template:
    seen = None if seen_s_ago is None else datetime.now(UTC) - timedelta(seconds=seen_s_ago)
    return Template(session_id=uuid.uuid4(), project_id=None, role="orchestrator", workdir=None, allowed_tools=None,
                    seen_at=seen)


def _pool(found: list[Template], **kw: Any) -> tuple[WarmPool, _Starter]:
    clock = timers.ManualClock()
    spawner = _Starter(clock)

    async def candidates(offered: list[uuid.UUID], presence_s: float, n: int) -> list[Template]:
        known = {t.session_id for t in found}
        return found + [Template(session_id=s, project_id=None, role="orchestrator", workdir=None,
                                 allowed_tools=None, seen_at=None) for s in offered if s not in known]
    return WarmPool(WarmConfig(**{"turns": 2, "idle_s": 60, **kw}), spawner, candidates, clock=clock), spawner


async def _soon(check: Callable[[], T | None], what: str) -> T:
    """`check()`'s value once the loop has run what is due now (the clock stands still meanwhile)."""
    return await until(check, what, timeout=5, every=0)


async def test_at_most_the_configured_number_warm_the_threads_signalled_last() -> None:
    a, b, c = _thread(30), _thread(5), _thread(10)
    pool, spawner = _pool([a, b, c])
    await pool.refresh()
    assert set(pool.warm) == {b.session_id, c.session_id}
    # a turn just ended in the oldest-shown thread: it is now the likeliest, and takes the least likely's place
    pool.turn_ended(a.session_id)
    await pool.refresh()
    assert set(pool.warm) == {a.session_id, b.session_id}
    assert spawner.ended == [(c.session_id, "displaced")]


async def test_a_thread_that_stops_being_a_candidate_keeps_its_process_for_the_turn_about_to_take_it() -> None:
    a = _thread(1)
    found = [a]
    pool, spawner = _pool(found)
    await pool.refresh()
    found.clear()  # its message made it a pending turn: no candidate any more
    await pool.refresh()
    taken = pool.take(a.session_id)
    assert taken is not None and taken.alive and spawner.ended == [] and pool.warm == {}


async def test_a_dead_warm_process_is_ended_and_replaced_and_never_taken() -> None:
    a = _thread(1)
    pool, spawner = _pool([a])
    await pool.refresh()
    pool.warm[a.session_id].proc.die()  # type: ignore[attr-defined]  # the stand-in's
    await asyncio.sleep(0)  # its watcher sees the exit
    await one_step()
    await pool.refresh()
    assert len(spawner.started) == 2 and (a.session_id, "died") in spawner.ended
    replacement = pool.take(a.session_id)
    assert replacement is spawner.started[1] and replacement.alive
    # one that dies between the last pass and its message is not handed out
    await pool.refresh()
    pool.warm[a.session_id].proc.die()  # type: ignore[attr-defined]
    assert pool.take(a.session_id) is None


async def test_an_idle_warm_process_is_retired_and_not_started_again_for_the_same_signal() -> None:
    a = _thread(1)
    pool, spawner = _pool([a], idle_s=60)
    await pool.refresh()
    spawner.clock.advance(60)
    await pool.refresh()
    assert spawner.ended == []  # idle only once longer than idle_s
    spawner.clock.advance(1)
    await pool.refresh()
    assert spawner.ended == [(a.session_id, "idle")] and pool.warm == {} and len(spawner.started) == 1
    pool.turn_ended(a.session_id)  # a newer signal: warm again
    await pool.refresh()
    assert len(spawner.started) == 2


async def test_closing_ends_every_warm_process_and_starts_none() -> None:
    a, b = _thread(1), _thread(2)
    pool, spawner = _pool([a, b])
    await pool.refresh()
    await pool.close()
    await pool.run()  # after close: returns at once, starts nothing
    assert sorted(r for _, r in spawner.ended) == ["executor_stopping", "executor_stopping"]
    assert pool.warm == {} and len(spawner.started) == 2


async def test_turned_off_the_pool_starts_nothing() -> None:
    pool, spawner = _pool([_thread(1)], turns=0)
    await pool.run()
    pool.turn_ended(uuid.uuid4())
    assert spawner.started == []


async def test_a_turn_that_starts_while_a_pass_reads_or_spawns_is_not_warmed_on_stale_candidates() -> None:
    # The candidates leave out a thread with a turn under way only as of their read: a turn that takes the
    # thread's warm process meanwhile must not have a second one started beside it, reading the conversation
    # the turn is about to add to (found moved on at the next turn, and ended unused).
    a = _thread(1)
    pool, spawner = _pool([a])
    await pool.refresh()
    reading, spawning, go_on = asyncio.Event(), asyncio.Event(), asyncio.Event()
    candidates, start = pool.candidates, spawner.start

    async def slow_candidates(*args: Any) -> list[Template]:
        found = await candidates(*args)
        reading.set()
        await go_on.wait()  # the query in flight
        return found
    pool.candidates = slow_candidates
    pass_ = asyncio.create_task(pool.refresh())
    await reading.wait()
    assert pool.take(a.session_id) is spawner.started[0]  # the turn takes it while the pass reads
    go_on.set()
    await pass_
    assert len(spawner.started) == 1 and pool.warm == {}

    async def slow_spawn(template: Template) -> Warm | None:
        spawning.set()
        await go_on.wait()  # its sandbox and CLI starting
        return await start(template)
    pool.candidates = candidates
    spawner.start = slow_spawn  # type: ignore[method-assign]
    go_on.clear()
    pass_ = asyncio.create_task(pool.refresh())
    await spawning.wait()
    assert pool.take(a.session_id) is None  # a turn starts cold while the pass is spawning for its thread
    go_on.set()
    await pass_
    assert len(spawner.started) == 2 and spawner.ended == [(a.session_id, "turn_started")] and pool.warm == {}
    await pool.refresh()  # the next pass (the turn's end) warms it again
    assert len(spawner.started) == 3 and set(pool.warm) == {a.session_id}


# ---- the loop ----------------------------------------------------------------------------------------------


class _Passes:
    """The clock's time at each pass of a pool's loop (each reads its candidates once)."""

    def __init__(self, pool: WarmPool) -> None:
        self.at: list[float] = []
        self.fails: BaseException | None = None
        read = pool.candidates

        async def counted(*args: Any) -> list[Template]:
            self.at.append(pool.clock.now())
            if self.fails is not None:
                raise self.fails
            return await read(*args)
        pool.candidates = counted


@contextlib.asynccontextmanager
async def _running(pool: WarmPool) -> AsyncIterator[tuple[timers.ManualClock, _Passes]]:
    """The pool's loop running on its clock; closed after, its loop proved ended."""
    assert isinstance(pool.clock, timers.ManualClock)
    passes = _Passes(pool)
    running = asyncio.create_task(pool.run())
    try:
        yield pool.clock, passes
    finally:
        await pool.close()
        async with asyncio.timeout(5):
            await running  # ends on the close: a loop that needed cancelling would hang here


async def test_the_loop_passes_at_once_then_every_poll_and_at_once_on_a_turns_end() -> None:
    a = _thread(1)
    pool, spawner = _pool([a], poll_s=2.0)
    async with _running(pool) as (clock, passes):
        assert await clock.asleep() == [2.0] and passes.at == [0.0] and set(pool.warm) == {a.session_id}
        clock.advance(1.5)
        await one_step()
        assert passes.at == [0.0]
        clock.advance(0.5)
        assert await clock.asleep(at=4.0) == [4.0] and passes.at == [0.0, 2.0]
        clock.advance(1.0)
        ended = uuid.uuid4()
        pool.turn_ended(ended)  # its next message is likely: warmed now, not at the next poll
        await _soon(lambda: ended in pool.warm, "the ended turn's thread warmed")
        assert await clock.asleep(at=5.0) == [5.0] and passes.at == [0.0, 2.0, 3.0]  # the poll counts from there
    assert sorted(r for _, r in spawner.ended) == ["executor_stopping", "executor_stopping"]


async def test_a_warm_process_that_exits_wakes_the_loop_and_is_replaced_before_the_next_poll() -> None:
    a = _thread(1)
    pool, spawner = _pool([a], poll_s=2.0)
    async with _running(pool) as (clock, passes):
        await clock.asleep(at=2.0)
        pool.warm[a.session_id].proc.die()  # type: ignore[attr-defined]  # the stand-in's
        await _soon(lambda: len(spawner.started) == 2, "the dead one replaced")
        assert passes.at == [0.0, 0.0] and spawner.ended == [(a.session_id, "died")]
        assert pool.warm[a.session_id] is spawner.started[1]


async def test_a_pass_that_fails_is_said_and_the_next_comes_at_the_poll() -> None:
    a = _thread(1)
    pool, _ = _pool([a], poll_s=2.0)
    with capture_logs() as logged:
        async with _running(pool) as (clock, passes):
            passes.fails = psycopg.OperationalError("the server closed the connection")
            await clock.asleep(at=2.0)  # the first pass failed
            passes.fails = ValueError("a bug")
            clock.advance(2.0)
            await clock.asleep(at=4.0)
            passes.fails = None
            clock.advance(2.0)
            await clock.asleep(at=6.0)
            assert set(pool.warm) == {a.session_id}
    assert passes.at == [0.0, 2.0, 4.0]
    assert [e["event"] for e in logged if e["event"].startswith("warm_refresh")] == [
        "warm_refresh_deferred", "warm_refresh_failed"]


async def test_close_ends_the_loop_while_a_pass_spawns_and_ends_what_it_started() -> None:
    a = _thread(1)
    pool, spawner = _pool([a])
    spawning, go_on = asyncio.Event(), asyncio.Event()
    start = spawner.start

    async def slow_spawn(template: Template) -> Warm | None:
        spawning.set()
        await go_on.wait()  # its sandbox and CLI starting
        return await start(template)
    spawner.start = slow_spawn  # type: ignore[method-assign]
    running = asyncio.create_task(pool.run())
    await spawning.wait()
    closing = asyncio.create_task(pool.close())  # waits for the pass under way
    await one_step()
    assert not closing.done()
    go_on.set()
    async with asyncio.timeout(5):
        await closing
        await running
    assert spawner.ended == [(a.session_id, "executor_stopping")] and pool.warm == {}
