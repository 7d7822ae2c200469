"""A terminal session's screen as the terminal shows it (pyte), and what the executor reads from it.

Observed on the interactive CLI 2.1.328 (docs/claude-cli.md "Interactive mode"): its input box is a line starting
with the prompt glyph (`❯`, then a no-break space), between two rules of `─`; while a turn runs the footer
says "esc to interrupt"; a permission dialog or a picker replaces the box. So the CLI waits for its user's
input when the box is there and the footer does not say it is busy; the input line is empty when nothing follows
the glyph. A message from the page is typed only then: never into a turn, a dialog, or the user's own typing.
"""

from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass

PROMPT = "❯"
BUSY = "esc to interrupt"
RULE = "─"


@dataclass(frozen=True)
class State:
    at_prompt: bool  # the input box is shown and no turn runs
    typed: str  # what the input line holds (stripped)
    box: bool = False  # the input box is shown (no dialog over it)

    @property
    def ready(self) -> bool:
        """A message may be typed now."""
        return self.at_prompt and not self.typed


def read(lines: list[str]) -> State:
    """The CLI's state from its screen's lines (pure)."""
    busy = any(BUSY in line for line in lines)
    for i, line in enumerate(lines):
        if not line.startswith(PROMPT):
            continue
        above = lines[i - 1].strip() if i else ""
        if above.startswith(RULE):  # the input box (a submitted prompt is shown as `❯ text` without a rule above)
            typed = line[len(PROMPT):].strip()  # (the no-break space after the glyph is stripped too)
            # more lines of the same input (a multi-line draft) until the closing rule
            for more in lines[i + 1:]:
                if more.strip().startswith(RULE):
                    break
                typed = f"{typed}\n{more.strip()}".strip()
            return State(at_prompt=not busy, typed=typed, box=True)
    return State(at_prompt=False, typed="")


# Control strings pyte does not know (it would print their text): the CLI's terminal queries, e.g. its graphics
# probe `ESC _ G i=31,s=1,… ESC \` (APC), and DCS, PM and OSC strings, ended by ST or BEL.
_STRINGS = re.compile(rb"\x1b[_P^\]][^\x07\x1b]*(?:\x07|\x1b\\)")
_OPEN = re.compile(rb"\x1b(?:[_P^\]][^\x07\x1b]*(?:\x1b)?)?$")  # one cut off at the end of a read
MAX_OPEN = 65_536  # an unterminated string longer than this is dropped


def without_strings(carried: bytes, data: bytes) -> tuple[bytes, bytes]:
    """(what the screen is fed, what is carried to the next read) (pure)."""
    data = _STRINGS.sub(b"", carried + data)
    cut = _OPEN.search(data)
    if cut is None:
        return data, b""
    rest = data[cut.start():]
    return data[:cut.start()], rest if len(rest) <= MAX_OPEN else b""


# The screen is fed on the executor's event loop, a slice at a time and for so long at a look: one escape that repaints
# the whole screen (DECALN `ESC # 8`, an erase) costs milliseconds at 50×200, and a process in a sandboxed session
# chooses its output (64 KiB of DECALN held the loop for minutes, past the executor's lease).
SLICE = 64
TICK_S = 0.005


class Screen:
    """The session's screen, fed every byte the CLI writes: what is not in yet waits in order (`pending` bytes)."""

    def __init__(self, rows: int, cols: int):
        import pyte  # here: most executors never hold a terminal, and pyte with wcwidth is 0.14 s of a start

        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.carried = b""
        self._queue: deque[bytes] = deque()
        self._at = 0  # where the first queued piece is taken from
        self.pending = 0

    def feed(self, data: bytes) -> bool:
        """Queue `data` and feed what waits for at most TICK_S; whether all of it is in (else `drain` again)."""
        shown, self.carried = without_strings(self.carried, data)
        if shown:
            self._queue.append(shown)
            self.pending += len(shown)
        return self.drain()

    def drain(self, budget_s: float = TICK_S) -> bool:
        started = time.monotonic()
        while self._queue:
            first = self._queue[0]
            piece = first[self._at:self._at + SLICE]
            self._at += len(piece)
            if self._at >= len(first):
                self._queue.popleft()
                self._at = 0
            self.pending -= len(piece)
            self.stream.feed(piece)
            if time.monotonic() - started >= budget_s:
                break
        return not self._queue

    def resize(self, rows: int, cols: int) -> None:
        self.screen.resize(rows, cols)

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display]

    def state(self) -> State:
        return read(self.lines())

    def redraw(self) -> bytes:
        """What a terminal attaching again is shown before the CLI's own redraw: the screen's text as it is."""
        out = ["\x1b[H\x1b[2J"]
        for i, line in enumerate(self.lines()):
            out.append(f"\x1b[{i + 1};1H{line}")
        y, x = self.screen.cursor.y, self.screen.cursor.x
        out.append(f"\x1b[{y + 1};{x + 1}H")
        return "".join(out).encode()
