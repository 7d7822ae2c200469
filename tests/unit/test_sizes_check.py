"""CI's size and complexity check (.ci/sizes.py) on packages made for the test: a module over the line limit and a
function radon grades D are named, an exception listed with its reason silences only its own entry, and one that
excuses nothing fails the check."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _sizes() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_sizes", ROOT / ".ci" / "sizes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sizes = _sizes()

# 21 paths through one function: radon's D
BRANCHY = "def branchy(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(20)) + "    return -1\n"
# 11 paths in a method: C, which passes
METHOD = "class K:\n    def fine(self, x):\n" + "".join(f"        if x == {i}:\n            return {i}\n"
                                                     for i in range(10)) + "        return -1\n"


def _package(tmp_path: Path) -> Path:
    (tmp_path / "pkg" / "inner").mkdir(parents=True)
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (sizes.MAX_LINES + 1))
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * sizes.MAX_LINES)
    (tmp_path / "pkg" / "inner" / "branchy.py").write_text(BRANCHY + "\n\n" + METHOD)
    return tmp_path


def test_a_long_module_and_a_d_function_are_named_and_nothing_else(tmp_path: Path) -> None:
    found = sizes.findings(_package(tmp_path), ("pkg",))
    assert set(found) == {"pkg/long.py", "pkg/inner/branchy.py:branchy"}
    assert found["pkg/long.py"] == f"{sizes.MAX_LINES + 1} lines (at most {sizes.MAX_LINES})"
    assert found["pkg/inner/branchy.py:branchy"].startswith("radon D (21; at most C)")


def test_a_method_graded_d_is_named_by_its_class(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("class K:\n    " + BRANCHY.replace("\n", "\n    ").replace("(x)", "(self, x)"))
    assert list(sizes.findings(tmp_path, ("pkg",))) == ["pkg/m.py:K.branchy"]


def test_an_exception_silences_only_its_own_entry_and_a_stale_one_is_named(tmp_path: Path) -> None:
    found = sizes.findings(_package(tmp_path), ("pkg",))
    failures, stale = sizes.report(found, {"pkg/long.py": "why", "pkg/gone.py": "split since"})
    assert failures == [f"pkg/inner/branchy.py:branchy: {found['pkg/inner/branchy.py:branchy']}"]
    assert stale == ["pkg/gone.py"]


def test_every_listed_exception_says_why() -> None:
    listed = sizes.exceptions(ROOT / "pyproject.toml")
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"].get("petal-sizes", {}).get("exceptions", {})
    assert listed == table
    assert all(isinstance(why, str) and why.strip() for why in listed.values())


def _listing(root: Path, exceptions: dict[str, str]) -> Path:
    rows = "".join(f'"{key}" = "{why}"\n' for key, why in exceptions.items())
    (root / "pyproject.toml").write_text(f"[tool.petal-sizes.exceptions]\n{rows}")
    return root


def test_the_check_passes_when_every_finding_is_excused_and_every_exception_excuses_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _listing(_package(tmp_path), {"pkg/long.py": "why", "pkg/inner/branchy.py:branchy": "why"})
    assert sizes.main(root, ("pkg",)) == 0
    assert capsys.readouterr().err == ""


def test_a_stale_exception_fails_the_check_and_says_which(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _listing(_package(tmp_path), {"pkg/long.py": "why", "pkg/inner/branchy.py:branchy": "why",
                                         "pkg/short.py": "grew once"})
    assert sizes.main(root, ("pkg",)) == 1
    assert capsys.readouterr().err.splitlines() == [
        "sizes: pkg/short.py is within the limits now (or gone): remove its exception from pyproject.toml"]


def test_a_finding_not_excused_fails_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _listing(_package(tmp_path), {"pkg/long.py": "why"})
    assert sizes.main(root, ("pkg",)) == 1
    assert "sizes: pkg/inner/branchy.py:branchy: radon D" in capsys.readouterr().err
