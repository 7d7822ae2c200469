"""Quiet hours (executor/notify/quiet.py): the window, across midnight and in a time zone, and a setting that
does not say one refused at start-up in one line."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from executor.notify.quiet import BadQuietHours, QuietHours
from petal_dispatch import executor_wiring
from petal_dispatch.config import Settings
from shared.errors import ConfigError


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 12, 6, hour, minute, tzinfo=UTC)


def test_a_window_across_midnight_holds_the_night_and_not_the_day() -> None:
    night = QuietHours.parse("22:00-07:00 UTC")
    assert [night.active(at(h)) for h in (21, 22, 23, 0, 6)] == [False, True, True, True, True]
    assert not night.active(at(7)) and not night.active(at(12))
    day = QuietHours.parse("09:30-17:00 UTC")
    assert [day.active(at(9, 29)), day.active(at(9, 30)), day.active(at(16, 59)), day.active(at(17))] == [
        False, True, True, False]


def test_the_window_is_read_in_its_time_zone() -> None:
    berlin = QuietHours.parse("22:00-07:00 Europe/Berlin", allow_gates=True)
    assert berlin.active(at(21, 30))  # 22:30 in Berlin (UTC+1 in December)
    assert not berlin.active(at(6, 30))  # 07:30 there
    assert berlin.describe() == "22:00-07:00 Europe/Berlin (cards that hold up work still notify)"


@pytest.mark.parametrize("spec", ["22-07", "25:00-07:00", "22:00-22:00", "22:00-07:00 Mars/Olympus", "night"])
def test_a_setting_that_says_no_window_is_refused_saying_what_it_should_look_like(spec: str) -> None:
    with pytest.raises(BadQuietHours, match="quiet hours"):
        QuietHours.parse(spec)
    with pytest.raises(ConfigError, match="^PETAL_NOTIFY_QUIET: quiet hours"):
        executor_wiring.notify_config(Settings(notify_quiet=spec))
    assert executor_wiring.notify_config(Settings(notify_quiet="23:00-06:30", notify_quiet_gates=True)).quiet == \
        QuietHours.parse("23:00-06:30", allow_gates=True)
