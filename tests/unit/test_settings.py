"""Settings as values (petal_dispatch/config.py): secrets stay out of reprs, enum-like knobs refuse unknown values;
the services' configs built from them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from petal_dispatch import config, executor_wiring, ingress_wiring
from petal_dispatch.config import Settings
from shared import errors

# Any: the values go to Settings(**SECRETS) as plain strings, which the secret fields take and wrap
SECRETS: dict[str, Any] = {"auth_token": "tok-s3cret", "vapid_private_key": "vapid-s3cret", "ntfy_token": "ntfy-s3cret",
           "database_url": "postgresql://petal:db-s3cret@db.example/petal",
           "executor_dsn": "postgresql://petal_executor:ex-s3cret@db.example/petal",
           "ingress_dsn": "postgresql://petal_ingress:in-s3cret@db.example/petal"}


def test_secrets_are_hidden_in_the_settings_repr_and_given_back_on_request() -> None:
    settings = Settings(**SECRETS)
    shown = f"{settings!r} {settings} {settings.model_dump()}"
    assert "s3cret" not in shown
    assert settings.auth_token is not None and settings.auth_token.get_secret_value() == "tok-s3cret"
    assert settings.database_url is not None and settings.database_url.get_secret_value() == SECRETS["database_url"]


@pytest.mark.parametrize("field,value", [("auth_mode", "password"), ("log_format", "xml"), ("log_level", "loud")])
def test_an_unknown_value_of_an_enum_like_setting_is_refused(field: str, value: str) -> None:
    with pytest.raises(ValidationError, match=field):
        Settings(**{field: value})  # type: ignore[arg-type]  # a value outside the field's type, on purpose


def test_a_log_level_is_accepted_in_any_case() -> None:
    # upper case on purpose: the validator folds it into the lower-case literal
    assert Settings(log_level="WARNING").log_level == "warning"  # type: ignore[arg-type]


def test_a_wrong_value_in_the_environment_is_a_config_error_naming_its_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PETAL_LOG_LEVEL", "loud")
    with pytest.raises(errors.ConfigError, match="PETAL_LOG_LEVEL: Input should be 'debug'"):
        config.load()


def test_each_service_config_is_built_from_the_settings_and_shows_no_secret() -> None:
    settings = Settings(vapid_private_key=SecretStr("vapid-s3cret"), ntfy_token=SecretStr("ntfy-s3cret"),
                        mcp_port=8123, ask_timeout_s=40, open_mode=False, auth_mode="proxy",
                        proxy_secret=SecretStr("proxy-s3cret-long-enough"))
    env = {"PATH": "/usr/bin", "ANTHROPIC_API_KEY": "sk-s3cret"}
    executor = executor_wiring.executor_config(settings, env, "postgresql://petal_executor:ex-s3cret@db/petal", None)
    # the ask timeout reaches the harness, and a spawn's MCP timeout sits above it (an ask is never cut short)
    assert executor.ask_timeout_s == 40 and executor.supervisor.mcp_timeout_ms == (40 + 120) * 1000
    assert executor.supervisor.mcp_url == "http://127.0.0.1:8123/harness-mcp/" and executor.mcp_port == 8123
    assert executor.substrate.base_env == env  # what spawns start from (the substrate scrubs it)
    ingress = ingress_wiring.ingress_config(settings, "postgresql://petal_ingress:in-s3cret@db/petal")
    assert ingress.auth.mode == "proxy" and ingress.boundary.proxy_secret == b"proxy-s3cret-long-enough"
    for built in (executor, ingress):
        assert "s3cret" not in repr(built), repr(built)
