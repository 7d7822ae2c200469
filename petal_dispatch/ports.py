"""Start-up refusal for a listening port that is taken, as one line naming the service and the port."""

from __future__ import annotations

import errno
import socket

from shared import errors


def check_free(host: str, port: int, service: str) -> None:
    """Refuse to start `service` on host:port when something already listens there (or it may not bind).

    SO_REUSEADDR as the servers use it: only a listener, not connections lingering in TIME_WAIT, counts.
    """
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise errors.ConfigError(f"the {service} cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            why = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise errors.ConfigError(f"the {service} cannot listen on {host}:{port}: {why}") from None
