"""Every third-party package the code imports is declared in pyproject.toml and has its reason in
docs/dependencies.md ("Dependencies and why"; the README links it).

A package that arrives only as another's dependency (aiohttp through pywebpush) can vanish from under the
code with that package's next release; and a dependency nobody can say why we carry is one nobody removes.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "ingress", "executor", "petal_dispatch")
OWN = set(PACKAGES)


def imported_top_level(root: Path) -> set[str]:
    found: set[str] = set()
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.add(node.module.split(".")[0])
    return found - OWN - set(sys.stdlib_module_names) - {"__future__"}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(pyproject: dict[str, object]) -> set[str]:
    project = pyproject["project"]
    assert isinstance(project, dict)
    return {normalise(re.split(r"[<>=\[;! ]", spec, maxsplit=1)[0]) for spec in project["dependencies"]}


def documented_reasons(page: str) -> set[str]:
    table = page.split("# Dependencies and why", 1)[1]
    names: set[str] = set()
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith("| package") and not line.startswith("|---"):
            first = line.split("|")[1]
            names.update(normalise(n) for n in re.findall(r"[A-Za-z][\w.-]*", re.sub(r"\(.*?\)", "", first)))
    return names


def test_every_imported_package_is_declared_with_its_reason_in_the_docs() -> None:
    distributions = importlib.metadata.packages_distributions()
    wanted = {normalise(distributions[module][0]) for module in imported_top_level(ROOT)}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    missing = wanted - declared(pyproject)
    assert not missing, f"imported but not declared in pyproject.toml [project] dependencies: {sorted(missing)}"
    unexplained = wanted - documented_reasons((ROOT / "docs" / "dependencies.md").read_text())
    assert not unexplained, f"declared but without a row in docs/dependencies.md: {sorted(unexplained)}"


def test_the_check_sees_an_undeclared_import(tmp_path: Path) -> None:
    # negative control: a module importing a package that is installed but not declared is found
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "executor" / "x.py").write_text("import hypothesis\nfrom executor import y\nimport json\n")
    found = imported_top_level(tmp_path)
    assert found == {"hypothesis"}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "hypothesis" not in declared(pyproject)
