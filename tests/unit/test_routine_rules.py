"""Routines' pure rules: next fire times across DST changes in two zones, the missed-instant policy, and the
sandboxed template."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared import routines as rules

pytestmark = pytest.mark.unit


def _utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def _hm(times: list[datetime]) -> list[str]:
    return [t.strftime("%m-%d %H:%M") for t in times]


def test_a_daily_schedule_across_spring_forward_in_berlin_and_new_york_fires_once_a_day_at_the_change() -> None:
    # 02:30 does not exist on the change's day: it fires at the change (03:00 summer time), once
    berlin = rules.Schedule("30 2 * * *", "Europe/Berlin")
    assert _hm(berlin.fire_times(_utc(2026, 3, 28, 12), 3)) == ["03-29 01:00", "03-30 00:30", "03-31 00:30"]
    york = rules.Schedule("30 2 * * *", "America/New_York")
    assert _hm(york.fire_times(_utc(2026, 3, 7, 12), 3)) == ["03-08 07:00", "03-09 06:30", "03-10 06:30"]


def test_a_daily_schedule_across_fall_back_fires_once_at_the_first_of_the_repeated_wall_times() -> None:
    # 02:30 happens twice on 25 October in Berlin (CEST, then CET): once, at the first
    berlin = rules.Schedule("30 2 * * *", "Europe/Berlin")
    assert _hm(berlin.fire_times(_utc(2026, 10, 24, 12), 3)) == ["10-25 00:30", "10-26 01:30", "10-27 01:30"]
    # every half hour of 01:xx in New York: 01:00 and 01:30 once each on 1 November, not four times
    york = rules.Schedule("*/30 1 * * *", "America/New_York")
    assert _hm(york.fire_times(_utc(2026, 10, 31, 12), 4)) == ["11-01 05:00", "11-01 05:30", "11-02 06:00",
                                                               "11-02 06:30"]


def test_an_hourly_schedule_keeps_firing_every_real_hour_through_both_changes() -> None:
    hourly = rules.Schedule("0 * * * *", "Europe/Berlin")
    for start in (_utc(2026, 3, 28, 22), _utc(2026, 10, 24, 22)):
        times = hourly.fire_times(start, 6)
        assert [(b - a) for a, b in zip(times, times[1:])] == [timedelta(hours=1)] * 5, _hm(times)


def test_a_bad_expression_or_zone_is_refused_naming_it() -> None:
    with pytest.raises(rules.ScheduleError, match="5 fields"):
        rules.check_schedule("* * * *", "UTC")
    with pytest.raises(rules.ScheduleError, match="invalid cron"):
        rules.check_schedule("61 * * * *", "UTC")
    with pytest.raises(rules.ScheduleError, match="time zone 'Mars/Olympus'"):
        rules.check_schedule("* * * * *", "Mars/Olympus")
    rules.check_schedule("*/5 9-17 * * 1-5", "Europe/Berlin")


EVERY_MINUTE = rules.Schedule("* * * * *", "UTC")
T0 = _utc(2026, 6, 1, 12, 0)


def test_an_on_time_instant_runs_and_the_cursor_moves_past_it() -> None:
    due = rules.due(EVERY_MINUTE, T0, T0 + timedelta(minutes=1, seconds=2), "skip", 60)
    assert due.instants == (T0 + timedelta(minutes=1),) and due.skipped == 0
    assert due.through == T0 + timedelta(minutes=1) and due.next_fire_at == T0 + timedelta(minutes=2)
    # nothing due yet: nothing runs, the cursor stays
    idle = rules.due(EVERY_MINUTE, T0, T0 + timedelta(seconds=59), "skip", 60)
    assert idle.instants == () and idle.through == T0


def test_after_downtime_across_three_instants_skip_runs_none_and_run_once_runs_one() -> None:
    now = T0 + timedelta(minutes=3, seconds=30)  # instants 12:01, 12:02, 12:03 passed unseen (grace 10 s)
    skip = rules.due(EVERY_MINUTE, T0, now, "skip", 10)
    assert skip.instants == () and skip.skipped == 3 and skip.through == T0 + timedelta(minutes=3)
    once = rules.due(EVERY_MINUTE, T0, now, "run_once", 10)
    assert once.instants == (T0 + timedelta(minutes=3),) and once.skipped == 2
    # a week away from an every-minute schedule: still one run, no storm, and no endless walk
    week = rules.due(EVERY_MINUTE, T0, T0 + timedelta(days=7), "run_once", 10)
    assert len(week.instants) == 1 and week.through <= T0 + timedelta(days=7)
    assert rules.due(EVERY_MINUTE, T0, T0 + timedelta(days=7), "skip", 10).instants == ()


def test_the_template_fills_event_fields_in_a_sandbox_and_names_a_missing_one() -> None:
    event = {"pull_request": {"title": "Fix the parser", "number": 7}}
    assert rules.render("Review #{{ event.pull_request.number }}: {{ event.pull_request.title }}", event,
                        {"name": "r"}) == "Review #7: Fix the parser"
    with pytest.raises(rules.TemplateError, match="'dict object' has no attribute 'body'"):
        rules.render("{{ event.pull_request.body }}", event, {})
    with pytest.raises(rules.TemplateError, match="pull_request"):
        rules.render("{{ event.issue.title }}", event, {})  # the error lists the fields the event has
    # the sandbox: no way from a value to Python's internals
    with pytest.raises(rules.TemplateError, match="unsafe|not safely|access"):
        rules.render("{{ event.__class__.__mro__ }}", {}, {})
    with pytest.raises(rules.TemplateError, match="line 1"):
        rules.check_template("{{ event.title ")
    rules.check_template("{% if event.x %}{{ event.x }}{% endif %}")
