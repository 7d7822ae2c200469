"""The executor's frozen config built from the settings, and the refusals of an executor set-up that cannot work.

Each builder imports the executor's modules it builds for only when it runs: a command loads only what it runs
(the ingress and `petal-dispatch status` never load the executor's MCP server or its shell parser).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from petal_dispatch.config import Settings, is_loopback
from shared import logs, terminal_wire
from shared.errors import ConfigError

if TYPE_CHECKING:
    from executor.main import ExecutorConfig
    from executor.notify.notifier import NotifyConfig
    from executor.routines import RoutinesConfig
    from executor.run.substrate import SubstrateConfig
    from executor.run.supervisor import SupervisorConfig
    from executor.sandbox.bwrap import SandboxPolicy

log = logs.get(__name__)

# The per-spawn MCP config's timeout sits this far above the ask timeout, so the CLI never cuts an ask short.
MCP_TIMEOUT_MARGIN_S = 120


def protected_paths(settings: Settings, claude: Path | None) -> tuple[tuple[str, Path], ...]:
    """What no worker may write (shared/protected.py): the service's own code (its checkout, or the
    site-packages it is installed in), its venv, the data directory and the CLI's install."""
    code = Path(__file__).resolve().parent.parent
    found = [("the service's checkout" if (code / "pyproject.toml").is_file() else "the service's installed code",
              code), ("the data directory (PETAL_DATA_DIR)", settings.data_dir)]
    if sys.prefix != sys.base_prefix:
        found.append(("the service's venv", Path(sys.prefix).resolve()))
    if claude is not None:
        from executor.sandbox.bwrap import install_root

        root = install_root(str(claude), None)
        if root is not None:
            found.append(("the Claude Code CLI's install", root))
    return tuple(found)


def check_executor_bind(settings: Settings) -> None:
    """The harness MCP lets its caller dispatch workers that run Bash: it stays on loopback unless forced."""
    if not is_loopback(settings.mcp_host) and not settings.mcp_force_bind:
        raise ConfigError(
            f"refusing to serve the harness MCP on PETAL_MCP_HOST={settings.mcp_host}: it must be a loopback "
            "address (127.0.0.1) unless PETAL_MCP_FORCE_BIND=1 says the network itself is trusted")


def sandbox_policy(settings: Settings, env: Mapping[str, str]) -> SandboxPolicy | None:
    """Every spawn's sandbox, or None on the operator's explicit PETAL_SANDBOX=off (logged). Fails closed:
    SandboxUnavailable, naming the cause and the fix, where the sandbox cannot run."""
    from executor.sandbox.bwrap import SandboxPolicy, install_root
    from executor.sandbox.limits import SpawnLimits
    from executor.sandbox.gateway import parse_allowlist

    if settings.sandbox == "off":
        log.warning("sandbox_off", detail="PETAL_SANDBOX=off: workers run unsandboxed, as this service's user, "
                    "and reach what it reaches")
        return None
    data_dir = settings.data_dir.resolve()
    # the data directory, the home, and every project's checkout: a spawn sees its own tree, not another's
    hidden = [data_dir, Path(env.get("HOME") or Path.home()), *settings.project_root_paths]
    if settings.worktree_dir is not None:
        hidden.append(settings.worktree_dir.resolve())
    allow = [a for a in settings.sandbox_allow.split(",") if a.strip()]
    try:
        parse_allowlist(allow)
    except ValueError as exc:
        raise ConfigError(f"PETAL_SANDBOX_ALLOW: {exc}") from None
    # the CLI's install stays visible where it lies in a hidden home (a cache under ~/.cache)
    exposed = [root for root in (install_root(settings.claude_bin or "claude", env.get("PATH")),) if root is not None]
    # bubblewrap, socat and bash found once, by absolute path (`doctor` refuses one found where a worker could
    # write: a venv, the checkout, a working directory)
    limits = SpawnLimits(settings.spawn_pids_max, settings.spawn_memory_max, settings.spawn_tmp_size)
    return SandboxPolicy.find(hidden=hidden, allow=allow, exposed=exposed, path=env.get("PATH"),
                              limits=limits)


def substrate_config(settings: Settings, env: Mapping[str, str]) -> SubstrateConfig:
    """How the CLI is run; `env` is the environment its spawns start from (the substrate scrubs it)."""
    from executor.run.substrate import SubstrateConfig

    return SubstrateConfig(
        claude_bin=settings.claude_bin or "claude",
        config_dir=settings.claude_config_dir,
        base_env=dict(env),
        max_retries=settings.claude_max_retries,
        api_timeout_ms=settings.claude_api_timeout_ms,
        byte_stream_idle_timeout_ms=settings.claude_stream_idle_timeout_ms,
    )


def supervisor_config(settings: Settings, sandbox: SandboxPolicy | None) -> SupervisorConfig:
    from executor import harness
    from executor.run import fleet
    from executor.run.spawn.warm_pool import WarmConfig
    from executor.run.supervisor import SupervisorConfig, default_max_parked

    return SupervisorConfig(
        sandbox=sandbox,
        mcp_url=f"http://{settings.mcp_host}:{settings.mcp_port}{harness.PATH}",
        mcp_timeout_ms=int((settings.ask_timeout_s + MCP_TIMEOUT_MARGIN_S) * 1000),
        max_workers=settings.max_workers,
        max_parked=settings.max_parked or default_max_parked(),
        park_after_s=settings.park_after_s or None,
        stall_timeout_s=settings.stall_timeout_s,
        stop_grace_s=settings.stop_grace_s,
        max_runtime_s=settings.max_runtime_s,
        default_workdir=settings.free_workdir,
        run_dir=settings.data_dir.resolve() / "run",
        worktree_dir=settings.worktree_dir,
        keep_worktrees=settings.keep_worktrees,
        name=settings.executor_name or fleet.default_name(),
        labels=fleet.parse_labels(settings.executor_labels),
        lease_s=settings.lease_s,
        shared_claude_config=settings.shared_claude_config,
        warm=WarmConfig(turns=settings.warm_turns, idle_s=settings.warm_idle_s),
        ahead=settings.sandbox_ahead, ahead_spares=settings.sandbox_spares,
    )


def notify_config(settings: Settings) -> NotifyConfig:
    from executor.notify.notifier import NotifyConfig
    from executor.notify.quiet import BadQuietHours, QuietHours

    try:
        quiet = QuietHours.parse(settings.notify_quiet, allow_gates=settings.notify_quiet_gates) \
            if settings.notify_quiet else None
    except BadQuietHours as exc:
        raise ConfigError(f"PETAL_NOTIFY_QUIET: {exc}") from None
    return NotifyConfig(
        data_dir=settings.data_dir.resolve(), vapid_private_key=settings.vapid_private_key,
        vapid_subject=settings.vapid_subject, ntfy_url=settings.ntfy_url, ntfy_token=settings.ntfy_token,
        public_url=settings.public_url, rate_limit_s=settings.notify_rate_limit_s,
        digest_s=settings.notify_digest_s, quiet=quiet, allow_loopback_push=settings.push_allow_loopback)


def executor_config(settings: Settings, env: Mapping[str, str], dsn: str,
                    sandbox: SandboxPolicy | None) -> ExecutorConfig:
    """The executor's config: `dsn` its role's, `sandbox` what `sandbox_policy` found before anything started."""
    from executor.harness.scope import DispatchLimits
    from executor.main import ExecutorConfig
    from executor.sessions.index import SessionsConfig
    from executor.settle.settler import SettlerConfig

    return ExecutorConfig(
        dsn=dsn,
        substrate=substrate_config(settings, env),
        supervisor=supervisor_config(settings, sandbox),
        mcp_host=settings.mcp_host,
        mcp_port=settings.mcp_port,
        ask_timeout_s=settings.ask_timeout_s,
        settler=SettlerConfig(backoff_base_s=settings.backoff_base_s, budget_ask_s=settings.budget_ask_s or None),
        notify=notify_config(settings),
        project_roots=settings.project_root_paths,
        terminal_pointer=terminal_wire.pointer(),
        journal_hold_bytes=settings.journal_hold_bytes,
        sessions=SessionsConfig(
            dirs=tuple(Path(p).expanduser() for p in settings.claude_session_dirs.split(":") if p.strip()),
            poll_s=settings.claude_sessions_poll_s),
        routines=routines_config(settings),
        protected=(*protected_paths(settings, Path(settings.claude_bin) if settings.claude_bin else None),
                   # where spawns of other threads write: a project there could have its repository's config
                   # (and so the executor's git) written by a free thread's worker
                   ("the free threads' working directory (PETAL_WORKDIR)", settings.free_workdir),
                   *((("the worktree directory (PETAL_WORKTREE_DIR)", settings.worktree_dir),)
                     if settings.worktree_dir else ())),
        dispatch_limits=DispatchLimits(max_depth=settings.max_dispatch_depth,
                                       max_per_task=settings.max_dispatch_per_task),
    )


def routines_config(settings: Settings) -> RoutinesConfig:
    from executor.routines import RoutinesConfig
    from executor.routines.service import FileClock, system_clock

    clock = FileClock(settings.routines_clock_file) if settings.routines_clock_file else system_clock
    return RoutinesConfig(clock=clock, missed_grace_s=settings.routine_missed_grace_s,
                          project_usd_per_day=settings.routine_project_usd_per_day, poll_s=settings.routine_poll_s)
