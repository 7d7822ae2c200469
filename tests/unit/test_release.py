"""The release: the package's version, its CHANGELOG.md section, the wheel's metadata and `--version` agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import petal_dispatch
from petal_dispatch import cli

ROOT = Path(__file__).resolve().parents[2]
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.M)


def _sections() -> list[tuple[str, str]]:
    return RELEASE.findall((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))


def test_the_package_version_is_the_newest_release_in_the_changelog_with_unreleased_above_it() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = _sections()

    assert sections, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' section"
    assert sections[0][0] == petal_dispatch.__version__, (
        f"petal_dispatch.__version__ is {petal_dispatch.__version__} but CHANGELOG.md's newest release is "
        f"{sections[0][0]}: a version is bumped together with its CHANGELOG section")
    assert text.index("## [Unreleased]") < text.index(f"## [{sections[0][0]}]")


def test_releases_are_listed_newest_first_each_once() -> None:
    versions = [tuple(int(n) for n in v.split(".")) for v, _ in _sections()]
    dates = [d for _, d in _sections()]

    assert versions == sorted(set(versions), reverse=True)
    assert dates == sorted(dates, reverse=True)


def test_the_wheel_takes_its_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["hatch"]["version"] == {"path": "petal_dispatch/__init__.py"}


def test_version_prints_the_release(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"petal-dispatch {petal_dispatch.__version__}\n"
