"""The gate classifier against its corpus (tests/data/gate_corpus.tsv): every command gets its category."""

from __future__ import annotations

from pathlib import Path

import pytest

from executor import gates

CORPUS = Path(__file__).parent.parent / "data" / "gate_corpus.tsv"
WORKDIR, HOME = "/srv/app", "/home/dev"


def _cases() -> list[tuple[str, str]]:
    cases = []
    for line in CORPUS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        expected, command = line.split("\t", 1)
        cases.append((expected, command.replace("\\n", "\n")))
    return cases


CASES = _cases()


def test_the_corpus_is_large_and_names_only_known_categories() -> None:
    assert len(CASES) >= 200
    assert {expected for expected, _ in CASES} == gates.CATEGORIES | {gates.ALLOWED}
    assert len({command for _, command in CASES}) == len(CASES), "a command is listed twice"


@pytest.mark.parametrize(("expected", "command"), CASES, ids=[c for _, c in CASES])
def test_each_corpus_command_gets_its_category(expected: str, command: str) -> None:
    verdict = gates.classify("Bash", {"command": command}, WORKDIR, HOME)
    assert verdict.category == expected, verdict.findings
