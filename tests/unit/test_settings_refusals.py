"""A set-up that cannot work is refused before anything starts, in one line naming the setting (petal_dispatch/config.py,
executor_wiring.py and ingress_wiring.py); what can work is built as asked."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from executor.routines.service import FileClock
from petal_dispatch import config, executor_wiring, ingress_wiring
from petal_dispatch.config import Settings
from shared import errors

pytestmark = pytest.mark.unit

LONG = "x" * 16  # the shortest secret accepted


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("192.168.1.4", False), ("example.com", False), ("localhost.example.com", False), ("", False),
])
def test_loopback_is_an_address_of_the_loopback_net_or_the_name_localhost(host: str, loopback: bool) -> None:
    assert config.is_loopback(host) is loopback


def test_token_mode_needs_a_token_of_sixteen_characters() -> None:
    with pytest.raises(errors.ConfigError) as missing:
        ingress_wiring.check_auth(Settings(auth_mode="token"))
    assert _one_line(missing.value) == "token mode needs PETAL_AUTH_TOKEN"
    with pytest.raises(errors.ConfigError) as short:
        ingress_wiring.check_auth(Settings(auth_mode="token", auth_token=SecretStr("x" * 15)))
    assert _one_line(short.value).startswith("PETAL_AUTH_TOKEN is too short: at least 16 characters")
    assert ingress_wiring.check_auth(Settings(auth_mode="token", auth_token=SecretStr(LONG))) is None


def test_proxy_mode_needs_a_proxy_secret_of_sixteen_characters_and_gives_it_back() -> None:
    with pytest.raises(errors.ConfigError) as missing:
        ingress_wiring.check_auth(Settings(auth_mode="proxy"))
    assert _one_line(missing.value).startswith("proxy mode needs PETAL_PROXY_SECRET")
    with pytest.raises(errors.ConfigError) as empty:  # set but empty is not set
        ingress_wiring.check_auth(Settings(auth_mode="proxy", proxy_secret=SecretStr("")))
    assert "needs PETAL_PROXY_SECRET" in str(empty.value)
    with pytest.raises(errors.ConfigError, match="PETAL_PROXY_SECRET is too short"):
        ingress_wiring.check_auth(Settings(auth_mode="proxy", proxy_secret=SecretStr("short")))
    assert ingress_wiring.check_auth(Settings(auth_mode="proxy", proxy_secret=SecretStr(LONG))) == LONG


def test_a_short_proxy_secret_is_refused_in_token_mode_too() -> None:
    with pytest.raises(errors.ConfigError, match="PETAL_PROXY_SECRET is too short"):
        ingress_wiring.check_auth(Settings(auth_mode="token", auth_token=SecretStr(LONG),
                                           proxy_secret=SecretStr("short")))


def test_open_mode_needs_no_credential_and_wins_over_the_auth_mode() -> None:
    settings = Settings(open_mode=True, auth_mode="token")
    assert ingress_wiring.check_auth(settings) is None
    assert ingress_wiring.auth_config(settings).mode == "open"


def test_open_mode_off_loopback_is_refused_unless_forced() -> None:
    with pytest.raises(errors.ConfigError) as refused:
        ingress_wiring.check_ingress_bind(Settings(open_mode=True, ingress_host="0.0.0.0"))
    assert _one_line(refused.value).startswith("refusing open mode (no authentication) on 0.0.0.0")
    ingress_wiring.check_ingress_bind(Settings(open_mode=True, ingress_host="0.0.0.0", force_open=True))
    ingress_wiring.check_ingress_bind(Settings(open_mode=True, ingress_host="127.0.0.1"))
    # with authentication, any address
    ingress_wiring.check_ingress_bind(Settings(open_mode=False, ingress_host="0.0.0.0"))


def test_the_harness_mcp_off_loopback_is_refused_unless_forced() -> None:
    with pytest.raises(errors.ConfigError) as refused:
        executor_wiring.check_executor_bind(Settings(mcp_host="0.0.0.0"))
    assert "PETAL_MCP_HOST=0.0.0.0" in _one_line(refused.value) and "PETAL_MCP_FORCE_BIND=1" in str(refused.value)
    executor_wiring.check_executor_bind(Settings(mcp_host="0.0.0.0", mcp_force_bind=True))
    executor_wiring.check_executor_bind(Settings(mcp_host="::1"))


@pytest.mark.parametrize(("field", "value", "says"), [
    ("allowed_hosts", "example.com/path", "PETAL_ALLOWED_HOSTS"),
    ("allowed_hosts", "user@example.com", "PETAL_ALLOWED_HOSTS"),
    ("trusted_proxies", "10.0.0.0/33", "PETAL_TRUSTED_PROXIES"),
    ("trusted_proxies", "proxy.local", "PETAL_TRUSTED_PROXIES"),
])
def test_a_host_list_or_a_proxy_list_that_cannot_be_read_is_refused_naming_it(field: str, value: str,
                                                                               says: str) -> None:
    given: dict[str, Any] = {field: value}
    settings = Settings(open_mode=True, **given)
    with pytest.raises(errors.ConfigError) as refused:
        ingress_wiring.check_ingress(settings)
    assert _one_line(refused.value).startswith(says)


def test_the_allowed_users_are_a_comma_list_with_blanks_dropped() -> None:
    auth = ingress_wiring.auth_config(Settings(allowed_users=" ann, bob ,,", max_body_bytes=4096,
                                               attachment_max_bytes=2048))
    assert auth.allowed_users == frozenset({"ann", "bob"})
    assert (auth.max_body_bytes, auth.upload_max_bytes) == (4096, 2048)


def test_a_sandbox_allowlist_entry_that_cannot_be_read_is_refused_before_the_sandbox_is_looked_for() -> None:
    with pytest.raises(errors.ConfigError) as refused:
        executor_wiring.sandbox_policy(Settings(sandbox_allow="pypi.org, example.com:http"), {"PATH": "/nowhere"})
    assert _one_line(refused.value).startswith("PETAL_SANDBOX_ALLOW:")


def test_the_sandbox_off_is_no_policy() -> None:
    assert executor_wiring.sandbox_policy(Settings(sandbox="off"), {"PATH": "/nowhere"}) is None


@pytest.mark.parametrize(("field", "value"), [
    ("max_workers", 0), ("ingress_port", 70000), ("mcp_port", -1), ("attachment_max_bytes", 10 * 1024 * 1024 + 1),
    ("max_body_bytes", 100), ("warm_turns", 17), ("sandbox_spares", 5), ("lease_s", 0.5), ("stall_timeout_s", 0),
    ("executor_name", ""), ("spawn_memory_max", "0"), ("max_dispatch_depth", 0), ("sse_client_buffer", 9),
])
def test_a_value_outside_its_settings_range_is_refused(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=field):
        Settings(**{field: value})


def test_every_wrong_setting_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PETAL_MAX_WORKERS", "0")
    monkeypatch.setenv("PETAL_SANDBOX", "docker")
    with pytest.raises(errors.ConfigError) as refused:
        config.load()
    message = _one_line(refused.value)
    assert message.startswith("invalid settings: ") and "PETAL_MAX_WORKERS: " in message
    assert "PETAL_SANDBOX: " in message and message.count("; ") == 1


def test_the_database_url_and_open_mode_are_read_without_the_prefix_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@h/db")
    monkeypatch.setenv("OPEN_MODE", "1")
    settings = Settings()
    assert settings.database_url is not None and settings.database_url.get_secret_value() == "postgresql://u@h/db"
    assert settings.open_mode is True


def test_spawn_limits_of_max_or_blank_are_none_and_sizes_are_read_in_binary_units() -> None:
    settings = Settings(spawn_pids_max="MAX", spawn_memory_max="512M", spawn_tmp_size="max")  # type: ignore[arg-type]
    assert (settings.spawn_pids_max, settings.spawn_memory_max, settings.spawn_tmp_size) == (None, 512 << 20, None)
    assert Settings(spawn_pids_max="").spawn_pids_max is None  # type: ignore[arg-type]


def test_the_project_roots_are_a_colon_list_with_blanks_dropped() -> None:
    assert Settings(project_roots="/a::/b: ").project_root_paths == (Path("/a"), Path("/b"))
    assert Settings(project_roots="").project_root_paths == ()


def test_every_path_setting_is_made_absolute_and_an_unset_one_stays_unset(tmp_path: Path) -> None:
    s = config.absolute(Settings(claude_config_dir=Path("cfg"), routines_clock_file=Path("clock"),
                                 claude_session_dirs="s1::s2"), cwd=tmp_path)
    assert (s.claude_config_dir, s.routines_clock_file) == (tmp_path / "cfg", tmp_path / "clock")
    assert s.claude_session_dirs == f"{tmp_path / 's1'}:{tmp_path / 's2'}"
    assert s.worktree_dir is None and s.workdir is None


def test_the_routines_clock_reads_a_file_when_one_is_set(tmp_path: Path) -> None:
    clock_file = tmp_path / "clock"
    clock_file.write_text("2026-03-29T00:30:00+00:00\n")
    built = executor_wiring.routines_config(Settings(routines_clock_file=clock_file, routine_poll_s=0.5))
    assert built.clock() == datetime(2026, 3, 29, 0, 30, tzinfo=UTC) and built.poll_s == 0.5
    assert not isinstance(executor_wiring.routines_config(Settings()).clock, FileClock)


def test_a_file_clock_keeps_the_last_good_time_and_reads_a_naive_one_as_utc(tmp_path: Path) -> None:
    path = tmp_path / "clock"
    clock = FileClock(path)
    path.write_text("2026-01-01T12:00:00")
    assert clock() == datetime(2026, 1, 1, 12, tzinfo=UTC)
    path.write_text("2026-01-0")  # caught half-written
    assert clock() == datetime(2026, 1, 1, 12, tzinfo=UTC)
    path.unlink()
    assert clock() == datetime(2026, 1, 1, 12, tzinfo=UTC)


def test_the_executors_name_and_labels_are_as_given() -> None:
    built = executor_wiring.supervisor_config(Settings(executor_name="vm-1", executor_labels="gpu, linux,gpu,,"), None)
    assert built.name == "vm-1" and built.labels == ("gpu", "linux")
    assert built.sandbox is None and built.run_dir == Settings().data_dir.resolve() / "run"
