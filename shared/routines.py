"""Routines' pure rules, for both services: when a schedule fires (cron + IANA time zone, DST-correct), which
instants are due after a pause (the missed-instant policy), and the sandboxed prompt template.

The ingress validates with these (a bad cron expression, time zone or template is refused at create time) and
shows next fire times; the executor schedules with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import jinja2
from croniter import CroniterError, croniter
from jinja2.sandbox import SandboxedEnvironment

MISSED = ("skip", "run_once")
OVERLAP = ("skip", "queue", "parallel")
# most instants one scheduling pass looks at: a schedule that fires every minute, paused for weeks, is
# collapsed or skipped without walking every instant
MAX_WALK = 10_000


class ScheduleError(ValueError):
    """A cron expression or time zone that cannot be scheduled."""


class TemplateError(ValueError):
    """A prompt template that does not parse, or that names a field its event lacks."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """A cron expression read in an IANA time zone."""

    cron: str
    tz: str

    def __post_init__(self) -> None:
        check_schedule(self.cron, self.tz)

    def _fixed_hour(self) -> bool:
        return self.cron.split()[1] != "*"

    def next_after(self, after: datetime) -> datetime:
        """The first instant strictly after `after` (an aware datetime), in UTC.

        Across a DST change: a wall time that does not exist (spring forward) fires at the change; a wall time
        that happens twice (fall back) fires once, at its first occurrence, when the expression names its hours
        (`30 1 * * *`); a schedule over every hour (`0 * * * *`) keeps firing every real hour."""
        zone = ZoneInfo(self.tz)
        it = croniter(self.cron, after.astimezone(zone))
        for _ in range(MAX_WALK):
            candidate: datetime = it.get_next(datetime)
            local = candidate.astimezone(zone)
            if local.fold == 1 and self._fixed_hour():
                continue  # the second occurrence of a repeated wall time: already fired at the first
            return candidate.astimezone(UTC)
        raise ScheduleError(f"{self.cron!r} never fires")  # pragma: no cover - croniter refuses such expressions

    def fire_times(self, after: datetime, count: int) -> list[datetime]:
        """The next `count` instants after `after`."""
        times: list[datetime] = []
        at = after
        for _ in range(count):
            at = self.next_after(at)
            times.append(at)
        return times


def check_schedule(cron: str, tz: str) -> None:
    """Raises ScheduleError naming what is wrong with the expression or the zone."""
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"unknown time zone {tz!r} (an IANA name, e.g. Europe/Berlin)") from None
    if len(cron.split()) != 5:
        raise ScheduleError(f"cron expression {cron!r} must have 5 fields (minute hour day month weekday)")
    try:
        if not croniter.is_valid(cron):
            raise ScheduleError(f"invalid cron expression {cron!r}")
    except CroniterError as exc:
        raise ScheduleError(f"invalid cron expression {cron!r}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Due:
    """What one scheduling pass does: the instants to run, how many it skipped, the new cursor and the next
    instant after it."""

    instants: tuple[datetime, ...]
    skipped: int
    through: datetime
    next_fire_at: datetime


def due(schedule: Schedule, cursor: datetime, now: datetime, missed: str, grace_s: float) -> Due:
    """The instants in (cursor, now] to run under the missed-instant policy (pure).

    An instant no older than `grace_s` is on time and runs. Older ones were missed (the fleet was down):
    `skip` runs none of them; `run_once` runs one, at the latest missed instant, however many were missed —
    and when an on-time instant is also due, that one run stands for all of them (never a storm)."""
    instants: list[datetime] = []
    at = cursor
    for _ in range(MAX_WALK):
        nxt = schedule.next_after(at)
        if nxt > now:
            break
        instants.append(nxt)
        at = nxt
    else:
        at = now  # a pause longer than the walk: everything up to now is missed
    through = max(at, cursor)
    on_time = [i for i in instants if (now - i).total_seconds() <= grace_s]
    late = [i for i in instants if i not in on_time]
    if missed == "run_once" and late:
        chosen = on_time[-1:] or late[-1:]
    else:
        chosen = on_time[-1:]  # two on-time instants in one pass (a sub-grace schedule) still run once
    return Due(tuple(chosen), len(instants) - len(chosen), through, schedule.next_after(through))


def next_fire(cron: str | None, tz: str | None, after: datetime) -> datetime | None:
    """The next instant of a routine's schedule after `after`, or None without a schedule."""
    if not cron or not tz:
        return None
    return Schedule(cron, tz).next_after(after)


# ---- the prompt template ------------------------------------------------------------------------------

_ENV = SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)


def check_template(prompt: str) -> None:
    """Raises TemplateError when the template does not parse (at create time: before any run)."""
    try:
        _ENV.parse(prompt)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"template error on line {exc.lineno}: {exc.message}") from None


def render(prompt: str, event: Mapping[str, Any], routine: Mapping[str, Any]) -> str:
    """The prompt with `{{ event.… }}` (the trigger's payload) and `{{ routine.… }}` filled in, in a sandbox
    (no attribute of Python objects, no imports); a missing field raises TemplateError naming it."""
    try:
        return _ENV.from_string(prompt).render(event=dict(event), routine=dict(routine))
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"template: {exc.message} (the event's fields: {', '.join(sorted(event)) or 'none'})"
                            ) from None
    except jinja2.TemplateError as exc:
        raise TemplateError(f"template: {exc}") from None


def day_start(now: datetime) -> datetime:
    """The start of `now`'s UTC day: per-day budgets count from here."""
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
