"""The ingress's frozen config built from the settings, and the refusals of an ingress set-up that cannot work
(its bind, its auth, its host names), each one line naming the setting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from petal_dispatch.config import Settings, is_loopback
from shared.errors import ConfigError

if TYPE_CHECKING:
    from ingress.app import IngressConfig
    from ingress.auth import AuthConfig
    from ingress.boundary import BoundaryConfig

# The shortest shared secret token mode (and the proxy secret) accepts.
MIN_TOKEN_CHARS = 16



def check_ingress_bind(settings: Settings) -> None:
    if settings.open_mode and not is_loopback(settings.ingress_host) and not settings.force_open:
        raise ConfigError(
            f"refusing open mode (no authentication) on {settings.ingress_host}: bind to 127.0.0.1, turn "
            "OPEN_MODE off, or set PETAL_FORCE_OPEN=1 if the network itself is trusted (e.g. a tailnet)")


def auth_config(settings: Settings) -> AuthConfig:
    from ingress.auth import AuthConfig

    mode = "open" if settings.open_mode else settings.auth_mode
    users = frozenset(u.strip() for u in settings.allowed_users.split(",") if u.strip())
    return AuthConfig(mode=mode, allowed_users=users, token=settings.auth_token, max_body_bytes=settings.max_body_bytes,
                      upload_max_bytes=settings.attachment_max_bytes)


def check_auth(settings: Settings) -> str | None:
    """The refusals of an auth set-up that cannot work, each one line naming the setting; the proxy secret."""
    auth = auth_config(settings)
    if auth.mode == "token" and not auth.token:
        raise ConfigError("token mode needs PETAL_AUTH_TOKEN")
    if auth.mode == "token" and auth.token and len(auth.token.get_secret_value()) < MIN_TOKEN_CHARS:
        # the limiter slows guessing; it cannot make a short word safe
        raise ConfigError(f"PETAL_AUTH_TOKEN is too short: at least {MIN_TOKEN_CHARS} characters "
                          "(e.g. `openssl rand -hex 16`)")
    secret = (settings.proxy_secret.get_secret_value() if settings.proxy_secret else "") or None
    if auth.mode == "proxy" and secret is None:
        # the identity header alone would let any local process (a worker's script) be the user
        raise ConfigError("proxy mode needs PETAL_PROXY_SECRET: set it to a random string "
                          "(`openssl rand -hex 32`) and have the proxy send it as X-Petal-Proxy-Secret")
    if secret is not None and len(secret) < MIN_TOKEN_CHARS:
        raise ConfigError(f"PETAL_PROXY_SECRET is too short: at least {MIN_TOKEN_CHARS} characters "
                          "(e.g. `openssl rand -hex 32`)")
    return secret


def check_ingress(settings: Settings) -> None:
    """The ingress's refusals (its bind, its auth set-up, its host names), before it waits for the database:
    a set-up that cannot work says so at once."""
    _ingress_guards(settings)


def _ingress_guards(settings: Settings) -> tuple[AuthConfig, BoundaryConfig]:
    from ingress.boundary import BoundaryConfig

    check_ingress_bind(settings)
    secret = check_auth(settings)
    try:
        boundary = BoundaryConfig.build(settings.ingress_host, settings.ingress_port, settings.allowed_hosts,
                                        settings.trusted_proxies, secret)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return auth_config(settings), boundary


def ingress_config(settings: Settings, dsn: str) -> IngressConfig:
    """The ingress's config (`dsn`: its role's), or the ConfigError of `check_ingress`."""
    from ingress.app import IngressConfig

    auth, boundary = _ingress_guards(settings)
    return IngressConfig(
        dsn=dsn,
        auth=auth,
        boundary=boundary,
        host=settings.ingress_host,
        port=settings.ingress_port,
        reuse_port=settings.ingress_reuse_port,
        sse_heartbeat_s=settings.sse_heartbeat_s,
        sse_client_buffer=settings.sse_client_buffer,
        push_allow_loopback=settings.push_allow_loopback,
        demo=settings.demo,
        message_attachments_max_bytes=settings.message_attachments_max_bytes,
    )
