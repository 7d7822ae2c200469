"""What a sandboxed session's output may not do to the user's terminal: set its clipboard. OSC 52
(`ESC ] 52 ; <target> ; <base64> BEL|ST`) writes the clipboard of the terminal that shows it; from a session in the
sandbox (a process there writes its terminal) it would put a command the user pastes next. Dropped from the bytes
the executor relays, a sequence split across reads included; everything else passes as it came."""

from __future__ import annotations

ESC = b"\x1b"
CLIPBOARD = b"\x1b]52;"
BEL, ST = b"\x07", b"\x1b\\"


def _end(data: bytes, i: int) -> int:
    """Where the OSC that runs at `i` has ended (past its BEL or ST), or -1: not in these bytes."""
    found = [at + len(mark) for mark in (BEL, ST) if (at := data.find(mark, i)) >= 0]
    return min(found) if found else -1


class ClipboardFilter:
    """One session's output, less its clipboard writes."""

    def __init__(self) -> None:
        self.held = b""  # the start of what may be a sequence, kept for the next read
        self.dropping = False  # inside an OSC 52, until its end

    def feed(self, data: bytes) -> bytes:
        data, self.held = self.held + data, b""
        if not self.dropping and ESC not in data:
            return data
        out = bytearray()
        i = 0
        while i < len(data):
            if self.dropping:
                end = _end(data, i)
                if end < 0:
                    self.held = b"\x1b" if data.endswith(b"\x1b") else b""  # an ST's first byte, maybe
                    return bytes(out)
                self.dropping, i = False, end
                continue
            j = data.find(ESC, i)
            if j < 0:
                out += data[i:]
                break
            out += data[i:j]
            head = data[j:j + len(CLIPBOARD)]
            if len(head) < len(CLIPBOARD) and CLIPBOARD.startswith(head):
                self.held = data[j:]  # it may be one: decided with the next read
                break
            if head == CLIPBOARD:
                self.dropping, i = True, j + len(CLIPBOARD)
                continue
            out += data[j:j + 1]
            i = j + 1
        return bytes(out)
