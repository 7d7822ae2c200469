"""Settings are values, checked once: every path made absolute at load, a free thread's working directory of
petal's own, and no tree a worker writes around or inside what the service runs (shared/protected.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from executor.projects import service as projects
from petal_dispatch import config, executor_wiring
from petal_dispatch.config import Settings
from shared import errors
from shared.protected import overlap

CHECKOUT = Path(__file__).resolve().parents[2]


def test_relative_paths_are_taken_from_the_starting_directory_and_home_is_expanded(tmp_path: Path) -> None:
    home = Path.home()
    s = config.absolute(Settings(data_dir=Path("var"), worktree_dir=Path("~/trees"), project_roots="a:~/b",
                                 workdir=Path("~/work")), cwd=tmp_path)
    assert s.data_dir == tmp_path / "var"
    assert s.worktree_dir == home.resolve() / "trees" and s.workdir == home.resolve() / "work"
    assert s.project_root_paths == (tmp_path / "a", home.resolve() / "b")
    assert s.pgdata == tmp_path / "var" / "pgdata"


def test_a_relative_workdir_is_refused_in_one_line_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError) as refused:
        config.absolute(Settings(workdir=Path(".")), cwd=tmp_path)
    message = str(refused.value)
    assert "PETAL_WORKDIR=. is relative" in message and "\n" not in message


def test_unset_the_workdir_is_petals_own_never_the_starting_directory(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    s = config.absolute(Settings(), cwd=CHECKOUT)
    assert s.workdir is None
    assert s.free_workdir == tmp_path / "xdg" / "petal-dispatch" / "workdir"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert config.default_workdir() == Path.home().resolve() / ".local" / "share" / "petal-dispatch" / "workdir"


def test_the_services_checkout_venv_and_data_directory_are_protected(tmp_path: Path) -> None:
    s = config.absolute(Settings(data_dir=tmp_path / "var"))
    found = dict((what, p) for what, p in executor_wiring.protected_paths(s, None))
    assert found["the service's checkout"] == CHECKOUT
    assert found["the data directory (PETAL_DATA_DIR)"] == tmp_path / "var"
    if sys.prefix != sys.base_prefix:
        assert found["the service's venv"] == Path(sys.prefix).resolve()


def test_overlap_names_containing_and_lying_inside() -> None:
    protected = (("the checkout", Path("/srv/app")),)
    assert overlap(Path("/srv/app"), protected) == "contains the checkout (/srv/app)"
    assert overlap(Path("/srv"), protected) == "contains the checkout (/srv/app)"
    assert overlap(Path("/srv/app/.venv/bin"), protected) == "is inside the checkout (/srv/app)"
    assert overlap(Path("/srv/application"), protected) is None  # a prefix of the name is not containment
    assert overlap(Path("/home"), (), home=Path("/home/u")) == "contains this user's home (/home/u), its dotfiles included"
    assert overlap(Path("/home/u/work"), (), home=Path("/home/u")) is None


def test_a_projects_repository_around_or_inside_a_protected_path_is_refused(tmp_path: Path) -> None:
    service = tmp_path / "petal"
    (service / ".venv" / "bin").mkdir(parents=True)
    ok = tmp_path / "project"
    ok.mkdir()
    protected = (("the service's checkout", service),)
    assert projects.check_workdir(str(ok), [tmp_path], protected) == ok
    for bad, how in ((service, "contains"), (service / ".venv", "is inside"), (tmp_path, "contains")):
        with pytest.raises(projects.Refused) as refused:
            projects.check_workdir(str(bad), [tmp_path], protected)
        assert f"{how} the service's checkout" in str(refused.value)
    # negative control: without the protected list the same repository passes the roots check
    assert projects.check_workdir(str(service), [tmp_path]) == service


def test_a_project_repository_that_is_the_home_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(projects.Refused, match="contains this user's home"):
        projects.check_workdir(str(home), [home], ())
    (home / "repo").mkdir()
    assert projects.check_workdir(str(home / "repo"), [home], ()) == home / "repo"


def test_the_executor_protects_the_free_working_directory_from_projects(tmp_path: Path) -> None:
    s = config.absolute(Settings(data_dir=tmp_path / "var", workdir=tmp_path / "free"))
    built = dict(executor_wiring.executor_config(s, {"PATH": "/usr/bin", "HOME": str(tmp_path)}, "postgresql://x/y",
                                        None).protected)
    assert built["the free threads' working directory (PETAL_WORKDIR)"] == tmp_path / "free"
