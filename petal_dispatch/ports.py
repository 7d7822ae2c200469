"""Start-up refusal for a listening port that is taken, as one line naming the service, the port and the flag
(and setting) that chooses it."""

from __future__ import annotations

import errno
import socket

from shared import errors

# what sets each service's port, named in the refusal so the user knows what to change
SETTINGS = {"ingress": "--port / PETAL_INGRESS_PORT", "harness MCP server": "--mcp-port / PETAL_MCP_PORT"}


def check_free(host: str, port: int, service: str, *, shared: bool = False) -> None:
    """Refuse to start `service` on host:port when something already listens there (or it may not bind).

    SO_REUSEADDR as the servers use it: only a listener, not connections lingering in TIME_WAIT, counts.
    `shared` (PETAL_INGRESS_REUSE_PORT): a listener that shares the port (another ingress) does not count.
    """
    if port == 0:
        return
    knob = f" ({SETTINGS[service]})" if service in SETTINGS else ""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise errors.ConfigError(f"the {service} cannot listen on {host}:{port}: {exc.strerror}{knob}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            why = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise errors.ConfigError(f"the {service} cannot listen on {host}:{port}: {why}{knob}") from None
