"""The one loop primitive (shared/consume.py) on a subscription fed by hand: which passes a wake-up runs,
repeating while there is work, outliving an outage and a pass's bug, and stopping."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest
from structlog.testing import capture_logs

from shared import availability as availability_module
from shared import consume, timers
from shared.availability import Availability
from shared.listener import RESYNC, Listener, Notification, Subscription
from tests.wait import until

NEVER_S = 60.0  # a poll that never comes within a test: only notifications wake the loop


class Passes:
    """Passes that record each run, and can be told to report work or to raise."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.work: dict[str, int] = {}  # name → how many more runs report work
        self.raises: dict[str, BaseException] = {}
        self.ran = asyncio.Event()

    def make(self, name: str) -> consume.Pass:
        async def run() -> bool:
            self.runs.append(name)
            self.ran.set()
            if name in self.raises:
                raise self.raises[name]
            left = self.work.get(name, 0)
            self.work[name] = max(0, left - 1)
            return left > 0
        run.__name__ = name
        return run

    async def after(self, count: int) -> list[str]:
        """The runs once there are at least `count` of them."""
        async with asyncio.timeout(5):
            while len(self.runs) < count:
                self.ran.clear()
                await self.ran.wait()
        return list(self.runs)


def subscription(channels: list[str]) -> Subscription:
    """A real Subscription of a listener that never connects: the test puts the notifications in."""
    return Listener("postgresql://unused", channels).subscribe(channels)


@asynccontextmanager
async def consuming(sub: Subscription, by_channel: dict[str, list[consume.Pass]], poll_s: float = NEVER_S,
                    availability: Availability | None = None, debounce_s: float = 0.0,
                    clock: timers.Clock = timers.MONOTONIC,
                    wake: consume.Wake | None = None) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    loop = asyncio.create_task(consume.consume("test", sub, by_channel, poll_s, availability or Availability("t"),
                                               stop, debounce_s=debounce_s, clock=clock, wake=wake))
    try:
        yield stop
    finally:
        stop.set()
        async with asyncio.timeout(5):
            await loop  # ends on stop: a loop that needed cancelling would hang here


async def test_a_notification_runs_only_its_channels_passes_and_the_first_round_and_a_resync_run_all() -> None:
    p = Passes()
    controls, deliver, other = p.make("controls"), p.make("deliver"), p.make("other")
    sub = subscription(["chat", "control", "answers"])
    async with consuming(sub, {"control": [controls, deliver], "chat": [deliver], "answers": [other]}):
        first = await p.after(3)
        sub.queue.put_nowait(Notification("chat", "1"))
        chat = (await p.after(4))[3:]
        sub.queue.put_nowait(Notification("control", "2"))
        control = (await p.after(6))[4:]
        sub.queue.put_nowait(RESYNC)
        resync = (await p.after(9))[6:]
    assert first == ["controls", "deliver", "other"]  # catch up on what happened while nobody listened
    assert chat == ["deliver"] and control == ["controls", "deliver"]
    assert resync == ["controls", "deliver", "other"]


async def test_notifications_queued_together_run_their_passes_once_in_registration_order() -> None:
    p = Passes()
    a, b = p.make("a"), p.make("b")
    sub = subscription(["x", "y"])
    async with consuming(sub, {"x": [a], "y": [b]}):
        await p.after(2)
        for note in (Notification("y", "1"), Notification("x", "2"), Notification("y", "3")):
            sub.queue.put_nowait(note)
        runs = (await p.after(4))[2:]
        await asyncio.sleep(0.05)  # no further round may follow for what was already taken
    assert runs == ["a", "b"] and len(p.runs) == 4


async def test_with_a_debounce_a_burst_arriving_after_the_first_notification_is_taken_in_one_round() -> None:
    p = Passes()
    a = p.make("a")
    sub = subscription(["x"])
    clock = timers.ManualClock()
    async with consuming(sub, {"x": [a]}, debounce_s=0.05, clock=clock):
        await p.after(1)
        await clock.asleep()  # the poll's wait
        sub.queue.put_nowait(Notification("x", "1"))
        assert await clock.asleep(at=0.05) == [0.05]  # the loop took the first one and waits out the debounce
        sub.queue.put_nowait(Notification("x", "2"))
        clock.advance(0.05)
        await p.after(2)
        await clock.asleep()  # waiting again: no round followed for the second, taken with the first
    assert p.runs == ["a", "a"]


async def test_the_poll_runs_every_pass_without_any_notification() -> None:
    p = Passes()
    a, b = p.make("a"), p.make("b")
    clock = timers.ManualClock()
    async with consuming(subscription(["x", "y"]), {"x": [a], "y": [b]}, poll_s=1.0, clock=clock):
        for n in (2, 4, 6):
            await p.after(n)
            assert await clock.asleep() == [n / 2]
            clock.advance(1.0)
        runs = await p.after(8)
    assert runs[:8] == ["a", "b"] * 4


async def test_notifications_more_frequent_than_the_poll_do_not_hold_it_back() -> None:
    p = Passes()
    a, b = p.make("a"), p.make("b")
    sub = subscription(["x"])
    clock = timers.ManualClock()
    async with consuming(sub, {"x": [a], consume.POLL_ONLY: [b]}, poll_s=1.0, clock=clock):
        await p.after(2)
        for n in range(2):  # a notification every 0.4 s
            assert await clock.asleep() == [1.0]
            clock.advance(0.4)
            sub.queue.put_nowait(Notification("x", str(n)))
            await p.after(3 + n)
        assert await clock.asleep() == [1.0]  # the poll still comes a second after the full round, not after 0.8
        clock.advance(0.2)
        runs = await p.after(6)
    assert runs == ["a", "b", "a", "a", "a", "b"]


async def test_a_wake_runs_the_passes_of_its_key_or_all_of_them_and_a_ring_during_a_round_is_kept() -> None:
    p = Passes()
    a, b, c = p.make("a"), p.make("b"), p.make("c")
    wake = consume.Wake()
    rings_left = [1]

    async def rings() -> object:  # rings while a round runs: the next round is for it
        if rings_left:
            rings_left.pop()
            wake.ring("clock")
        return await a()

    rings.__name__ = "a"
    async with consuming(subscription(["x"]), {"x": [rings], "clock": [b], consume.POLL_ONLY: [c]}, wake=wake):
        first = await p.after(4)  # the first round rang: b once more
        wake.ring("clock")
        keyed = (await p.after(5))[4:]
        wake.ring()
        everything = (await p.after(8))[5:]
    assert first == ["a", "b", "c", "b"] and keyed == ["b"] and everything == ["a", "b", "c"]


async def test_a_pass_that_reports_work_runs_again_until_it_finds_none() -> None:
    p = Passes()
    p.work["claim"] = 3  # three batches, then an empty claim
    claim, other = p.make("claim"), p.make("other")
    async with consuming(subscription(["x"]), {"x": [claim, other]}):
        runs = await p.after(5)
    assert runs[:5] == ["claim"] * 4 + ["other"]


async def test_an_outage_is_waited_out_through_availability_and_then_every_pass_runs_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(availability_module, "OUTAGE_DELAYS_S", (0.01,))
    monkeypatch.setattr(availability_module, "SETTLE_S", 0.0)
    p = Passes()
    p.raises["first"] = psycopg.OperationalError("the server closed the connection")
    first, second = p.make("first"), p.make("second")
    available = Availability("t")
    sub = subscription(["x", "y"])
    with capture_logs() as logged:
        async with consuming(sub, {"x": [first], "y": [second]}, availability=available):
            await p.after(3)  # fails, waits, fails again: the loop is still there
            down_meanwhile = available.down
            del p.raises["first"]
            n = len(p.runs)
            runs = (await p.after(n + 2))[n:n + 2]
            await until(lambda: not available.down, "the database said available again", timeout=5, every=0.01)
    said = [e["event"] for e in logged if e["event"].startswith("database_")]
    assert down_meanwhile and available.outages == 1
    assert runs == ["first", "second"]  # the pass the outage cut short, and the one it kept from running
    assert said == ["database_unavailable", "database_available"]  # once each, however many attempts


async def test_a_pass_that_raises_is_logged_once_while_it_keeps_failing_and_the_other_passes_go_on() -> None:
    p = Passes()
    p.raises["buggy"] = ValueError("a bug")
    buggy, fine = p.make("buggy"), p.make("fine")
    sub = subscription(["x"])
    with capture_logs() as logged:
        async with consuming(sub, {"x": [buggy, fine]}):
            for n in range(3):
                sub.queue.put_nowait(Notification("x", str(n)))
                await p.after(2 * (n + 2))
            del p.raises["buggy"]
            sub.queue.put_nowait(Notification("x", "again"))
            runs = await p.after(10)
    failed = [e for e in logged if e["event"] == "loop_pass_failed"]
    recovered = [e for e in logged if e["event"] == "loop_pass_recovered"]
    assert runs == ["buggy", "fine"] * 5
    assert [(e["loop"], e["step"]) for e in failed] == [("test", "buggy")]
    assert [(e["step"], e["failures"]) for e in recovered] == [("buggy", 4)]


async def test_stop_ends_the_loop_while_it_waits_and_a_ring_for_everything_wakes_it_as_a_full_round() -> None:
    p = Passes()
    a, b = p.make("a"), p.make("b")
    wake = consume.Wake()
    clock = timers.ManualClock()
    async with consuming(subscription(["x", "y"]), {"x": [a], "y": [b]}, poll_s=10.0, wake=wake, clock=clock):
        await p.after(2)
        assert await clock.asleep() == [10.0]
        clock.advance(6.0)
        wake.ring()  # from inside the process (a change that sends no NOTIFY): every pass runs
        runs = await p.after(4)
        assert await clock.asleep() == [16.0]  # a full round: the poll counts from it, as after a resync
    assert runs == ["a", "b", "a", "b"]  # the context manager's exit proved the stop (it awaits the loop)




async def _ends_once_cancelled(task: asyncio.Task[None], entered: asyncio.Event) -> None:
    """Cancel `task` once its swallowing step has begun: it must end, cancelled, within seconds."""
    await entered.wait()
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=5)
    assert done == {task} and task.cancelled()


async def test_a_cancel_a_pass_swallowed_ends_the_loop_at_its_next_step() -> None:
    """Python 3.11's asyncio.wait_for (psycopg_pool waits for a connection in one) returns its result when a cancel
    lands as its wait ends: the pass returns, and the loop, cancelled, must not wait for its next notification (a
    stop once waited forever on one)."""
    entered = asyncio.Event()

    async def swallowing() -> bool:
        entered.set()
        try:
            await asyncio.sleep(NEVER_S)
        except asyncio.CancelledError:
            return False  # what wait_for does when its inner wait finished as the cancel came
        return False

    loop = asyncio.create_task(consume.consume("test", subscription(["chat"]), {"chat": [swallowing]}, NEVER_S,
                                               Availability("t")))
    await _ends_once_cancelled(loop, entered)


async def test_a_retry_through_an_outage_ends_on_a_cancel_its_attempt_swallowed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The attempt's wait for a pool connection (Python 3.11's asyncio.wait_for) swallows the cancel and then fails
    as an outage: retrying it forever kept a stopped executor alive (its run's end, retried through the outage)."""
    monkeypatch.setattr(availability_module, "OUTAGE_DELAYS_S", (0.01,))
    entered = asyncio.Event()

    async def attempt() -> None:
        entered.set()
        try:
            await asyncio.sleep(NEVER_S)
        except asyncio.CancelledError:
            pass  # swallowed, as that wait_for does when its wait ended as the cancel came
        raise psycopg.OperationalError("connection refused")  # then the pool's outage

    task = asyncio.create_task(Availability("t").retry(attempt, "test"))
    await _ends_once_cancelled(task, entered)
