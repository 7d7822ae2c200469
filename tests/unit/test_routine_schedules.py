"""Routines' schedules beyond DST (shared/routines.py): no schedule is no fire time, a day's budget starts at UTC
midnight, and one pass that finds late and on-time instants together runs once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from shared import routines as rules

pytestmark = pytest.mark.unit

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)  # a Monday
EVERY_MINUTE = rules.Schedule("* * * * *", "UTC")


def test_a_routine_without_a_schedule_has_no_next_fire_time() -> None:
    assert rules.next_fire(None, "UTC", T0) is None and rules.next_fire("0 3 * * *", None, T0) is None
    assert rules.next_fire("", "", T0) is None
    assert rules.next_fire("0 3 * * *", "UTC", T0) == datetime(2026, 6, 2, 3, 0, tzinfo=UTC)


def test_a_schedule_is_checked_when_made_and_its_instants_are_strictly_later() -> None:
    with pytest.raises(rules.ScheduleError, match="5 fields"):
        rules.Schedule("0 0 3 * * *", "UTC")  # six fields (seconds): not this format
    weekdays = rules.Schedule("0 9 * * 1-5", "Asia/Tokyo")
    times = weekdays.fire_times(T0, 6)
    assert times == sorted(set(times)) and all(t.tzinfo is UTC for t in times)
    # 09:00 in Tokyo is 00:00 UTC; Saturday and Sunday are left out
    assert [t.strftime("%a %H:%M") for t in times] == ["Tue 00:00", "Wed 00:00", "Thu 00:00", "Fri 00:00",
                                                        "Mon 00:00", "Tue 00:00"]
    assert weekdays.next_after(times[0]) == times[1]  # an instant itself is not after itself


def test_the_day_a_budget_counts_is_the_utc_day_whatever_the_zone_given() -> None:
    late_in_new_york = datetime(2026, 6, 1, 22, 30, tzinfo=timezone(timedelta(hours=-4)))  # 02:30 UTC the next day
    assert rules.day_start(late_in_new_york) == datetime(2026, 6, 2, tzinfo=UTC)
    assert rules.day_start(T0) == datetime(2026, 6, 1, tzinfo=UTC)


def test_late_instants_with_an_on_time_one_run_once_at_the_on_time_one() -> None:
    now = T0 + timedelta(minutes=5, seconds=5)  # 12:01 … 12:04 missed, 12:05 on time (grace 10 s)
    for missed in ("skip", "run_once"):
        due = rules.due(EVERY_MINUTE, T0, now, missed, 10)
        assert due.instants == (T0 + timedelta(minutes=5),) and due.skipped == 4, missed
        assert due.through == T0 + timedelta(minutes=5) and due.next_fire_at == T0 + timedelta(minutes=6)


def test_two_on_time_instants_in_one_pass_still_run_once() -> None:
    due = rules.due(EVERY_MINUTE, T0, T0 + timedelta(minutes=2, seconds=1), "skip", 300)
    assert due.instants == (T0 + timedelta(minutes=2),) and due.skipped == 1


def test_the_command_line_takes_every_policy_the_rules_know_and_no_other() -> None:
    from petal_dispatch import cli

    for option, known in (("--missed", rules.MISSED), ("--overlap", rules.OVERLAP)):
        for policy in known:
            args = cli.build_parser().parse_args(["routine", "add", "--name", "n", "--prompt", "p", option, policy])
            assert getattr(args, option[2:]) == policy
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["routine", "add", "--name", "n", "--prompt", "p", option, "never"])


def test_the_routines_own_fields_are_sandboxed_too() -> None:
    assert rules.render("{{ routine.name|upper }}", {}, {"name": "nightly"}) == "NIGHTLY"
    with pytest.raises(rules.TemplateError, match="unsafe"):
        rules.render("{{ routine.name.__class__ }}", {}, {"name": "r"})  # the routine's fields are sandboxed too
