"""The bookkeeping of sandboxes started ahead (executor/run/ahead.py): which threads get one, when one is taken,
ended unused or at the stop. Processes are stand-ins; the real sandbox's side is tests/e2e/test_ahead.py."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from executor.run import ahead as ahead_module
from executor.run.ahead import MAX_AHEAD, Ahead, AheadPool
from tests.wait import until

HERE = "host-1"


class _Proc:
    def __init__(self) -> None:
        self.returncode: int | None = None


class _Starter:
    def __init__(self, *, fail: bool = False) -> None:
        self.started: list[Ahead] = []
        self.ended: list[tuple[uuid.UUID, str]] = []
        self.fail = fail

    async def start_ahead(self, session_id: uuid.UUID, role: str) -> Ahead | None:
        await asyncio.sleep(0)  # its start takes a moment
        if self.fail:
            raise OSError("no sandbox")
        stand_in: Any = None
        made = Ahead(session_id=session_id, role=role, spawn_id=uuid.uuid4(), proc=_Proc(),  # type: ignore[arg-type]
                     command=stand_in, program="claude", workdir=Path("."), mcp_config=None, digest=None,
                     gateway=stand_in, transcript=(1, 1))
        self.started.append(made)
        return made

    async def end_ahead(self, ahead: Ahead, reason: str) -> None:
        self.ended.append((ahead.session_id, reason))


def _pool(starter: _Starter, enabled: bool = True) -> AheadPool:
    return AheadPool(starter, enabled=enabled, pinned_here=lambda name: name == HERE)


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
    assert sorted(s for s, _ in starter.ended) == sorted(threads[:MAX_AHEAD])
    assert {r for _, r in starter.ended} == {"executor_stopping"}
    pool.turn_coming(uuid.uuid4(), "orchestrator", HERE)  # none after the stop
    assert len(starter.started) == MAX_AHEAD
