"""Quiet hours (`PETAL_NOTIFY_QUIET`, e.g. `22:00-07:00` or `22:00-07:00 Europe/Berlin`): a daily window in which
nothing is pushed, except, when the user asks for it (`PETAL_NOTIFY_QUIET_GATES`), the cards that hold up work
until someone answers (a tool call's gate, a worker's approval, an escalation)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_SPEC = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})(?:\s+(\S+))?\s*$")


class BadQuietHours(ValueError):
    """A quiet-hours setting that does not say a window; the message says what it should look like."""


@dataclass(frozen=True)
class QuietHours:
    start: time
    end: time
    zone: str | None = None  # an IANA name; None: the executor's local time
    allow_gates: bool = False

    @classmethod
    def parse(cls, spec: str, *, allow_gates: bool = False) -> QuietHours:
        m = _SPEC.match(spec)
        if m is None:
            raise BadQuietHours(f"quiet hours {spec!r}: give a window as HH:MM-HH:MM, optionally followed by a "
                                "time zone (e.g. '22:00-07:00 Europe/Berlin')")
        h1, m1, h2, m2 = (int(g) for g in m.groups()[:4])
        if h1 > 23 or h2 > 23 or m1 > 59 or m2 > 59:
            raise BadQuietHours(f"quiet hours {spec!r}: hours are 00-23 and minutes 00-59")
        if (h1, m1) == (h2, m2):
            raise BadQuietHours(f"quiet hours {spec!r}: the window starts where it ends")
        zone = m.group(5)
        if zone is not None:
            try:
                ZoneInfo(zone)
            except (ZoneInfoNotFoundError, ValueError) as exc:
                raise BadQuietHours(f"quiet hours {spec!r}: no time zone {zone!r}") from exc
        return cls(time(h1, m1), time(h2, m2), zone, allow_gates)

    def active(self, now: datetime) -> bool:
        """Whether `now` (aware) falls in the window; a window that passes midnight wraps."""
        local = now.astimezone(ZoneInfo(self.zone) if self.zone else None).time()
        if self.start < self.end:
            return self.start <= local < self.end
        return local >= self.start or local < self.end

    def describe(self) -> str:
        window = f"{self.start:%H:%M}-{self.end:%H:%M}" + (f" {self.zone}" if self.zone else "")
        return window + (" (cards that hold up work still notify)" if self.allow_gates else "")
