"""The permission hook of a terminal session (`PermissionRequest`, executor/terminals/permission.py): the CLI
runs it when it shows its own permission dialog; it asks the executor holding the session, which puts an approval
card on the page, and prints the answer for the CLI. It prints nothing — the dialog in the terminal decides — when
the executor is not there, or nobody answered on the page.

Self-contained (the standard library only, the wire's two frames written out here: tests/unit/test_terminals.py
holds them to shared/terminal_wire.py), run by its path and never imported: a sandboxed session runs a copy of it
with the system's Python, where neither this package nor its virtual environment is in sight."""

from __future__ import annotations

import json
import os
import socket
import struct
import sys

_HEAD = struct.Struct(">cI")
HELLO, ANSWER = b"H", b"A"


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
        hello = json.dumps({"op": "permission", "id": thread, "token": token, "event": event}).encode()
        sock.sendall(_HEAD.pack(HELLO, len(hello)) + hello)
        buffer = b""
        while data := sock.recv(65536):
            buffer += data
            if len(buffer) >= _HEAD.size:
                kind, length = _HEAD.unpack_from(buffer)
                if len(buffer) >= _HEAD.size + length:
                    if kind == ANSWER:
                        sys.stdout.write(buffer[_HEAD.size:_HEAD.size + length].decode())
                    return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
