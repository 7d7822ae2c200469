"""The count of test functions per tier that `.ci/run` prints (tests/tier_counts.py): what is written, not what runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import tier_counts

pytestmark = pytest.mark.unit


def test_a_parametrised_test_counts_once_and_methods_and_async_tests_count() -> None:
    source = '''
import pytest

@pytest.mark.parametrize("x", [1, 2, 3])
def test_one(x): ...

async def test_two(): ...

class TestGroup:
    def test_three(self): ...
    def helper(self): ...

def helper_test(): ...
def testing_without_underscore(): ...
'''
    assert tier_counts.count_tests(source) == 3


def test_each_tier_counts_its_own_test_modules_only(tmp_path: Path) -> None:
    for tier in tier_counts.TIERS:
        (tmp_path / tier).mkdir()
    (tmp_path / "unit" / "test_a.py").write_text("def test_a(): ...\ndef test_b(): ...\n")
    (tmp_path / "unit" / "sub").mkdir()
    (tmp_path / "unit" / "sub" / "test_c.py").write_text("async def test_c(): ...\n")
    (tmp_path / "unit" / "helpers.py").write_text("def test_not_collected(): ...\n")  # not a test module
    (tmp_path / "store" / "test_s.py").write_text("def test_s(): ...\n")
    counts = tier_counts.tier_counts(tmp_path)
    assert counts == {"unit": 3, "store": 1, "e2e": 0, "web": 0, "fault": 0, "shipped": 0}


def test_the_line_gives_each_tiers_count_and_share_and_the_unit_share_decides() -> None:
    line, unit = tier_counts.report({"unit": 45, "store": 30, "e2e": 25})
    assert line == "test functions by tier: unit 45 (45%), store 30 (30%), e2e 25 (25%); total 100"
    assert unit == 45.0
    assert tier_counts.report({"unit": 0, "store": 0})[1] == 0.0  # no tests at all: no division by zero


def test_the_check_fails_under_the_unit_share_and_passes_at_it(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tier_counts, "tier_counts", lambda: {"unit": 44, "store": 56})
    assert tier_counts.main([]) == 1
    assert "under 45%" in capsys.readouterr().err
    assert tier_counts.main(["--min-unit", "40"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(tier_counts, "tier_counts", lambda: {"unit": 45, "store": 55})
    assert tier_counts.main([]) == 0
    assert capsys.readouterr().out.startswith("test functions by tier: unit 45 (45%)")
