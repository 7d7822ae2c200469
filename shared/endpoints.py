"""Outbound URLs the user supplies (push subscription endpoints): only to public addresses.

A push endpoint is stored by the ingress and fetched by the executor; without this check anyone who can
subscribe makes the executor POST to 127.0.0.1, the LAN or a cloud metadata address (SSRF). The ingress
checks when a subscription is stored and the executor again before each send (a stored row, or a name that
now resolves elsewhere); the executor's connections for a push also go through `guarded_session`, which
refuses each socket whose address is not public — so neither a name that changes between the check and the
connect (DNS rebinding) nor a redirect from a public endpoint to an inside address gets through.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:  # aiohttp is imported where a session is made: the ingress only checks (0.18 s of its start)
    import aiohttp

RESOLVE_TIMEOUT_S = 5.0  # a push service's name resolves in well under this


def _refused(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_loopback: bool) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return not allow_loopback
    # is_global is False for private, link-local (169.254.169.254), CGNAT, documentation, reserved…
    return not ip.is_global or ip.is_multicast


async def refusal(url: str, *, allow_loopback: bool = False) -> str | None:
    """Why the URL may not be fetched, or None when every address its host resolves to is public."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "the endpoint is not a URL"
    if not host:
        return "the endpoint has no host"
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, port or 443, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S)
    except (OSError, TimeoutError):
        return f"the endpoint's host {host!r} does not resolve"
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if _refused(ip, allow_loopback):
            return f"the endpoint's host {host!r} is not a public address ({ip})"
    return None


def guarded_session(*, allow_loopback: bool = False, timeout_s: float) -> aiohttp.ClientSession:
    """A client session that connects only to public addresses (loopback too when allowed): the check is
    made on the address of every socket it opens, redirects and re-resolved names included."""

    def open_socket(addr_info: Any) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        if _refused(ip, allow_loopback):
            raise OSError(errno.EACCES, f"refused to connect to a non-public address ({ip})")
        return socket.socket(family, type_, proto)

    import aiohttp

    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(socket_factory=open_socket),
                                 timeout=aiohttp.ClientTimeout(total=timeout_s))
