"""The bookkeeping of sandboxes started ahead (executor/run/spawn/ahead_pool.py): which threads get one, when one is
taken, ended unused or at the stop, and the spares' loop, on a clock moved by hand (no test waits on real time but
to let the loop run). Processes are stand-ins; the real sandbox's side is tests/e2e/test_ahead.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from structlog.testing import capture_logs

from executor.run.spawn.ahead_pool import (
    IDLE_S,
    MAX_AHEAD,
    SPARE_AGE_S,
    SPARE_REFILL_S,
    SPARE_RETRY_S,
    Ahead,
    AheadPool,
    SpareStale,
)
from shared import timers
from tests.wait import one_step, until

pytestmark = pytest.mark.unit

T = TypeVar("T")

HERE = "host-1"


class _Proc:
    def __init__(self) -> None:
        self.returncode: int | None = None
        self._exited = asyncio.Event()

    def exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode


class _Starter:
    def __init__(self, clock: timers.ManualClock, *, fail: bool = False) -> None:
        self.clock = clock
        self.started: list[Ahead] = []
        self.ended: list[tuple[uuid.UUID | None, str]] = []
        self.fail = fail
        self.unlinkable: set[uuid.UUID] = set()  # conversations no spare can take (a side directory)
        self.link_error: BaseException | None = None  # what linking raises (a stale spare, a failed link)

    async def start(self, session_id: uuid.UUID | None, role: str) -> Ahead | None:
        await asyncio.sleep(0)  # its start takes a moment
        if self.fail:
            raise OSError("no sandbox")
        stand_in: Any = None
        made = Ahead(session_id=session_id, role=role, spawn_id=uuid.uuid4(), proc=_Proc(),  # type: ignore[arg-type]
                     command=stand_in, program="claude", workdir=Path("."), mcp_config=None, digest=None,
                     gateway=stand_in, transcript=(1, 1), spare=session_id is None, started=self.clock.now())
        self.started.append(made)
        return made

    async def link(self, spare: Ahead, session_id: uuid.UUID) -> Ahead | None:
        await one_step()
        if self.link_error is not None:
            raise self.link_error
        return None if session_id in self.unlinkable else dataclasses.replace(spare, session_id=session_id)

    async def end(self, ahead: Ahead, reason: str) -> None:
        self.ended.append((ahead.session_id, reason))


def _pool(starter: _Starter, enabled: bool = True, spares: int = 0) -> AheadPool:
    return AheadPool(starter, enabled=enabled, pinned_here=lambda name: name == HERE, spares=spares,
                     clock=starter.clock)


def _starter(*, fail: bool = False) -> _Starter:
    return _Starter(timers.ManualClock(), fail=fail)


async def _soon(check: Callable[[], T | None], what: str) -> T:
    """`check()`'s value once the loop has run what is due now (the clock stands still meanwhile)."""
    return await until(check, what, timeout=5, every=0)


async def test_a_thread_pinned_here_gets_one_which_its_turn_takes_once() -> None:
    starter = _starter()
    pool = _pool(starter)
    thread = uuid.uuid4()
    pool.turn_coming(thread, "orchestrator", HERE)
    pool.turn_coming(thread, "orchestrator", HERE)  # a second message before the turn: still one
    taken = await pool.take(thread)
    assert taken is not None and taken.session_id == thread and len(starter.started) == 1
    assert await pool.take(thread) is None  # the turn's now
    await pool.close()
    assert starter.ended == []  # a taken one is the run's to end


async def test_none_for_a_thread_pinned_elsewhere_or_not_yet_pinned_or_with_it_off() -> None:
    starter = _starter()
    pool, off = _pool(starter), _pool(starter, enabled=False)
    elsewhere, unpinned, thread = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    pool.turn_coming(elsewhere, "orchestrator", "host-2")
    pool.turn_coming(unpinned, "orchestrator", None)
    off.turn_coming(thread, "orchestrator", HERE)
    assert [await pool.take(elsewhere), await pool.take(unpinned), await off.take(thread)] == [None] * 3
    assert starter.started == []


async def test_one_not_taken_in_time_is_ended() -> None:
    starter = _starter()
    pool = _pool(starter)
    thread = uuid.uuid4()
    pool.turn_coming(thread, "orchestrator", HERE)
    await starter.clock.asleep(at=IDLE_S)
    starter.clock.advance(IDLE_S - 1)
    await one_step()
    assert starter.ended == [] and len(starter.started) == 1
    starter.clock.advance(1)
    await _soon(lambda: starter.ended, "the idle one to be ended")
    assert starter.ended == [(thread, "not_taken")] and await pool.take(thread) is None


async def test_one_that_died_is_ended_not_used_and_one_that_failed_to_start_is_none() -> None:
    starter = _starter()
    pool = _pool(starter)
    thread = uuid.uuid4()
    pool.turn_coming(thread, "orchestrator", HERE)
    await pool.starting[thread]
    starter.started[0].proc.returncode = 1  # type: ignore[misc]
    assert await pool.take(thread) is None
    await pool.close()
    assert starter.ended == [(thread, "died")]
    failing = _pool(_starter(fail=True))
    failing.turn_coming(thread, "orchestrator", HERE)
    assert await failing.take(thread) is None


async def test_at_most_max_ahead_and_the_stop_ends_every_one_not_taken() -> None:
    starter = _starter()
    pool = _pool(starter)
    threads = [uuid.uuid4() for _ in range(MAX_AHEAD + 2)]
    for t in threads:
        pool.turn_coming(t, "orchestrator", HERE)
    await pool.close()
    assert sorted(str(s) for s, _ in starter.ended) == sorted(str(t) for t in threads[:MAX_AHEAD])
    assert {r for _, r in starter.ended} == {"executor_stopping"}
    pool.turn_coming(uuid.uuid4(), "orchestrator", HERE)  # none after the stop
    assert len(starter.started) == MAX_AHEAD


# ---- spares: the pool's loop --------------------------------------------------------------------------------


async def _spares_up(pool: AheadPool, n: int = 1) -> list[Ahead]:
    def up() -> list[Ahead] | None:
        ready = [a for a in (f.result() for f in pool.spares if f.done()) if a is not None]
        return ready if len(ready) >= n else None
    return await _soon(up, f"{n} spare(s) up")


@contextlib.asynccontextmanager
async def _running(pool: AheadPool) -> AsyncIterator[timers.ManualClock]:
    """The pool's loop running (on the starter's clock, yielded); closed after, its loop proved ended."""
    assert isinstance(pool.clock, timers.ManualClock)
    running = asyncio.create_task(pool.run())
    try:
        yield pool.clock
    finally:
        await pool.close()
        async with asyncio.timeout(5):
            await running  # ends on the close: a loop that needed cancelling would hang here


@contextlib.asynccontextmanager
async def _with_a_spare(starter: _Starter) -> AsyncIterator[tuple[AheadPool, Ahead]]:
    """A pool keeping one spare, its loop running, taught the role by a first turn; the spare once up. Closed
    after, its loop ended."""
    pool = _pool(starter, spares=1)
    async with _running(pool) as clock:
        pool.turn_coming(uuid.uuid4(), "orchestrator", HERE)
        await clock.asleep(at=SPARE_REFILL_S)
        clock.advance(SPARE_REFILL_S)
        [spare] = await _spares_up(pool)
        yield pool, spare


async def test_a_spare_is_started_once_a_turn_taught_the_role_and_the_next_thread_takes_it_then_it_is_refilled(
        ) -> None:
    starter = _starter()
    pool = _pool(starter, spares=1)
    async with _running(pool) as clock:
        assert await clock.asleep() == [SPARE_AGE_S]  # no turn yet: the role of a spare is not known
        first, second = uuid.uuid4(), uuid.uuid4()
        pool.turn_coming(first, "orchestrator", None)  # a new thread's first turn (not pinned yet) teaches the role
        assert await pool.take(first) is None  # not pinned here yet: no sandbox of its own
        assert await clock.asleep(at=SPARE_REFILL_S) == [SPARE_REFILL_S]  # after the turn's CLI has started
        clock.advance(SPARE_REFILL_S / 2)
        await one_step()
        assert starter.started == []
        clock.advance(SPARE_REFILL_S / 2)
        [spare] = await _spares_up(pool)
        assert spare.session_id is None and spare.spare and spare.role == "orchestrator"
        assert await clock.asleep(at=SPARE_REFILL_S + SPARE_AGE_S)  # up: looked at again when it is old
        pool.turn_coming(second, "orchestrator", HERE)
        taken = await pool.take(second)
        assert taken is not None and taken.spawn_id == spare.spawn_id and taken.session_id == second and taken.spare
        await clock.asleep(at=2 * SPARE_REFILL_S)  # another one for the next message, once the taker's CLI started
        assert pool.spares == []
        clock.advance(SPARE_REFILL_S)
        [refill] = await _spares_up(pool)
        assert refill.spawn_id != spare.spawn_id
    assert (None, "executor_stopping") in starter.ended  # the stop ended the spare
    assert all(s != second for s, _ in starter.ended)  # the taken one is the run's


async def test_a_conversation_a_spare_cannot_take_gets_its_own_and_the_spare_stays() -> None:
    starter = _starter()
    async with _with_a_spare(starter) as (pool, spare):
        side = uuid.uuid4()
        starter.unlinkable.add(side)
        pool.turn_coming(side, "orchestrator", HERE)
        own = await pool.take(side)
        assert own is not None and own.session_id == side and not own.spare
        assert [f.result() for f in pool.spares] == [spare]  # kept for another thread
        other = uuid.uuid4()
        pool.turn_coming(other, "orchestrator", HERE)
        assert (taken := await pool.take(other)) is not None and taken.spawn_id == spare.spawn_id


async def test_a_spare_that_died_is_ended_once_it_exits_replaced_after_the_retry_wait_and_never_handed_over() -> None:
    starter = _starter()
    async with _with_a_spare(starter) as (pool, spare):
        clock = starter.clock
        clock.advance(10.0)
        spare.proc.exit(1)  # type: ignore[attr-defined]
        # its exit is seen at once (not when it would have been old): ended, another started after the retry wait
        await _soon(lambda: (None, "died") in starter.ended, "the dead spare to be ended")
        died_at = clock.now()
        await clock.asleep(at=died_at + SPARE_RETRY_S)
        clock.advance(SPARE_RETRY_S - 1)
        await one_step()
        assert [a.spawn_id for a in starter.started if a.spare] == [spare.spawn_id]
        clock.advance(1)
        [new] = await _spares_up(pool)
        assert new.spawn_id != spare.spawn_id
        new.proc.returncode = 1  # type: ignore[misc]  # dead, its exit not seen yet: not handed over either
        thread = uuid.uuid4()
        pool.turn_coming(thread, "orchestrator", HERE)
        own = await pool.take(thread)
        assert own is not None and not own.spare  # its own, started on the message


async def test_a_spare_that_could_not_start_is_tried_again_after_the_retry_wait() -> None:
    starter = _starter(fail=True)
    pool = _pool(starter, spares=1)
    with capture_logs() as logged:
        async with _running(pool) as clock:
            pool.turn_coming(uuid.uuid4(), "orchestrator", None)
            await clock.asleep(at=SPARE_REFILL_S)
            clock.advance(SPARE_REFILL_S)
            await _soon(lambda: pool.spares and pool.spares[0].done(), "the spare's start to fail")
            await clock.asleep(at=SPARE_REFILL_S + SPARE_RETRY_S)  # not again at once: it may fail again
            starter.fail = False
            clock.advance(SPARE_RETRY_S)
            [spare] = await _spares_up(pool)
            assert spare.started == SPARE_REFILL_S + SPARE_RETRY_S
    assert [e["event"] for e in logged].count("ahead_not_started") == 1


async def test_a_spare_is_replaced_once_old_and_none_is_kept_with_it_off() -> None:
    starter = _starter()
    async with _with_a_spare(starter) as (pool, spare):
        clock = starter.clock
        assert await clock.asleep(at=spare.started + SPARE_AGE_S)
        clock.advance(SPARE_AGE_S - 1)
        await one_step()
        assert starter.ended == []
        clock.advance(1.5)  # older than SPARE_AGE_S
        await _soon(lambda: (None, "spare_replaced") in starter.ended, "the old spare to be replaced")
        [new] = await _spares_up(pool)  # at once: it did not fail
        assert new.spawn_id != spare.spawn_id and new.started == spare.started + SPARE_AGE_S + 0.5
    off = _starter()
    none = _pool(off, enabled=False, spares=1)
    async with _running(none) as clock:
        none.turn_coming(uuid.uuid4(), "orchestrator", HERE)
        await clock.asleep()
        clock.advance(SPARE_AGE_S)
        await clock.asleep(at=2 * SPARE_AGE_S)
    assert off.started == []


async def test_a_look_that_fails_is_said_and_the_loop_looks_again_after_the_retry_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    starter = _starter()
    pool = _pool(starter, spares=1)
    looks: list[float] = []

    def buggy() -> float:
        looks.append(pool.clock.now())
        raise ValueError("a bug")
    monkeypatch.setattr(pool, "_keep_spares", buggy)
    with capture_logs() as logged:
        async with _running(pool) as clock:
            assert await clock.asleep() == [SPARE_RETRY_S]
            clock.advance(SPARE_RETRY_S)
            await clock.asleep(at=2 * SPARE_RETRY_S)
    assert looks == [0.0, SPARE_RETRY_S]
    assert [e["event"] for e in logged] == ["spares_not_kept", "spares_not_kept"]


@pytest.mark.parametrize(("error", "reason"), [(SpareStale("the login was replaced"), "spare_stale"),
                                               (OSError("link failed"), "link_failed")])
async def test_a_spare_that_cannot_be_handed_over_is_ended_and_the_turn_gets_its_own(
        error: BaseException, reason: str) -> None:
    starter = _starter()
    async with _with_a_spare(starter) as (pool, spare):
        starter.link_error = error
        thread = uuid.uuid4()
        pool.turn_coming(thread, "orchestrator", HERE)
        own = await pool.take(thread)  # no error reaches the turn's start
        assert own is not None and own.session_id == thread and not own.spare
        await _soon(lambda: (None, reason) in starter.ended, "the spare to be ended")
