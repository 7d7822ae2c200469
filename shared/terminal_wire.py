"""The wire between `petal-dispatch claude` / `attach` / the permission hook and the executor holding a terminal
session: frames on a unix socket in the executor's run directory (0600, same user only, checked by peer
credentials). Standard library only: the hook runs it in a fresh interpreter for every permission prompt.

A frame is one kind byte, a 4-byte big-endian length and the payload. The first frame of a connection is HELLO
(JSON: {"op": "start" | "attach" | "permission", ...}); then:
- the terminal sends DATA (its keys), SIZE ({"rows", "cols"}) and DETACH;
- the executor sends DATA (the screen's bytes), NOTE (a line the wrapper prints on its own), REFUSED (why, then
  it closes), and EXIT ({"code"}: the CLI ended);
- a permission hook gets one ANSWER (the hook's JSON output) or the connection closes (nothing decided).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

HELLO, DATA, SIZE, DETACH, NOTE, REFUSED, EXIT, ANSWER = b"H", b"D", b"S", b"Q", b"N", b"R", b"X", b"A"
KINDS = frozenset({HELLO, DATA, SIZE, DETACH, NOTE, REFUSED, EXIT, ANSWER})
MAX_FRAME = 1 << 20  # a paste or a screen is far less; a bigger length is a broken peer
_HEAD = struct.Struct(">cI")
SOCKET_NAME = "terminals.sock"
# Ctrl-\ then d: the wrapper leaves the session running under the executor
DETACH_KEYS = (b"\x1c", b"d")


def detach_keys(data: bytes, held: bool) -> tuple[bytes, bool, bool]:
    """One read of the terminal's keys: what goes to the session, whether the terminal detaches, and whether a
    Ctrl-\\ at its end is held for the next read (`held` says one was held before). The two keys can come in one
    read (typed fast, a loaded machine) or in two."""
    if held:
        data = DETACH_KEYS[0] + data
    at = data.find(DETACH_KEYS[0] + DETACH_KEYS[1])
    if at >= 0:
        return data[:at], True, False
    if data.endswith(DETACH_KEYS[0]):
        return data[:-1], False, True
    return data, False, False


def frame(kind: bytes, payload: bytes | str | dict[str, Any] = b"") -> bytes:
    if isinstance(payload, dict):
        payload = json.dumps(payload)
    if isinstance(payload, str):
        payload = payload.encode()
    return _HEAD.pack(kind, len(payload)) + payload


class Frames:
    """Bytes in, whole frames out (both sides read with it)."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self.buffer += data
        out = []
        while len(self.buffer) >= _HEAD.size:
            kind, length = _HEAD.unpack_from(self.buffer)
            if kind not in KINDS or length > MAX_FRAME:
                raise ValueError(f"not a terminal frame (kind {kind!r}, length {length})")
            if len(self.buffer) < _HEAD.size + length:
                break
            out.append((kind, bytes(self.buffer[_HEAD.size:_HEAD.size + length])))
            del self.buffer[:_HEAD.size + length]
        return out


def pointer(env: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """Where the running executor leaves a link to its socket, for a wrapper started anywhere (no data dir
    named): $XDG_STATE_HOME/petal-dispatch/terminals.sock, by default under ~/.local/state."""
    state = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return Path(state) / "petal-dispatch" / SOCKET_NAME
