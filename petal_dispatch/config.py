"""The settings, read once from the environment.

The only place that knows the `PETAL_*` variables: `Settings` reads them (pydantic-settings); the wiring
modules turn them into the frozen configs the services run on (`executor_wiring.executor_config`,
`ingress_wiring.ingress_config`) and refuse a set-up that cannot work, naming the variable, before anything
starts. The services never see `Settings` and never read the environment.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, BeforeValidator, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.errors import ConfigError

# proxy: trust X-Authentik-Username from the fronting proxy; token: a shared secret (bearer or cookie)
AuthMode = Literal["proxy", "token"]
LogFormat = Literal["auto", "json", "console"]
# bwrap: every spawn runs in a bubblewrap sandbox (executor/sandbox/bwrap.py); off: the operator's explicit opt-out
SandboxMode = Literal["bwrap", "off"]
LogLevel = Annotated[Literal["debug", "info", "warning", "error", "critical"],
                     BeforeValidator(lambda v: v.lower() if isinstance(v, str) else v)]


def _spawn_size(value: object) -> object:
    """"4G", "512M" (binary units) or bytes; "max" for none (executor/sandbox/limits.py)."""
    from executor.sandbox.limits import parse_size

    return parse_size(value) if isinstance(value, str) else value


# a spawn's limit: a number, or "max" (or empty) for none
SpawnSize = Annotated[Annotated[int, Field(gt=0)] | None, BeforeValidator(_spawn_size)]
SpawnCount = Annotated[Annotated[int, Field(ge=16)] | None,
                       BeforeValidator(lambda v: None if str(v).strip().lower() in ("", "max") else v)]


class Settings(BaseSettings):
    """Every knob of both services and of the application. Only this package receives it: the services get
    the configs built from it (executor_wiring.py, ingress_wiring.py)."""

    model_config = SettingsConfigDict(env_prefix="PETAL_", frozen=True, extra="ignore")

    # Admin DSN (migrations, role set-up). Unset: start the embedded server in data_dir.
    # The DSNs may carry passwords: secrets, hidden in reprs and logs.
    database_url: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("DATABASE_URL", "PETAL_DATABASE_URL")
    )
    # Per-service DSNs. Unset: the admin DSN with the role's name as user (trust/peer set-ups).
    executor_dsn: SecretStr | None = None
    ingress_dsn: SecretStr | None = None
    data_dir: Path = Path("./var")

    open_mode: bool = Field(default=False, validation_alias=AliasChoices("OPEN_MODE", "PETAL_OPEN_MODE"))
    auth_mode: AuthMode = "proxy"
    # comma-separated usernames allowed in proxy mode; empty: anyone the proxy lets through
    allowed_users: str = ""
    auth_token: SecretStr | None = None
    # open mode on a non-loopback address must be asked for explicitly
    force_open: bool = False
    # Host names (name or name:port) the ingress answers to besides its loopback names, comma-separated:
    # the proxy's public name. Any other Host is refused (DNS rebinding); browsers' cross-origin writes too.
    allowed_hosts: str = ""
    # Peers (addresses or CIDRs) whose X-Authentik-Username / X-Forwarded-* headers count.
    trusted_proxies: str = "127.0.0.0/8,::1"
    # A secret the proxy adds to every request (X-Petal-Proxy-Secret): required in proxy mode, at least 16
    # characters. Being on a trusted address is not enough: any local process is on loopback.
    proxy_secret: SecretStr | None = None
    max_body_bytes: int = Field(default=256 * 1024, ge=1024)
    # One attachment (an uploaded file): at most the store's own limit of 10 MiB; lower it for a small server.
    attachment_max_bytes: int = Field(default=10 * 1024 * 1024, ge=1024, le=10 * 1024 * 1024)
    # What one chat message may carry in attachments together.
    message_attachments_max_bytes: int = Field(default=20 * 1024 * 1024, ge=1024)
    sse_heartbeat_s: float = Field(default=15.0, gt=0)
    # recent SSE frames kept in memory; a client further behind is cut off (it resumes by Last-Event-ID)
    sse_client_buffer: int = Field(default=20_000, ge=10)
    ingress_host: str = "127.0.0.1"
    ingress_port: int = Field(default=8000, ge=0, le=65535)
    # several ingress processes on one port (SO_REUSEPORT: the kernel spreads connections; same user only)
    ingress_reuse_port: bool = False
    mcp_host: str = "127.0.0.1"
    mcp_port: int = Field(default=8002, ge=0, le=65535)
    # the harness MCP on a non-loopback address must be asked for explicitly (it drives workers)
    mcp_force_bind: bool = False
    # ask_user_question waits this long for an answer, then returns "Timed out waiting for user input"
    ask_timeout_s: float = Field(default=300.0, gt=0)

    # A running task silent for longer than this is marked stalled.
    stall_timeout_s: float = Field(default=180.0, gt=0)
    # SIGTERM, then SIGKILL after this many seconds.
    stop_grace_s: float = Field(default=10.0, gt=0)
    # A wall-clock cap per task, separate from the stall threshold. Unset: none.
    max_runtime_s: float | None = Field(default=None, gt=0)
    # What runs at once. A process parked on the user (a pending question or approval) holds no slot; at most
    # max_parked wait at once (unset: a quarter of the available memory at ~200 MiB per parked CLI, 4 to 32), past
    # it the oldest is ended and its question stays answerable (the answer resumes it in a new turn).
    max_workers: int = Field(default=4, ge=1)
    max_parked: int | None = Field(default=None, ge=1)
    # A thread's turn parked on its own question longer than this is ended, its question left answerable: waiting
    # holds no memory, and the answer resumes the conversation in a new turn (0: only past max_parked).
    park_after_s: float = Field(default=120.0, ge=0)
    # A worker's own dispatches are bounded: workers dispatch at most this deep (a turn's worker is at depth 1,
    # its worker at 2 …), and one task asks for at most this many workers; past either the tool refuses.
    max_dispatch_depth: int = Field(default=3, ge=1)
    max_dispatch_per_task: int = Field(default=20, ge=1)
    # While the database is away, the executor holds this much of the workers' output in memory, then
    # spills the rest to a file in the data directory (journaled in order when the database returns).
    journal_hold_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    # The fleet (several executors on one database): this executor's name (unset: the host name; two live
    # executors never share one), its labels (comma-separated, for placement) and its lease.
    executor_name: str | None = Field(default=None, min_length=1, max_length=200)
    executor_labels: str = ""
    lease_s: float = Field(default=15.0, ge=1)
    # Every executor reads one CLI config directory (a shared mount): a thread's turns may run anywhere.
    shared_claude_config: bool = False
    # The policy's back-off for rate_limited workers: this many seconds, doubling with each retry.
    backoff_base_s: float = Field(default=30.0, ge=0)
    # A routine run at its USD cap asks the user to raise it or stop; an unattended (autonomous) run waits this
    # long for the answer, then ends as it would have without asking (0: it does not ask).
    budget_ask_s: float = Field(default=900.0, ge=0)
    # Warm turns: at most this many threads (shown in a page, or whose turn just ended) have their next
    # turn's CLI started ahead of the message (0: off), each retired this long after its start.
    warm_turns: int = Field(default=2, ge=0, le=16)
    warm_idle_s: float = Field(default=300.0, gt=0)
    # A thread's next turn's sandbox started before its claim: one of this many spares (kept started for
    # whichever thread's message comes first), else its own as soon as its message is seen.
    sandbox_ahead: bool = True
    sandbox_spares: int = Field(default=1, ge=0, le=4)

    # Notifications. Web Push needs a VAPID key: generated into the data directory on first run unless
    # given here (PEM, or base64url DER/raw). ntfy is optional: a topic URL and, if it needs one, a token.
    vapid_private_key: SecretStr | None = None
    vapid_subject: str = "mailto:admin@localhost"
    ntfy_url: str | None = None
    ntfy_token: SecretStr | None = None
    # The page's public address, for absolute links in notifications (ntfy's click-through).
    public_url: str = ""
    # Test-only: accept push endpoints on loopback (a local push stand-in). Never in production.
    push_allow_loopback: bool = False
    notify_rate_limit_s: float = Field(default=60.0, ge=0)
    # Only when needed: a finished run waits this long for others to fold into one digest; no pushes in the quiet
    # hours (HH:MM-HH:MM [time zone]) but, with notify_quiet_gates, the cards that hold up work.
    notify_digest_s: float = Field(default=120.0, ge=0)
    notify_quiet: str | None = None
    notify_quiet_gates: bool = False
    # Routines: a schedule's instant noticed later than this (the fleet was down) counts as missed and follows
    # the routine's policy (skip, or run once for all of them).
    routine_missed_grace_s: float = Field(default=60.0, gt=0)
    # How often the routines loop looks at the store without being woken (its timer wakes it at each instant).
    routine_poll_s: float = Field(default=1.0, gt=0)
    # What the runs of all routines of one project may cost in a UTC day; a run that would pass it is skipped.
    routine_project_usd_per_day: float | None = Field(default=None, gt=0)
    # Test-only: the routines' clock reads "now" from this file (ISO 8601), so tests cross instants and DST
    # changes without waiting for them. Never in production.
    routines_clock_file: Path | None = None
    # Where tasks without a project run: an absolute path (or ~/…) of a directory that exists. Unset: a directory
    # of petal's own (default_workdir), made on start. Never the directory `up` starts in: that is often the
    # service's own checkout, and a worker writing into the checkout or its venv would plant what the service runs.
    workdir: Path | None = None
    # Directories a project's repository must lie in (separated by ":"); empty: the service user's home.
    project_roots: str = ""
    # Where workers of a project get their git worktrees (unset: <data_dir>/worktrees), and whether a
    # worktree stays after its changes are recorded (its branch stays until merged or discarded anyway).
    worktree_dir: Path | None = None
    keep_worktrees: bool = False
    # The Claude Code CLI: a path, or a name on PATH. Unset: `claude` on PATH, else the pinned install
    # (petal_dispatch/cli_install.py), which `up` installs when it is missing. A value that names nothing is refused.
    claude_bin: str | None = None
    # Every spawn sandboxed (off: workers run as this user with its reach; logged, shown in /api/info and the
    # page). The hosts its tools may reach through the sandbox's proxy (comma-separated host or host:port;
    # the model API is always reachable by the CLI itself); a project may add its own.
    sandbox: SandboxMode = "bwrap"
    sandbox_allow: str = ""
    # Each spawn's share of the machine (executor/sandbox/limits.py; docs/deploy.md says what enforces them where):
    # its processes and threads, its memory (its /tmp included), its /tmp. "max": no limit.
    spawn_pids_max: SpawnCount = 1024
    spawn_memory_max: SpawnSize = 4 << 30
    spawn_tmp_size: SpawnSize = 1 << 30
    claude_config_dir: Path | None = None
    # The CLI config directories whose stored conversations the executor lists for adoption (":"-separated;
    # empty: the service user's ~/.claude), besides PETAL_CLAUDE_CONFIG_DIR; how often their files are looked at.
    claude_session_dirs: str = ""
    claude_sessions_poll_s: float = Field(default=1.0, gt=0)
    # The CLI's retry and timeout knobs (unset: the CLI's defaults, which hold a dead API for minutes).
    claude_max_retries: int | None = Field(default=None, ge=0)
    claude_api_timeout_ms: int | None = Field(default=None, gt=0)
    claude_stream_idle_timeout_ms: int | None = Field(default=None, gt=0)

    # demo mode: the CLI talks to the scripted model; the page says so
    demo: bool = False

    log_format: LogFormat = "auto"
    log_level: LogLevel = "info"

    @property
    def project_root_paths(self) -> tuple[Path, ...]:
        return tuple(Path(p) for p in self.project_roots.split(":") if p.strip())

    @property
    def free_workdir(self) -> Path:
        """Where tasks without a project run (made absolute by `absolute`, which `load` applies)."""
        return self.workdir if self.workdir is not None else default_workdir()

    @property
    def pgdata(self) -> Path:
        return self.data_dir.resolve() / "pgdata"


def load() -> Settings:
    """The settings from the environment, every path made absolute (`absolute`); a value that cannot work is a
    ConfigError naming its variable."""
    try:
        settings = Settings()
    except ValidationError as exc:
        wrong = "; ".join(f"PETAL_{str(e['loc'][0]).upper()}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid settings: {wrong}") from None
    return absolute(settings)


def default_workdir() -> Path:
    """A free thread's working directory when PETAL_WORKDIR is unset: petal's own, beside the user's data
    ($XDG_DATA_HOME, else ~/.local/share), never a directory the service runs from."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser().resolve() / "petal-dispatch" / "workdir"


def _absolute(path: Path, cwd: Path) -> Path:
    """`~` expanded, a relative path taken from `cwd` (the directory the command started in), `..` and symlinks
    resolved: the one spelling every check and every spawn sees."""
    path = path.expanduser()
    return (path if path.is_absolute() else cwd / path).resolve()


def _absolute_list(value: str, cwd: Path) -> str:
    return ":".join(str(_absolute(Path(p.strip()), cwd)) for p in value.split(":") if p.strip())


def absolute(settings: Settings, cwd: Path | None = None) -> Settings:
    """Every path setting made absolute once, at load (and again after a command's own `--data-dir`): a spawn's
    sandbox binds exactly these paths, so an unresolved `.` would bind the current directory over its root.
    A relative PETAL_WORKDIR is refused rather than guessed: where workers write must be said outright."""
    cwd = cwd or Path.cwd()
    if settings.workdir is not None and not settings.workdir.expanduser().is_absolute():
        raise ConfigError(f"PETAL_WORKDIR={settings.workdir} is relative: give an absolute path (or ~/…), e.g. "
                          f"PETAL_WORKDIR=$HOME/petal-work, or unset it for the default {default_workdir()}")
    update: dict[str, object] = {"data_dir": _absolute(settings.data_dir, cwd),
                                 "project_roots": _absolute_list(settings.project_roots, cwd),
                                 "claude_session_dirs": _absolute_list(settings.claude_session_dirs, cwd)}
    for name in ("workdir", "worktree_dir", "claude_config_dir", "routines_clock_file"):
        value = getattr(settings, name)
        if value is not None:
            update[name] = _absolute(value, cwd)
    return settings.model_copy(update=update)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
