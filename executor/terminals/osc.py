"""What a sandboxed session's output may ask of the user's terminal: a process in the sandbox writes that terminal,
and an operating system command (OSC, `ESC ] <number> ; … BEL|ST`) can set the clipboard (52: a command the user
pastes next; kitty's 5522), write or fetch files (iTerm2's 1337, kitty's 5113) and more, terminal by terminal. So only
the OSCs a CLI's screen uses pass (titles, colours and their queries, the working directory, links, notifications,
prompt marks); every other one is dropped whole, a sequence split across reads included.

The number is read as terminals read it (digits, leading zeros and all: `ESC ]052;` is 52 to tmux), after either
introducer a UTF-8 stream carries (`ESC ]`, or C1's U+009D); a sequence ends at BEL, ST (`ESC \\` or U+009C), or
at CAN and SUB, which cancel it. Everything that is not an OSC passes as it came."""

from __future__ import annotations

# title (0-2), palette and colours set, queried and reset (4, 10-12, 104, 110-112), working directory (7), links (8),
# notifications (9, 777), prompt marks (133; VS Code's 633)
ALLOWED = frozenset({0, 1, 2, 4, 7, 8, 9, 10, 11, 12, 104, 110, 111, 112, 133, 633, 777})
STARTS = (b"\x1b]", b"\xc2\x9d")
ENDS = (b"\x07", b"\x1b\\", b"\xc2\x9c", b"\x18", b"\x1a")
# an introducer, a number and its `;`: what is held back at most before a verdict (a longer number is not allowed)
MAX_HEAD = 2 + 6 + 1
_LEADS = b"\x1b\xc2"  # the first bytes of an introducer or of a two-byte end


def _end(data: bytes, i: int) -> int:
    """Where the OSC that runs at `i` has ended (past its end), or -1: not in these bytes."""
    found = [at + len(mark) for mark in ENDS if (at := data.find(mark, i)) >= 0]
    return min(found) if found else -1


def _next_lead(data: bytes, i: int) -> int:
    found = [at for lead in (b"\x1b", b"\xc2") if (at := data.find(lead, i)) >= 0]
    return min(found) if found else -1


def _judge(data: bytes, j: int) -> tuple[str, int]:
    """What the bytes at `j` (ESC or 0xC2) are: ("plain", 1) not an OSC; ("more", 0) undecided until the next read;
    ("pass", n) an allowed OSC's first n bytes; ("drop", n) the first n bytes of one that is dropped to its end."""
    intro = data[j:j + 2]
    if len(intro) < 2:
        return "more", 0
    if intro not in STARTS:
        return "plain", 1
    k = j + 2
    while k < len(data) and k - j < MAX_HEAD and data[k:k + 1].isdigit():
        k += 1
    if k == len(data) and k - j < MAX_HEAD:
        return "more", 0
    digits, after = data[j + 2:k], data[k:k + 1]
    allowed = bool(digits) and k - j < MAX_HEAD and int(digits) in ALLOWED
    if allowed and after == b";":
        return "pass", k + 1 - j
    if allowed and after in (b"\x07", b"\x1b", b"\xc2", b"\x18", b"\x1a"):  # one without parameters (104, 110…)
        return "pass", k - j
    return "drop", k - j


class OscFilter:
    """One session's output, less the OSCs it may not send the user's terminal."""

    def __init__(self) -> None:
        self.held = b""  # the start of what may be a sequence, kept for the next read
        self.dropping = False  # inside a dropped OSC, until its end

    def feed(self, data: bytes) -> bytes:
        data, self.held = self.held + data, b""
        if not self.dropping and not any(lead in data for lead in (b"\x1b", b"\xc2")):
            return data
        out = bytearray()
        i = 0
        while i < len(data):
            if self.dropping:
                end = _end(data, i)
                if end < 0:
                    self.held = data[-1:] if data[-1:] and data[-1] in _LEADS else b""  # an end's first byte, maybe
                    return bytes(out)
                self.dropping, i = False, end
                continue
            j = _next_lead(data, i)
            if j < 0:
                out += data[i:]
                break
            out += data[i:j]
            verdict, n = _judge(data, j)
            if verdict == "more":
                self.held = data[j:]
                break
            if verdict == "drop":
                self.dropping = True
            else:
                out += data[j:j + n]
            i = j + n
        return bytes(out)
