"""A spawn's output framed into lines (executor/run/process.py): lines split across reads come whole, several in one
read come together, the last one without its newline still counts, and a line with no end is handed on in bounded
pieces (a process in the sandbox can write the CLI's output: one endless line must not hold the executor's memory)."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from executor.run import process


class _Reads:
    """A stream whose reads return these chunks, in order, then end."""

    def __init__(self, chunks: list[bytes]):
        self.chunks = list(chunks)

    async def read(self, n: int) -> bytes:
        assert n == process.READ_CHUNK
        return self.chunks.pop(0) if self.chunks else b""


async def _framed(chunks: list[bytes]) -> list[list[bytes]]:
    return [lines async for lines in process.iter_line_chunks(cast(asyncio.StreamReader, _Reads(chunks)))]


async def test_lines_split_across_reads_come_whole_and_a_reads_lines_together() -> None:
    framed = await _framed([b'{"a":', b'1}\n{"b"', b':2}\n\n{"c":3}\n{"d"', b":4}"])
    assert framed == [[b'{"a":1}'], [b'{"b":2}', b"", b'{"c":3}'], [b'{"d":4}']]


async def test_a_line_with_no_end_is_handed_on_in_pieces_of_at_most_the_longest_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "MAX_LINE", 1000)
    endless = [bytes([65 + i % 26]) * 300 for i in range(10)]  # 3,000 bytes, no newline
    framed = await _framed([*endless, b"tail\nnext\n"])
    pieces = [line for lines in framed for line in lines]
    assert b"".join(pieces[:-1]) == b"".join(endless) + b"tail" and pieces[-1] == b"next"
    assert all(len(p) <= 1000 + 300 for p in pieces), [len(p) for p in pieces]
    assert len(pieces) > 3  # cut: never held whole


def test_the_longest_line_held_is_well_above_a_normal_long_line() -> None:
    assert process.MAX_LINE >= 32 << 20  # a 5 MB stream-json line (a large tool result) is normal
