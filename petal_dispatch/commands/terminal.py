"""`petal-dispatch claude [the CLI's arguments]` and `petal-dispatch attach [id]`: the user's interactive Claude
Code, held by the executor in a pseudo-terminal and shown here as if `claude` ran in this terminal.

This side only relays: keys and the window's size to the executor, the screen's bytes back (shared/terminal_wire.py).
Closing this terminal, or Ctrl-\\ then d, leaves the session running under the executor; `attach` brings it
back. The exit code is the CLI's.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import selectors
import signal
import socket
import struct
import sys
import termios
import tty
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from petal_dispatch.config import Settings
from shared import terminal_wire as wire

# what of this terminal's environment the session gets (the user's login and terminal, as `claude` run here
# would): the rest of the environment is the user's own too, so it is passed whole, less what petal sets itself
NOT_PASSED = ("PETAL_", "CLAUDE_CODE_SSE_PORT")


def socket_path(settings: Settings, named: bool) -> Path:
    """The executor's socket: in the data directory when one is named (`--data-dir`, PETAL_DATA_DIR), else the
    link the running executor left (terminal_wire.pointer)."""
    if named:
        return settings.data_dir.resolve() / "run" / wire.SOCKET_NAME
    return wire.pointer()


def _size() -> dict[str, int]:
    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(sys.stdin.fileno(), termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        rows, cols = 40, 120
    return {"rows": rows or 40, "cols": cols or 120}


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # a link to where it listens (a short path: a socket's may not pass 108 bytes, a data directory's can)
        sock.connect(os.path.realpath(path))
    except OSError as exc:
        sock.close()
        raise ConnectionError(f"no executor is listening at {path} ({exc.strerror}); start it with "
                              "`petal-dispatch up`, or name its data directory (PETAL_DATA_DIR)") from None
    return sock


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """The terminal in raw mode while the session shows (every key goes to the CLI), restored after."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def relay(sock: socket.socket, hello: dict[str, Any]) -> int:
    """Send the hello, then relay until the session ends (its exit code) or this terminal detaches (0)."""
    sock.sendall(wire.frame(wire.HELLO, hello))
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    frames = wire.Frames()
    resized = os.pipe()  # SIGWINCH wakes the loop through a pipe: the handler does nothing else
    os.set_blocking(resized[1], False)
    old = signal.signal(signal.SIGWINCH, lambda *_: os.write(resized[1], b"."))
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "sock")
    sel.register(stdin, selectors.EVENT_READ, "keys")
    sel.register(resized[0], selectors.EVENT_READ, "size")
    ctrl_backslash = False
    try:
        with _raw(stdin):
            while True:
                for key, _ in sel.select():
                    if key.data == "size":
                        os.read(resized[0], 1024)
                        sock.sendall(wire.frame(wire.SIZE, _size()))
                    elif key.data == "keys":
                        data = os.read(stdin, 65536)
                        if not data:  # stdin closed: leave the session running
                            sock.sendall(wire.frame(wire.DETACH))
                            return 0
                        data, detach, ctrl_backslash = wire.detach_keys(data, ctrl_backslash)
                        if data:
                            sock.sendall(wire.frame(wire.DATA, data))
                        if detach:
                            sock.sendall(wire.frame(wire.DETACH))
                            _say(f"\r\n[petal-dispatch: detached; `petal-dispatch attach {hello.get('id') or ''}` "
                                 "brings it back]\r\n")
                            return 0
                    else:
                        data = sock.recv(65536)
                        if not data:
                            _say("\r\n[petal-dispatch: the executor went away]\r\n")
                            return 1
                        for kind, payload in frames.feed(data):
                            if kind == wire.DATA:
                                os.write(stdout, payload)
                            elif kind == wire.NOTE:
                                note = json.loads(payload)
                                hello["id"] = note.get("id") or hello.get("id")
                                if note.get("text"):
                                    _say(f"\r\n[petal-dispatch: {note['text']}]\r\n")
                            elif kind == wire.REFUSED:  # (the terminal is raw still: a line ends in \r\n)
                                _say(f"petal-dispatch: {payload.decode()}\r\n")
                                return 2
                            elif kind == wire.EXIT:
                                return int(json.loads(payload).get("code", 1))
    finally:
        signal.signal(signal.SIGWINCH, old)
        for fd in resized:
            os.close(fd)
        sel.close()


def _say(text: str) -> None:
    os.write(sys.stderr.fileno(), text.encode())


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(NOT_PASSED)}


def _holder() -> str:
    try:
        return os.ttyname(sys.stdin.fileno())[:200]
    except OSError:
        return "a terminal"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def claude(args: argparse.Namespace, settings: Settings) -> int:
    if not os.isatty(sys.stdin.fileno()):
        print("petal-dispatch: `claude` runs in a terminal (its input is not one); for a prompt without one, "
              "send it from the page or run `claude -p`", file=sys.stderr)
        return 2
    rest = list(args.claude_args)
    sandbox = rest[:1] == ["--sandbox"]  # petal's own flag, before the CLI's
    hello = {"op": "start", "argv": rest[1:] if sandbox else rest, "cwd": os.getcwd(), "env": _env(),
             "sandbox": sandbox, "holder": _holder(), "umask": _umask(), **_size()}
    return _run(args, settings, hello)


def attach(args: argparse.Namespace, settings: Settings) -> int:
    if not os.isatty(sys.stdin.fileno()):
        print("petal-dispatch: `attach` shows the session in a terminal (its input is not one)", file=sys.stderr)
        return 2
    hello = {"op": "attach", "id": args.id, "holder": _holder(), **_size()}
    return _run(args, settings, hello)


def _run(args: argparse.Namespace, settings: Settings, hello: dict[str, Any]) -> int:
    named = getattr(args, "data_dir", None) is not None or bool(os.environ.get("PETAL_DATA_DIR"))
    try:
        sock = _connect(socket_path(settings, named))
    except ConnectionError as exc:
        print(f"petal-dispatch: {exc}", file=sys.stderr)
        return 2
    with sock:
        return relay(sock, hello)


def add_parsers(sub: Any, data_dir_option: Any) -> None:
    p = sub.add_parser("claude", help="your interactive Claude Code, held by the executor: followed and steered "
                                      "from the page, detached with Ctrl-\\ d", prefix_chars="+")
    p.add_argument("claude_args", nargs=argparse.REMAINDER, help="the CLI's own arguments, passed as they are")
    p.set_defaults(handler=claude, data_dir=None)
    p = sub.add_parser("attach", help="show a terminal session held by the executor here again")
    p.add_argument("id", nargs="?", help="the session (its thread id or a prefix; default: the one started last)")
    data_dir_option(p)
    p.set_defaults(handler=attach)
