"""The systemd units verify, carry their hardening, and their env files name real settings."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from petal_dispatch.config import Settings

UNITS = Path(__file__).resolve().parents[2] / "systemd"
HARDENING = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
             "PrivateDevices": "yes", "RestrictSUIDSGID": "yes", "CapabilityBoundingSet": ""}


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    # keys kept as written: typeshed calls optionxform a method
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNITS / name)
    return parser


def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: .ci/run installs the systemd package")
    binary = str(Path(sys.executable).with_name("petal-dispatch"))
    for unit in UNITS.glob("*.service"):
        # point ExecStart at this checkout's installed command, so verify can check it exists
        text = unit.read_text().replace("/opt/petal-dispatch/.venv/bin/petal-dispatch", binary)
        (tmp_path / unit.name).write_text(text)
    # the units find each other here (Requires=), and the system's own units (postgresql, network) after
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"}
    out = subprocess.run(["systemd-analyze", "verify", *sorted(str(p) for p in tmp_path.glob("*.service"))],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stderr.strip() == "", out.stderr


def test_verify_catches_a_broken_directive(tmp_path: Path) -> None:
    unit = (UNITS / "petal-dispatch-ingress.service").read_text().replace(
        "/opt/petal-dispatch/.venv/bin/petal-dispatch", str(Path(sys.executable).with_name("petal-dispatch")))
    (tmp_path / "petal-dispatch-ingress.service").write_text(unit.replace("Restart=on-failure", "Restart=sometimes"))
    (tmp_path / "petal-dispatch-migrate.service").write_text((UNITS / "petal-dispatch-migrate.service").read_text())
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"}
    out = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "petal-dispatch-ingress.service")],
                         capture_output=True, text=True, timeout=120, env=env)
    assert "sometimes" in out.stderr


@pytest.mark.parametrize("name", ["petal-dispatch-migrate.service", "petal-dispatch-executor.service",
                                  "petal-dispatch-ingress.service"])
def test_each_unit_is_hardened_runs_as_its_own_user_and_reads_its_own_env_file(name: str) -> None:
    service = _unit(name)["Service"]
    for key, value in HARDENING.items():
        assert service.get(key) == value, f"{name}: {key}={service.get(key)!r}"
    role = name.removeprefix("petal-dispatch-").removesuffix(".service")
    assert service["User"] == f"petal-{role}"
    assert service["EnvironmentFile"] == f"/etc/petal-dispatch/{role}.env"
    assert service["StandardOutput"] == "journal"
    if role != "migrate":
        assert service["Restart"] == "on-failure"
        assert "petal-dispatch-migrate.service" in _unit(name)["Unit"]["After"]
        assert "petal-dispatch-migrate.service" in _unit(name)["Unit"]["Requires"]


def test_only_the_executor_may_write_its_state_and_project_trees() -> None:
    assert _unit("petal-dispatch-executor.service")["Service"]["ReadWritePaths"].split() == [
        "/var/lib/petal-dispatch", "/srv/petal-projects"]
    assert "ReadWritePaths" not in _unit("petal-dispatch-ingress.service")["Service"]
    assert _unit("petal-dispatch-ingress.service")["Service"]["MemoryDenyWriteExecute"] == "yes"


def _env_names() -> set[str]:
    names = {"DATABASE_URL", "OPEN_MODE"}
    for field, info in Settings.model_fields.items():
        names.add(f"PETAL_{field.upper()}")
        if info.validation_alias is not None:
            names.update(str(a) for a in getattr(info.validation_alias, "choices", [info.validation_alias]))
    return names


@pytest.mark.parametrize("name", ["migrate", "executor", "ingress"])
def test_every_variable_in_the_env_examples_is_a_real_setting_and_each_service_gets_only_its_dsn(name: str) -> None:
    text = (UNITS / "env" / f"{name}.env.example").read_text()
    keys = re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", text, re.MULTILINE)
    assert keys and set(keys) <= _env_names(), set(keys) - _env_names()
    dsns = {k for k in keys if k in ("DATABASE_URL", "PETAL_EXECUTOR_DSN", "PETAL_INGRESS_DSN")}
    assert dsns == {"migrate": {"DATABASE_URL"}, "executor": {"PETAL_EXECUTOR_DSN"},
                    "ingress": {"PETAL_INGRESS_DSN"}}[name]


def test_the_executor_unit_walls_its_spawns_in_and_scores_ok_in_systemd_analyze_security(tmp_path: Path) -> None:
    """The unit's own namespace is a second wall around every spawn (docs/deploy.md, "A second layer"); it keeps
    the namespaces bubblewrap needs; `systemd-analyze security` rates its exposure at most 4.5 of 10."""
    service = _unit("petal-dispatch-executor.service")["Service"]
    assert service.get("ProtectProc") == "invisible" and service.get("UMask") == "0077"
    assert "ingress.env" in service.get("InaccessiblePaths", "")
    assert "RestrictNamespaces" not in service and "PrivateUsers" not in service
    unit = tmp_path / "petal-dispatch-executor.service"
    unit.write_text((UNITS / unit.name).read_text().replace(
        "/opt/petal-dispatch/.venv/bin/petal-dispatch", str(Path(sys.executable).with_name("petal-dispatch"))))
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", "--threshold=45", str(unit)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    # the threshold bites: a unit stripped of its hardening fails it
    bare = tmp_path / "bare" / unit.name
    bare.parent.mkdir()
    bare.write_text("\n".join(line for line in unit.read_text().splitlines()
                              if not line.startswith(("Protect", "Private", "Restrict", "NoNew", "Capability",
                                                      "Lock", "UMask", "Inaccessible", "ReadWrite"))))
    worse = subprocess.run(["systemd-analyze", "security", "--offline=true", "--threshold=45", str(bare)],
                           capture_output=True, text=True, timeout=120)
    assert worse.returncode != 0
