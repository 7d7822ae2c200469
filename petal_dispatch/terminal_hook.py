"""The permission hook of a terminal session (`PermissionRequest`, executor/terminals/permission.py): the CLI
runs it when it shows its own permission dialog; it asks the executor holding the session, which puts an approval
card on the page, and prints the answer for the CLI. It prints nothing — the dialog in the terminal decides — when
the executor is not there, when nobody answered on the page, or when it is ended because the terminal answered
first. Standard library only, and quick to start: it runs once per prompt."""

from __future__ import annotations

import json
import os
import socket
import sys

from shared import terminal_wire as wire


def main() -> int:
    try:
        event = json.loads(sys.stdin.read() or "{}")
        path, thread, token = (os.environ[k] for k in ("PETAL_TERMINAL_SOCKET", "PETAL_TERMINAL_ID",
                                                       "PETAL_TERMINAL_TOKEN"))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
    except (KeyError, OSError, ValueError):
        return 0  # no decision: the terminal's dialog stays
    with sock:
        sock.sendall(wire.frame(wire.HELLO, {"op": "permission", "id": thread, "token": token, "event": event}))
        frames = wire.Frames()
        while data := sock.recv(65536):
            for kind, payload in frames.feed(data):
                if kind == wire.ANSWER:
                    sys.stdout.write(payload.decode())
                    return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
