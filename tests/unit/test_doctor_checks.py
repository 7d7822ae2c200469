"""`petal-dispatch doctor`'s checks one by one (petal_dispatch/doctor.py) on settings and directories made for the test:
each says ✓ or ✗ with the fix in one line, and a start refuses with the first ✗. Nothing is started or installed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from petal_dispatch import config, datalock, doctor
from petal_dispatch.config import Settings
from petal_dispatch.doctor import Check
from shared import errors

pytestmark = pytest.mark.unit


def _run(settings: Settings, scope: doctor.Scope = "doctor", *, demo: bool = False) -> doctor._Run:
    return doctor._Run(config.absolute(settings), {"PATH": "/usr/bin:/bin"}, scope, demo)  # noqa: SLF001


@pytest.fixture(autouse=True)
def _own_default_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default working directory under the test's own directory, not the user's ~/.local/share."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


def test_a_check_is_one_line_with_its_mark_name_and_detail() -> None:
    assert Check("python", True, "3.11.9 at /usr/bin/python3").line() == "✓ python: 3.11.9 at /usr/bin/python3"
    assert Check("ports", False, "8000 in use").line() == "✗ ports: 8000 in use"


def test_this_python_passes() -> None:
    found = doctor._python(_run(Settings()))  # noqa: SLF001
    assert found.ok and found.name == "python" and "petal-dispatch needs" not in found.detail


def test_a_given_workdir_that_does_not_exist_is_refused_with_how_to_make_it(tmp_path: Path) -> None:
    run = _run(Settings(workdir=tmp_path / "work", data_dir=tmp_path / "var"))
    found = doctor._workdir(run)  # noqa: SLF001
    assert not found.ok and f"mkdir -p {tmp_path / 'work'}" in found.detail and "\n" not in found.detail
    assert not run.workdir_ok
    (tmp_path / "work").mkdir()
    assert doctor._workdir(run).ok and run.workdir_ok  # noqa: SLF001


def test_a_workdir_around_or_inside_what_the_service_runs_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "var"
    (data / "inside").mkdir(parents=True)
    for workdir, how in ((data / "inside", "is inside the data directory"), (tmp_path, "contains the data directory")):
        found = doctor._workdir(_run(Settings(workdir=workdir, data_dir=data)))  # noqa: SLF001
        assert not found.ok and how in found.detail, found.detail


def test_the_default_workdir_is_said_by_doctor_and_made_private_by_a_start(tmp_path: Path) -> None:
    default = tmp_path / "xdg" / "petal-dispatch" / "workdir"
    said = doctor._workdir(_run(Settings(data_dir=tmp_path / "var")))  # noqa: SLF001
    assert said.ok and "made at the first start" in said.detail and not default.exists()
    run = _run(Settings(data_dir=tmp_path / "var"), scope="up")
    assert doctor._workdir(run).ok and run.workdir_ok  # noqa: SLF001
    assert default.is_dir() and default.stat().st_mode & 0o777 == 0o700


def test_project_roots_default_to_the_home_must_exist_and_may_not_hold_the_service(tmp_path: Path) -> None:
    assert doctor._project_roots(_run(Settings())).ok  # noqa: SLF001
    missing = doctor._project_roots(_run(Settings(project_roots=str(tmp_path / "none"))))  # noqa: SLF001
    assert not missing.ok and "does not exist" in missing.detail
    holds = doctor._project_roots(_run(Settings(project_roots=str(tmp_path), data_dir=tmp_path / "var")))  # noqa: SLF001
    assert not holds.ok and "contains the data directory" in holds.detail
    (tmp_path / "code").mkdir()
    ok = doctor._project_roots(_run(Settings(project_roots=str(tmp_path / "code"), data_dir=tmp_path / "var")))  # noqa: SLF001
    assert ok.ok and ok.detail == str(tmp_path / "code")


def test_the_data_directory_is_checked_by_doctor_only_and_a_readable_one_is_warned_of(tmp_path: Path) -> None:
    data = tmp_path / "var"
    found = doctor._data_dir(_run(Settings(data_dir=data)))  # noqa: SLF001
    assert found is not None and found.ok and "made by the first `up`" in found.detail
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    found = doctor._data_dir(_run(Settings(data_dir=data)))  # noqa: SLF001
    assert found is not None and found.ok and "readable by others" in found.detail and "mode 0755" in found.detail
    data.chmod(0o700)
    found = doctor._data_dir(_run(Settings(data_dir=data)))  # noqa: SLF001
    assert found is not None and found.ok and "readable by others" not in found.detail
    assert doctor._data_dir(_run(Settings(data_dir=data), scope="up")) is None  # noqa: SLF001 - a start's own


def test_the_sandbox_turned_off_is_said_and_no_probe_runs(tmp_path: Path) -> None:
    run = _run(Settings(sandbox="off", data_dir=tmp_path / "var"))
    found = doctor._sandbox(run)  # noqa: SLF001
    assert found.ok and "PETAL_SANDBOX=off" in found.detail
    run.claude, run.workdir_ok = Path("/usr/bin/claude"), True
    assert doctor._probe(run) is None  # noqa: SLF001


def test_the_login_is_not_asked_without_a_cli_nor_in_the_demo() -> None:
    assert doctor._login(_run(Settings())) is None  # noqa: SLF001
    run = _run(Settings(), demo=True)
    run.claude = Path("/nonexistent/claude")  # never run: the scripted model needs no login
    found = doctor._login(run)  # noqa: SLF001
    assert found is not None and found.ok and "scripted model" in found.detail


def _fake_checks(found: list[Check]) -> object:
    def checks(*args: object, **kwargs: object) -> Iterator[Check]:
        yield from found
    return checks


def test_a_start_refuses_with_the_first_failing_line_and_otherwise_gets_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "checks", _fake_checks([
        Check("python", True, "3.11"), Check("claude", True, "/opt/claude/bin/claude (2.1.328; the pinned version)"),
        Check("workdir", False, "PETAL_WORKDIR=/x does not exist"), Check("ports", False, "in use")]))
    with pytest.raises(errors.ConfigError) as refused:
        doctor.require(Settings(), {}, scope="up")
    assert str(refused.value) == "✗ workdir: PETAL_WORKDIR=/x does not exist"
    monkeypatch.setattr(doctor, "checks", _fake_checks([
        Check("claude", True, "/opt/claude/bin/claude (2.1.328; the pinned version)")]))
    assert doctor.require(Settings(), {}, scope="executor") == Path("/opt/claude/bin/claude")


def test_doctor_prints_every_line_and_the_count_of_problems(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(doctor, "checks", _fake_checks([Check("a", True, "fine"), Check("b", False, "broken"),
                                                        Check("c", False, "broken too")]))
    assert doctor.main(Settings(), {}) == 1
    assert capsys.readouterr().out.splitlines() == ["✓ a: fine", "✗ b: broken", "✗ c: broken too", "2 problems found"]
    monkeypatch.setattr(doctor, "checks", _fake_checks([Check("a", True, "fine")]))
    assert doctor.main(Settings(), {}) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "all checks passed"


def test_ports_held_by_the_up_on_this_data_directory_are_the_ones_it_holds_not_the_defaults(tmp_path: Path) -> None:
    data = tmp_path / "var"
    (data / "run").mkdir(parents=True)
    up = Settings(data_dir=data, ingress_port=18123, mcp_port=18124)  # `up --port 18123 --mcp-port 18124`
    with datalock.acquire(config.absolute(up), datalock.UP):
        found = doctor._ports(_run(Settings(data_dir=data)))  # noqa: SLF001 - `doctor` with no --port
    assert found is not None and found.ok, found
    assert "127.0.0.1:18123" in found.detail and "127.0.0.1:18124" in found.detail, found.detail
    assert ":8000" not in found.detail and ":8002" not in found.detail, found.detail
    assert f"(pid {os.getpid()})" in found.detail and "held by the `up`" in found.detail


def test_an_up_whose_lock_names_no_ports_is_not_said_to_hold_this_runs_defaults(tmp_path: Path) -> None:
    data = tmp_path / "var"
    (data / "run").mkdir(parents=True)
    with datalock.acquire(config.absolute(Settings(data_dir=data)), datalock.UP) as held:
        held.path.write_text(json.dumps({"pid": os.getpid(), "command": "up"}))  # an older version's lock
        found = doctor._ports(_run(Settings(data_dir=data)))  # noqa: SLF001
    assert found is not None and found.ok, found
    assert ":8000" not in found.detail and ":8002" not in found.detail, found.detail
    assert "ports (unknown" in found.detail and f"(pid {os.getpid()})" in found.detail, found.detail
