"""Typed settings, read once from the environment at the edge and passed down."""

from __future__ import annotations

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


class Settings(BaseSettings):
    """Every knob of both services. Library code receives this object; it never reads os.environ."""

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
    sse_heartbeat_s: float = Field(default=15.0, gt=0)
    # recent SSE frames kept in memory; a client further behind is cut off (it resumes by Last-Event-ID)
    sse_client_buffer: int = Field(default=20_000, ge=10)
    ingress_host: str = "127.0.0.1"
    ingress_port: int = Field(default=8000, ge=0, le=65535)
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
    max_workers: int = Field(default=4, ge=1)
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
    # Where tasks without a project run.
    workdir: Path = Path(".")
    # Directories a project's repository must lie in (separated by ":"); empty: the service user's home.
    project_roots: str = ""
    # Where workers of a project get their git worktrees (unset: <data_dir>/worktrees), and whether a
    # worktree stays after its changes are recorded (its branch stays until merged or discarded anyway).
    worktree_dir: Path | None = None
    keep_worktrees: bool = False
    claude_bin: str = "claude"
    # Every spawn sandboxed (off: workers run as this user with its reach; logged, shown in /api/info and the
    # page). The hosts its tools may reach through the sandbox's proxy (comma-separated host or host:port;
    # the model API is always reachable by the CLI itself); a project may add its own.
    sandbox: SandboxMode = "bwrap"
    sandbox_allow: str = ""
    claude_config_dir: Path | None = None
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
    def pgdata(self) -> Path:
        return self.data_dir.resolve() / "pgdata"


def load() -> Settings:
    """The settings from the environment; a value that cannot work is a ConfigError naming its variable."""
    try:
        return Settings()
    except ValidationError as exc:
        wrong = "; ".join(f"PETAL_{str(e['loc'][0]).upper()}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid settings: {wrong}") from None
