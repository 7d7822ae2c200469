"""What a child of the executor inherits: never the services' settings or database credentials, whichever
child it is (the worker's CLI or git running a repository's hooks), and whatever their spelling."""

from __future__ import annotations

import pytest

from executor.projects import git as project_git
from executor.run import substrate
from shared import lifeline

SECRETS = {"PETAL_EXECUTOR_DSN": "postgresql://x", "petal_executor_dsn": "postgresql://y", "PGPASSWORD": "pw",
           "pgpassfile": "/p", "DATABASE_URL": "postgresql://z", "OPEN_MODE": "1", "ANTHROPIC_LOG": "debug"}
KEPT = {"PATH": "/usr/bin", "HOME": "/home/dev", "LANG": "C.UTF-8"}


def test_a_childs_environment_keeps_the_ordinary_and_drops_the_services_own_in_any_case() -> None:
    assert lifeline.child_env({**SECRETS, **KEPT}) == KEPT


def test_git_and_the_cli_inherit_the_same_scrubbed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(SECRETS):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**SECRETS, **KEPT}.items():
        monkeypatch.setenv(name, value)
    git = project_git.base_env()
    cli = substrate.build_env(substrate.SubstrateConfig(claude_bin="claude", base_env={**SECRETS, **KEPT}), "t")
    for env in (git, cli):
        assert not set(SECRETS) & set(env), sorted(set(SECRETS) & set(env))
        assert {k: env[k] for k in KEPT if k != "PATH"} == {k: v for k, v in KEPT.items() if k != "PATH"}
    # the executor's git runs with system directories only, whatever PATH the executor has
    assert cli["PATH"] == KEPT["PATH"] and git["PATH"] == project_git.SYSTEM_PATH


def test_the_configs_holding_secrets_keep_them_out_of_their_reprs() -> None:
    from ingress.boundary import BoundaryConfig

    secret = "sk-ant-not-for-logs"
    substrate_config = substrate.SubstrateConfig(base_env={"ANTHROPIC_API_KEY": secret})
    boundary = BoundaryConfig(hosts=frozenset(), trusted_proxies=(), proxy_secret=secret.encode())
    assert secret not in repr(substrate_config) and secret not in repr(boundary)
