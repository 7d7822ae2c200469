"""The bookkeeping of sandboxes started ahead (executor/run/spawn/ahead_pool.py): which threads get one, when one is
taken, ended unused or at the stop. Processes are stand-ins; the real sandbox's side is tests/e2e/test_ahead.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from executor.run.spawn import ahead_pool as ahead_module
from executor.run.spawn.ahead_pool import MAX_AHEAD, Ahead, AheadPool, SpareStale
from tests.wait import until

pytestmark = pytest.mark.unit

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
    def __init__(self, *, fail: bool = False) -> None:
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
                     gateway=stand_in, transcript=(1, 1), spare=session_id is None)
        self.started.append(made)
        return made

    async def link(self, spare: Ahead, session_id: uuid.UUID) -> Ahead | None:
        await asyncio.sleep(0)
        if self.link_error is not None:
            raise self.link_error
        return None if session_id in self.unlinkable else dataclasses.replace(spare, session_id=session_id)

    async def end(self, ahead: Ahead, reason: str) -> None:
        self.ended.append((ahead.session_id, reason))


def _pool(starter: _Starter, enabled: bool = True, spares: int = 0) -> AheadPool:
    return AheadPool(starter, enabled=enabled, pinned_here=lambda name: name == HERE, spares=spares)


async def test_a_thread_pinned_here_gets_one_which_its_turn_takes_once() -> None:
    starter = _Starter()
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
    starter = _Starter()
    pool, off = _pool(starter), _pool(starter, enabled=False)
    elsewhere, unpinned, thread = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    pool.turn_coming(elsewhere, "orchestrator", "host-2")
    pool.turn_coming(unpinned, "orchestrator", None)
    off.turn_coming(thread, "orchestrator", HERE)
    assert [await pool.take(elsewhere), await pool.take(unpinned), await off.take(thread)] == [None] * 3
    assert starter.started == []


async def test_one_not_taken_in_time_is_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ahead_module, "IDLE_S", 0.05)
    starter = _Starter()
    pool = _pool(starter)
    thread = uuid.uuid4()
    pool.turn_coming(thread, "orchestrator", HERE)
    await until(lambda: starter.ended, "the idle one to be ended", timeout=5, every=0.01)
    assert starter.ended == [(thread, "not_taken")] and await pool.take(thread) is None


async def test_one_that_died_is_ended_not_used_and_one_that_failed_to_start_is_none() -> None:
    starter = _Starter()
    pool = _pool(starter)
    thread = uuid.uuid4()
    pool.turn_coming(thread, "orchestrator", HERE)
    await pool.starting[thread]
    starter.started[0].proc.returncode = 1  # type: ignore[misc]
    assert await pool.take(thread) is None
    await pool.close()
    assert starter.ended == [(thread, "died")]
    failing = _pool(_Starter(fail=True))
    failing.turn_coming(thread, "orchestrator", HERE)
    assert await failing.take(thread) is None


async def test_at_most_max_ahead_and_the_stop_ends_every_one_not_taken() -> None:
    starter = _Starter()
    pool = _pool(starter)
    threads = [uuid.uuid4() for _ in range(MAX_AHEAD + 2)]
    for t in threads:
        pool.turn_coming(t, "orchestrator", HERE)
    await pool.close()
    assert sorted(str(s) for s, _ in starter.ended) == sorted(str(t) for t in threads[:MAX_AHEAD])
    assert {r for _, r in starter.ended} == {"executor_stopping"}
    pool.turn_coming(uuid.uuid4(), "orchestrator", HERE)  # none after the stop
    assert len(starter.started) == MAX_AHEAD


# ---- spares ----------------------------------------------------------------------------------------------


@pytest.fixture
def quick_spares(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ahead_module, "SPARE_REFILL_S", 0.01)
    monkeypatch.setattr(ahead_module, "SPARE_RETRY_S", 0.01)


async def _spares_up(pool: AheadPool, n: int = 1) -> list[Ahead]:
    def up() -> list[Ahead] | None:
        ready = [a for a in (f.result() for f in pool.spares if f.done()) if a is not None]
        return ready if len(ready) >= n else None
    return await until(up, f"{n} spare(s) up", timeout=5, every=0.01)


@contextlib.asynccontextmanager
async def _with_a_spare(starter: _Starter) -> AsyncIterator[tuple[AheadPool, Ahead]]:
    """A pool keeping one spare, its loop running, taught the role by a first turn; the spare once up. Closed
    after, its loop ended."""
    pool = _pool(starter, spares=1)
    running = asyncio.create_task(pool.run())
    pool.turn_coming(uuid.uuid4(), "orchestrator", HERE)
    [spare] = await _spares_up(pool)
    try:
        yield pool, spare
    finally:
        await pool.close()
        await running


async def test_a_spare_is_started_once_a_turn_taught_the_role_and_the_next_thread_takes_it_then_it_is_refilled(
        quick_spares: None) -> None:
    starter = _Starter()
    pool = _pool(starter, spares=1)
    running = asyncio.create_task(pool.run())
    await asyncio.sleep(0.05)
    assert starter.started == []  # no turn yet: the role of a spare is not known
    first, second = uuid.uuid4(), uuid.uuid4()
    pool.turn_coming(first, "orchestrator", None)  # a new thread's first turn (not pinned yet) teaches the role
    assert await pool.take(first) is None  # not pinned here yet: no sandbox of its own
    [spare] = await _spares_up(pool)
    assert spare.session_id is None and spare.spare and spare.role == "orchestrator"
    pool.turn_coming(second, "orchestrator", HERE)
    taken = await pool.take(second)
    assert taken is not None and taken.spawn_id == spare.spawn_id and taken.session_id == second and taken.spare
    [refill] = await _spares_up(pool)  # another one for the next message
    assert refill.spawn_id != spare.spawn_id
    await pool.close()
    await running
    assert (None, "executor_stopping") in starter.ended  # the stop ended the spare
    assert all(s != second for s, _ in starter.ended)  # the taken one is the run's


async def test_a_conversation_a_spare_cannot_take_gets_its_own_and_the_spare_stays(quick_spares: None) -> None:
    starter = _Starter()
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


async def test_a_spare_that_died_is_replaced_once_it_exits_and_never_handed_over(quick_spares: None) -> None:
    starter = _Starter()
    async with _with_a_spare(starter) as (pool, spare):
        spare.proc.exit(1)  # type: ignore[attr-defined]
        # its exit is seen at once (not when it would have been old): ended, and another one started
        await until(lambda: (None, "died") in starter.ended, "the dead spare to be ended", timeout=5, every=0.01)
        [new] = await _spares_up(pool)
        assert new.spawn_id != spare.spawn_id
        new.proc.returncode = 1  # type: ignore[misc]  # dead, its exit not seen yet: not handed over either
        thread = uuid.uuid4()
        pool.turn_coming(thread, "orchestrator", HERE)
        own = await pool.take(thread)
        assert own is not None and not own.spare  # its own, started on the message


async def test_a_spare_is_replaced_once_old_and_none_is_kept_with_it_off(
        quick_spares: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ahead_module, "SPARE_AGE_S", 0.2)
    starter = _Starter()
    async with _with_a_spare(starter) as (pool, spare):
        await until(lambda: (None, "spare_replaced") in starter.ended, "the old spare to be replaced", timeout=5,
                    every=0.01)
        [new] = await _spares_up(pool)
        assert new.spawn_id != spare.spawn_id
    off = _Starter()
    none = _pool(off, enabled=False, spares=1)
    idle = asyncio.create_task(none.run())
    none.turn_coming(uuid.uuid4(), "orchestrator", HERE)
    await asyncio.sleep(0.05)
    await none.close()
    await idle
    assert off.started == []


@pytest.mark.parametrize(("error", "reason"), [(SpareStale("the login was replaced"), "spare_stale"),
                                               (OSError("link failed"), "link_failed")])
async def test_a_spare_that_cannot_be_handed_over_is_ended_and_the_turn_gets_its_own(
        quick_spares: None, error: BaseException, reason: str) -> None:
    starter = _Starter()
    async with _with_a_spare(starter) as (pool, spare):
        starter.link_error = error
        thread = uuid.uuid4()
        pool.turn_coming(thread, "orchestrator", HERE)
        own = await pool.take(thread)  # no error reaches the turn's start
        assert own is not None and own.session_id == thread and not own.spare
        await until(lambda: (None, reason) in starter.ended, "the spare to be ended", timeout=5, every=0.01)
