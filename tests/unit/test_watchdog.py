"""The watchdog's judgement of one live run (executor/run/watchdog.py `assess`, pure)."""

from __future__ import annotations

from executor.run.watchdog import AWAITING_USER, MAX_RUNTIME, RUNNING, STALLED, Limits, Verdict, Watched, assess

LIMITS = Limits(stall_timeout_s=60.0, max_runtime_s=None)


def _watched(**kw: object) -> Watched:
    base: dict[str, object] = {"started": 0.0, "last_output": 0.0, "stalled_since": None,
                               "awaiting_user": False, "asking": False}
    return Watched(**{**base, **kw})  # type: ignore[arg-type]  # each field's value, checked when Watched is built


def test_a_run_that_speaks_is_left_alone() -> None:
    assert assess(_watched(last_output=100.0), 120.0, LIMITS) == Verdict(None, None, False, 100.0, None, None)


def test_silence_up_to_the_threshold_is_not_a_stall_and_past_it_is_said_once() -> None:
    assert assess(_watched(last_output=100.0), 159.9, LIMITS).stalled_since is None
    v = assess(_watched(last_output=100.0), 160.0, LIMITS)
    assert (v.activity, v.stalled_since, v.stalled_after_s) == (STALLED, 160.0, 60.0)
    # already stalled: nothing more until it speaks again
    again = assess(_watched(last_output=100.0, stalled_since=160.0), 500.0, LIMITS)
    assert again == Verdict(None, None, False, 100.0, 160.0, None)


def test_a_pending_question_is_not_a_stall_and_its_silence_counts_from_the_answer() -> None:
    asked = assess(_watched(last_output=0.0, asking=True), 1_000.0, LIMITS)
    assert asked == Verdict(None, AWAITING_USER, True, 1_000.0, None, None)
    # still waiting: recorded already, the clock keeps being reset
    waiting = assess(_watched(last_output=1_000.0, awaiting_user=True, asking=True), 1_500.0, LIMITS)
    assert waiting == Verdict(None, None, True, 1_500.0, None, None)
    # answered: running again, and silent only since the last look
    answered = assess(_watched(last_output=1_500.0, awaiting_user=True), 1_501.0, LIMITS)
    assert answered == Verdict(None, RUNNING, False, 1_500.0, None, None)
    assert assess(_watched(last_output=1_500.0), 1_559.0, LIMITS).activity is None
    assert assess(_watched(last_output=1_500.0), 1_560.0, LIMITS).activity == STALLED


def test_past_the_runtime_cap_the_run_is_stopped_whatever_else_it_is_doing() -> None:
    capped = Limits(stall_timeout_s=60.0, max_runtime_s=300.0)
    assert assess(_watched(started=0.0, last_output=299.0), 300.0, capped).stop is None
    assert assess(_watched(started=0.0, last_output=300.0), 300.5, capped).stop == MAX_RUNTIME
    assert assess(_watched(started=0.0, last_output=0.0, asking=True), 301.0, capped).stop == MAX_RUNTIME
    assert assess(_watched(started=0.0, stalled_since=200.0), 301.0, capped).stop == MAX_RUNTIME
    # no cap: never
    assert assess(_watched(started=0.0, last_output=10**6), 10**6, LIMITS).stop is None


def test_looked_at_every_interval_a_run_is_stopped_within_one_interval_past_its_cap_never_before() -> None:
    # the watchdog's looks, one interval apart from a start that is not on the interval's grid: the first
    # look that stops the run comes after the cap and at most one interval past it (then the grace, then
    # SIGKILL: cap + interval + grace bounds a run, tests/fault/test_graceful_stop.py measures it for real)
    cap, interval = 300.0, 0.2
    for started in (0.0, 0.05, 0.13, 7.19):
        capped = Limits(stall_timeout_s=60.0, max_runtime_s=cap)
        looks = (started + i * interval for i in range(1, 10_000))
        stopped_at = next(t for t in looks if assess(_watched(started=started, last_output=t), t, capped).stop)
        assert cap < stopped_at - started <= cap + interval + 1e-9, (started, stopped_at - started)


def test_a_stalled_run_that_was_awaiting_the_user_ends_stalled() -> None:
    v = assess(_watched(last_output=0.0, awaiting_user=True), 100.0, LIMITS)
    assert (v.activity, v.awaiting_user, v.stalled_since) == (STALLED, False, 100.0)
