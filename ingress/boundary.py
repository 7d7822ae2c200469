"""The ingress's outer boundary, as pure ASGI middleware in front of every route (the SSE stream and the
static files included), in every auth mode, open mode too.

- Host: only the names this server is reached by (the bind's loopback names and address with its port,
  plus PETAL_ALLOWED_HOSTS). A page on another site that rebinds its own name to 127.0.0.1 still sends
  its own name as Host, so it is answered 421 before anything runs (DNS rebinding).
- Origin: a state-changing request a browser sends from another origin is refused with 403 (CSRF). A
  request with neither Origin nor Referer is not a browser's cross-site request (curl, scripts): allowed.
- Proxies: forwarded headers (the identity header, X-Forwarded-Proto/-For) count only from the proxy
  itself: a peer in PETAL_TRUSTED_PROXIES that, when PETAL_PROXY_SECRET is set (always in proxy mode), also
  sends the secret as X-Petal-Proxy-Secret (compared in constant time). Loopback alone proves nothing:
  every process on the machine is on loopback.
- Every response carries the page's security headers (CSP, nosniff, no referrer, no framing).
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ingress.problems import problem

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
PROXY_SECRET_HEADER = b"x-petal-proxy-secret"
_STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# No inline script anywhere; styles inline only for the sandboxed HTML previews (which inherit this policy).
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
       "connect-src 'self'; frame-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    # same-origin, not no-referrer: under no-referrer Chromium sends `Origin: null` with a form POST (the sign-in),
    # which the Origin check must refuse; same-origin still sends nothing to any other site
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]


def _split_host(value: str) -> tuple[str, int | None] | None:
    """'name[:port]' or '[v6][:port]' → (lower-case name, port), or None when malformed."""
    value = value.strip().lower()
    if not value:
        return None
    try:
        parts = urlsplit("//" + value)
        port = parts.port
    except ValueError:
        return None
    if parts.username is not None or parts.path or parts.query or parts.fragment or not parts.hostname:
        return None
    name = parts.hostname
    return (f"[{name}]" if ":" in name else name), port


def parse_hosts(raw: str) -> frozenset[tuple[str, int | None]]:
    out = set()
    for item in raw.split(","):
        if not item.strip():
            continue
        parsed = _split_host(item)
        if parsed is None:
            raise ValueError(f"PETAL_ALLOWED_HOSTS: {item.strip()!r} is not a host name (name or name:port)")
        out.add(parsed)
    return frozenset(out)


def parse_networks(raw: str) -> tuple[Network, ...]:
    nets = []
    for item in raw.split(","):
        if item.strip():
            try:
                nets.append(ipaddress.ip_network(item.strip().strip("[]"), strict=False))
            except ValueError:
                raise ValueError(f"PETAL_TRUSTED_PROXIES: {item.strip()!r} is not an address or CIDR") from None
    return tuple(nets)


@dataclass(frozen=True)
class BoundaryConfig:
    # (name, port): port None matches any port (a public name behind the proxy, reached on 443)
    hosts: frozenset[tuple[str, int | None]]
    trusted_proxies: tuple[Network, ...]
    # bound to 0.0.0.0 / ::, reached by any of the machine's addresses: an IP literal cannot be rebound
    any_ip_port: int | None = None
    # what the proxy sends as X-Petal-Proxy-Secret (utf-8); None: the peer's address alone decides
    proxy_secret: bytes | None = field(default=None, repr=False)  # a secret: never in a log line

    @classmethod
    def build(cls, bind_host: str, bind_port: int, allowed_hosts: str, trusted_proxies: str,
              proxy_secret: str | None = None) -> BoundaryConfig:
        names = set(LOOPBACK_NAMES)
        bind = bind_host.strip("[]").lower()
        any_ip = None
        try:
            ip = ipaddress.ip_address(bind)
            if ip.is_unspecified:
                any_ip = bind_port
            else:  # a specific address (a tailnet IP): a raw IP cannot be rebound
                names.add(f"[{ip}]" if ip.version == 6 else str(ip))
        except ValueError:
            names.add(bind)
        hosts = {(n, bind_port) for n in names} | set(parse_hosts(allowed_hosts))
        return cls(frozenset(hosts), parse_networks(trusted_proxies), any_ip,
                   proxy_secret.encode("utf-8", "surrogatepass") if proxy_secret else None)

    def host_allowed(self, value: str, default_ports: tuple[int, ...] = (80, 443), *, any_ip: bool = True) -> bool:
        parsed = _split_host(value)
        if parsed is None:
            return False
        name, port = parsed
        ports = (port,) if port is not None else default_ports  # no port: the scheme's default
        if any_ip and self.any_ip_port is not None and self.any_ip_port in ports and _is_ip(name):
            return True
        return (name, None) in self.hosts or any((name, p) in self.hosts for p in ports)

    def origin_allowed(self, value: str, host: str | None = None) -> bool:
        """A configured name, or the request's own (already checked) Host: same-origin."""
        try:
            parts = urlsplit(value.strip())
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null" (sandboxed frames, file:) and anything that is not a web origin
        if host is not None and parts.netloc.lower() == host.strip().lower():
            return True
        return self.host_allowed(parts.netloc, (80,) if parts.scheme == "http" else (443,), any_ip=False)

    def trusts(self, peer: str | None) -> bool:
        if not peer:
            return False
        try:
            ip = ipaddress.ip_address(peer.strip("[]"))
        except ValueError:
            return False
        return any(ip in net for net in self.trusted_proxies)

    def secret_matches(self, scope: Scope) -> bool:
        """The request carries the proxy secret (always true when none is configured)."""
        if self.proxy_secret is None:
            return True
        given = _header(scope, PROXY_SECRET_HEADER)
        # bytes, compared in constant time whatever their length or content
        return given is not None and hmac.compare_digest(given.encode("latin-1"), self.proxy_secret)

    def from_proxy(self, scope: Scope) -> bool:
        """The request came through the proxy: a trusted peer that knows the secret."""
        return self.trusts(peer(scope)) and self.secret_matches(scope)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def _header(scope: Scope, name: bytes) -> str | None:
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    for k, v in headers:
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def peer(scope: Scope) -> str | None:
    client = scope.get("client")
    return client[0] if client else None


def forwarded(config: BoundaryConfig, scope: Scope) -> tuple[str, str]:
    """(scheme, client address) as the original client saw them: the proxy's headers count only when the
    request came through the proxy (a trusted peer, with the secret when one is set)."""
    scheme, client = scope.get("scheme", "http"), peer(scope) or "unknown"
    if config.from_proxy(scope):
        proto = (_header(scope, b"x-forwarded-proto") or "").split(",")[0].strip().lower()
        if proto in ("http", "https"):
            scheme = proto
        hops = [h.strip() for h in (_header(scope, b"x-forwarded-for") or "").split(",") if h.strip()]
        if hops:
            client = hops[-1]  # the hop the trusted proxy itself saw; earlier entries are client-supplied
    return scheme, client


class BoundaryMiddleware:
    """Host, Origin and security headers, outermost: a refused request reaches no route."""

    def __init__(self, app: ASGIApp, config: BoundaryConfig):
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message = {**message, "headers": [*message.get("headers", []),
                                                  *(h for h in SECURITY_HEADERS if h[0] not in present)]}
            await send(message)

        host = _header(scope, b"host")
        if host is None or not self.config.host_allowed(host):
            await problem(421, f"this server does not answer to the host {host!r}: add the name to "
                               "PETAL_ALLOWED_HOSTS if it is yours")(scope, receive, with_headers)
            return
        if scope["method"] in _STATE_CHANGING:
            origin = _header(scope, b"origin")
            referer = _header(scope, b"referer") if origin is None else None
            source = origin if origin is not None else referer
            if source is not None and not self.config.origin_allowed(source, host):
                await problem(403, f"cross-origin request refused (from {source[:200]!r})")(scope, receive,
                                                                                            with_headers)
                return
        await self.app(scope, receive, with_headers)

