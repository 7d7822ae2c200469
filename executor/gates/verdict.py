"""A classified call's verdict: the findings that tripped a gate, and the most severe one's category."""

from __future__ import annotations

from dataclasses import dataclass

from executor.gates.tables import ALLOWED, LABELS, SEVERITY


@dataclass(frozen=True)
class Finding:
    category: str
    reason: str  # what tripped it, e.g. "sudo", "writes /etc/motd"


@dataclass(frozen=True)
class Verdict:
    category: str  # ALLOWED or the most severe finding's category
    findings: tuple[Finding, ...] = ()

    @property
    def gated(self) -> bool:
        return self.category != ALLOWED

    @property
    def label(self) -> str:
        return LABELS.get(self.category, self.category)

    @property
    def reason(self) -> str:
        return "; ".join(f.reason for f in self.findings if f.category == self.category)


def verdict_of(findings: list[Finding]) -> Verdict:
    """The findings without repeats, most severe first (in the order found within a category)."""
    if not findings:
        return Verdict(ALLOWED)
    seen: dict[tuple[str, str], Finding] = {}
    for f in findings:
        seen.setdefault((f.category, f.reason), f)
    ordered = sorted(seen.values(), key=lambda f: SEVERITY.index(f.category))
    return Verdict(ordered[0].category, tuple(ordered))
