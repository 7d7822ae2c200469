"""The journal writer's spill (executor/journal/spill.py): what could not be journaled while the database was away,
kept in a file in order, read back in order, adopted by the next start, and gone once drained."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from executor.journal import writer
from executor.journal.spill import SPILL_NAME, Item, Spill
from shared.journal import Appended
from shared.models import NewEvent

pytestmark = pytest.mark.unit


_open: list[Spill] = []


@pytest.fixture(autouse=True)
def _closed() -> Iterator[None]:
    """Every spill a test opened is closed after it (the writer closes its own at a stop)."""
    yield
    while _open:
        _open.pop().close()


def _spill(tmp_path: Path) -> Spill:
    spill = Spill(tmp_path / "data" / SPILL_NAME)
    _open.append(spill)
    return spill


def _types(items: Sequence[Item]) -> list[list[str]]:
    return [[e.event_type for e in events] for events, _ in items]


def test_an_event_comes_back_as_it_was_put_with_the_time_it_was_put(tmp_path: Path) -> None:
    spill = _spill(tmp_path)
    ids = tuple(uuid.uuid4() for _ in range(5))
    put = NewEvent("task.output", {"text": "é\x00", "n": [1, 2]}, tier="derived", project_id=ids[0], session_id=ids[1],
                   task_id=ids[2], parent_id=ids[3], message_id=ids[4])
    before = datetime.now(UTC)
    spill.append([put], None)
    (back,), _ = spill.take(10)[0][0]
    assert back.event_id == put.event_id and back.event_type == "task.output" and back.tier == "derived"
    assert (back.project_id, back.session_id, back.task_id, back.parent_id, back.message_id) == ids
    assert back.payload == {"text": "é\ufffd", "n": [1, 2]}  # stored as the journal would store it
    assert back.created_at is not None and before <= back.created_at <= datetime.now(UTC)
    kept = NewEvent("t", {}, created_at=datetime(2020, 1, 1, tzinfo=UTC), payload_json='{"as":"printed"}')
    spill.append([kept], None)
    (_, (second,)) = [events for events, _ in spill.take(10)[0]]
    assert second.created_at == datetime(2020, 1, 1, tzinfo=UTC) and second.payload_json == '{"as":"printed"}'


def test_items_are_taken_in_order_at_least_one_and_up_to_the_events_asked(tmp_path: Path) -> None:
    spill = _spill(tmp_path)
    for name, n in (("a", 3), ("b", 1), ("c", 2)):
        spill.append([NewEvent(f"{name}{i}") for i in range(n)], None)
    items, _ = spill.take(1)
    assert _types(items) == [["a0", "a1", "a2"]]  # one item, even over the count: never none
    items, _ = spill.take(4)
    assert _types(items) == [["a0", "a1", "a2"], ["b0"]]
    assert spill.active and spill.written == 3 and spill.events == 6


def test_what_was_consumed_is_not_taken_again_and_a_drained_spill_leaves_no_file(tmp_path: Path) -> None:
    spill = _spill(tmp_path)
    for name in ("a", "b", "c"):
        spill.append([NewEvent(name)], None)
    items, offset = spill.take(2)
    spill.consumed(len(items), offset)
    assert spill.backlog_bytes > 0
    items, offset = spill.take(10)
    assert _types(items) == [["c"]]
    spill.consumed(len(items), offset)
    assert not spill.active and not spill.path.exists() and spill.backlog_bytes == 0
    spill.append([NewEvent("d")], None)  # a later outage starts a fresh file
    assert _types(spill.take(10)[0]) == [["d"]]


def test_a_waiting_future_goes_with_its_item(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    try:
        fut: asyncio.Future[Appended] = loop.create_future()
        spill = _spill(tmp_path)
        spill.append([NewEvent("a")], None)
        spill.append([NewEvent("b")], fut)
        items, _ = spill.take(10)
        assert [f for _, f in items] == [None, fut]
        assert spill.abandon_futures() == []  # taken with its item: not abandoned twice
    finally:
        loop.close()


def test_futures_left_when_the_writer_stops_are_given_back_to_be_failed(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    try:
        fut: asyncio.Future[Appended] = loop.create_future()
        spill = _spill(tmp_path)
        spill.append([NewEvent("a")], fut)
        assert spill.abandon_futures() == [((), fut)] and spill.abandon_futures() == []
    finally:
        loop.close()


def test_a_spill_left_by_a_stopped_executor_is_adopted_and_an_empty_one_removed(tmp_path: Path) -> None:
    first = _spill(tmp_path)
    first.append([NewEvent("a")], None)
    first.append([NewEvent("b"), NewEvent("c")], None)
    first.close()
    adopted = _spill(tmp_path)
    assert adopted.recover() == 2 and adopted.active and adopted.size == first.size
    assert _types(adopted.take(10)[0]) == [["a"], ["b", "c"]]
    empty = tmp_path / "empty" / SPILL_NAME
    empty.parent.mkdir()
    empty.write_text("\n\n")
    assert Spill(empty).recover() == 0 and not empty.exists()
    assert Spill(tmp_path / "none" / SPILL_NAME).recover() == 0


def test_items_kept_at_a_stop_go_before_the_unread_rest_for_the_next_start(tmp_path: Path) -> None:
    spill = _spill(tmp_path)
    for name in ("s1", "s2", "s3"):
        spill.append([NewEvent(name)], None)
    items, offset = spill.take(1)
    spill.consumed(len(items), offset)  # s1 journaled; s2 and s3 still in the file
    in_memory: list[Item] = [([NewEvent("m1"), NewEvent("m2")], None)]
    spill.keep_first(in_memory)
    assert not spill.path.with_suffix(".tmp").exists()
    after = _spill(tmp_path)
    assert after.recover() == 3
    assert _types(after.take(10)[0]) == [["m1", "m2"], ["s2"], ["s3"]]


def test_a_line_nested_past_jsons_depth_comes_back_to_be_written_as_printed(tmp_path: Path) -> None:
    # a stdout line orjson takes as storable (1,010 deep: its limit is 1,024) that Python's json cannot parse again:
    # read back from the spill, it stopped the writer for good
    deep = '{"type":"x","a":' + "[" * 1010 + "]" * 1010 + "}"
    spill = _spill(tmp_path)
    spill.append([NewEvent("stream.x", None, payload_json=deep), NewEvent("stream.y", {"n": 1})], None)
    (back, after), _ = spill.take(10)[0][0]
    assert back.payload_json == deep and after.payload == {"n": 1}


def test_a_line_too_deep_for_either_parser_is_still_written_as_printed() -> None:
    from executor.journal import spill

    assert spill._payload("[" * 5000 + "]" * 5000) is None  # neither parser takes it: the write uses the text


async def test_a_journal_writer_that_fails_says_so_at_once() -> None:
    """Nothing awaits the writer's task while it runs (its producers wait on room, the stop reads its end): its error
    is logged when it happens, not found at the stop or never."""
    async def failing() -> None:
        raise OSError("the spill file's disk is full")

    task = asyncio.create_task(failing())
    with capture_logs() as logged:
        task.add_done_callback(writer._said_if_failed)
        await asyncio.wait([task])
    assert [e["event"] for e in logged] == ["journal_writer_failed"]
