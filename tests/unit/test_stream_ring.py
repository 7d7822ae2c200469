"""The SSE ring's order bookkeeping: what lets a client take a whole batch without a look at each frame."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from ingress import stream
from ingress.stream import Broadcaster, Frame
from shared.listener import Notification


def _ring() -> Broadcaster:
    pool: Any = None  # the ring's bookkeeping reads nothing
    return Broadcaster(pool, buffer=100)


async def test_frames_that_follow_on_keep_the_break_count_and_a_gap_raises_it() -> None:
    b = _ring()
    b._publish([Frame(1, b"a"), Frame(2, b"b"), Frame(None, b"signal"), Frame(3, b"c")])
    placed = list(b.frames)
    assert [(f.after, f.upto, f.breaks, f.follows_on) for f in placed] == [
        (0, 1, 0, True), (1, 2, 0, True), (2, 2, 0, True), (2, 3, 0, True)]
    b._publish([Frame(5, b"e")])  # 4 is missing: a client must fetch it, not take the batch whole
    gap = b.frames[-1]
    assert (gap.after, gap.upto, gap.breaks, gap.follows_on) == (3, 5, 1, False)
    b._publish([Frame(4, b"late")])  # behind the latest: also not taken whole
    late = b.frames[-1]
    assert (late.after, late.upto, late.breaks, late.follows_on) == (5, 5, 2, False)


async def test_clients_at_the_same_cursor_share_one_joined_write() -> None:
    b = _ring()
    first, second = b.subscribe(), b.subscribe()
    b._publish([Frame(1, b"id: 1\n\n"), Frame(2, b"id: 2\n\n")])
    one, two = await first.next(), await second.next()
    assert one is not None and two is not None
    joined = first.joined(one)
    assert joined == b"id: 1\n\nid: 2\n\n" and second.joined(two) is joined
    b._publish([Frame(3, b"id: 3\n\n")])
    three = await first.next()
    assert three is not None and first.joined(three) == b"id: 3\n\n"


async def test_a_client_takes_its_frames_in_order_at_most_a_batch_at_a_time() -> None:
    b = _ring()
    client = b.subscribe()
    b._publish([Frame(i, str(i).encode()) for i in range(1, 11)])
    assert [f.seq for f in await client.next(most=4) or []] == [1, 2, 3, 4]
    assert [f.seq for f in await client.next(most=4) or []] == [5, 6, 7, 8]
    b._publish([Frame(11, b"11")])
    assert [f.seq for f in await client.next(most=4) or []] == [9, 10, 11]


def _rows(*seqs: int) -> str:
    return json.dumps([{"event_id": str(uuid.uuid4()), "seq": s, "project_id": None, "session_id": None,
                        "task_id": None, "parent_id": None, "message_id": None, "event_type": "task.stderr",
                        "tier": "raw", "created_at": "2026-01-01T00:00:00+00:00", "payload": {"n": s}}
                       for s in seqs])


def _note(payload: str) -> Notification:
    return Notification("journal", payload)


async def test_a_notification_carrying_rows_that_follow_on_is_published_without_a_read() -> None:
    b = _ring()  # no pool: a read would fail the test
    await b._take([_note(f"2 {_rows(1, 2)}")])
    assert [f.seq for f in b.frames] == [1, 2] and b.last_seq == 2
    await b._take([_note("2"), _note(f"2 {_rows(1, 2)}")])  # published already: nothing to read, not twice
    assert len(b.frames) == 2


async def test_a_backlog_of_notifications_goes_out_as_one_batch_in_order() -> None:
    b = _ring()
    client = b.subscribe()
    await b._take([_note(f"1 {_rows(1)}"), Notification("chat_queue", "q-1"), _note(f"3 {_rows(2, 3)}")])
    batch = await client.next()
    assert batch is not None and [f.seq for f in batch] == [1, None, 2, 3]
    assert b.published == 4 and b.frames[-1].breaks == 0  # one publish, no gap


async def test_a_notification_the_ring_cannot_take_as_it_is_asks_for_a_read() -> None:
    b = _ring()
    assert b._carried("3") is None  # rows not carried (a large batch)
    assert b._carried(f"3 {_rows(2, 3)}") is None  # seq 1 is missing: a lost notification, the read fills it
    assert b._carried("3 {not json") is None
    assert b._carried("resync") is None
    assert not b.frames and b.last_seq == 0


async def test_the_ring_holds_at_most_its_byte_budget_besides_the_newest_frame_and_a_client_behind_resumes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "RING_BYTES", 1000)
    b = _ring()
    client = b.subscribe()
    b._publish([Frame(i, b"x" * 300) for i in range(1, 5)])  # 1,200 bytes: the oldest goes
    assert [f.seq for f in b.frames] == [2, 3, 4] and b.bytes == 900
    b._publish([Frame(5, b"y" * 5000)])  # one frame over the whole budget: it alone stays, to be sent
    assert [f.seq for f in b.frames] == [5] and b.bytes == 5000
    with pytest.raises(stream.Overflow):  # fell off the end: its stream ends, the page resumes by Last-Event-ID
        await client.next()
    small = _ring()
    small._publish([Frame(i, b"z") for i in range(1, 200)])  # the count bound still holds (buffer=100)
    assert len(small.frames) == 100 and small.bytes == 100
