"""How the journal's appends encode a batch (shared/journal.py), before any database sees it: payloads made storable in
jsonb, the COPY text of a large batch and the parameters of a small one."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest

from shared import journal
from shared.models import NewEvent

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _fields(row: str) -> list[str]:
    return row.split("\t")


@pytest.mark.parametrize(("text", "storable"), [
    ('{"a":"plain"}', True),
    ('{"a":"\\u00e9"}', True),  # an escape jsonb holds
    ('{"a":"\\u0000"}', False),  # NUL: jsonb refuses it
    ('{"a":"\\ud83d"}', False),  # a lone surrogate, in either case
    ('{"a":"\\uD83D"}', False),
])
def test_json_text_is_storable_unless_it_holds_a_nul_or_a_surrogate_escape(text: str, storable: bool) -> None:
    assert journal.storable_json(text) is storable


def test_a_payload_with_a_nul_is_stored_with_a_replacement_character_not_lost() -> None:
    text = journal.encode_payload({"out": "bin\x00ary", "nested": ["a\x00"]})
    assert "\\u0000" not in text and journal.storable_json(text)
    assert json.loads(text) == {"out": "bin\ufffdary", "nested": ["a\ufffd"]}


def test_a_lone_surrogate_and_non_string_keys_take_the_forgiving_path() -> None:
    text = journal.encode_payload({"half": "emoji \ud83d cut", 1: "int key"})
    decoded = json.loads(text)
    assert decoded["1"] == "int key"  # a key that is no string is kept, as its text
    assert "\ud83d" not in decoded["half"] and decoded["half"].startswith("emoji ")
    assert journal.storable_json(text)


def test_an_ordinary_payload_is_compact_json_of_the_same_value() -> None:
    payload = {"type": "assistant", "n": 3, "ok": True, "items": [1.5, None, "é"]}
    text = journal.encode_payload(payload)
    assert json.loads(text) == payload and " " not in text.replace("é", "")


def test_the_copy_rows_number_the_batch_from_its_first_seq_and_mark_missing_ids_as_null() -> None:
    task, session = uuid.uuid4(), uuid.uuid4()
    events = [NewEvent("a.b", {"x": 1}, task_id=task, session_id=session), NewEvent("c.d", {}, tier="derived")]
    rows = journal._copy_rows(events, 41, NOW).decode().split("\n")  # noqa: SLF001 - the wire format itself
    assert rows[-1] == "" and len(rows) == 3  # one line per event, ended by a newline
    first, second = _fields(rows[0]), _fields(rows[1])
    assert first[0] == f"{events[0].event_id.int:032x}" and (first[1], second[1]) == ("41", "42")
    assert first[2] == "\\N" and first[3] == f"{session.int:032x}" and first[4] == f"{task.int:032x}"
    assert second[2:7] == ["\\N"] * 5
    assert (first[7], first[8], second[8]) == ("a.b", "raw", "derived")
    assert first[9] == NOW.isoformat()  # no created_at of its own: the batch's time


def test_copy_text_escapes_what_would_split_a_row_or_a_column() -> None:
    event = NewEvent("t", {"line": "a\tb\nc\\d\re"})
    row = journal._copy_rows([event], 1, NOW).decode()  # noqa: SLF001
    assert row.count("\n") == 1 and row.count("\t") == 10  # still one row of eleven columns
    payload = _fields(row.rstrip("\n"))[10]
    unescaped = payload.replace("\\\\", "\x01").replace("\\t", "\t").replace("\\n", "\n").replace("\\r", "\r")
    assert json.loads(unescaped.replace("\x01", "\\")) == event.payload


def test_a_payload_given_as_text_is_copied_as_it_is_and_an_events_own_time_is_kept() -> None:
    at = datetime(2025, 5, 5, tzinfo=UTC)
    event = NewEvent("t", None, payload_json='{"as":"printed"}', created_at=at)
    fields = _fields(journal._copy_rows([event], 7, NOW).decode().rstrip("\n"))  # noqa: SLF001
    assert fields[9] == at.isoformat() and fields[10] == '{"as":"printed"}'


def test_a_small_batch_goes_as_parallel_arrays_in_the_batch_order() -> None:
    events = [NewEvent("a", {"i": 0}), NewEvent("b", None, payload_json='{"i":1}', tier="derived")]
    params = journal._small_batch_params(events, NOW)  # noqa: SLF001
    assert params["event_ids"] == [e.event_id for e in events]
    assert params["event_types"] == ["a", "b"] and params["tiers"] == ["raw", "derived"]
    assert params["payloads"] == ['{"i":0}', '{"i":1}'] and params["created_ats"] == [NOW, NOW]
    assert {len(v) for v in params.values()} == {2}


async def test_an_empty_batch_is_refused_before_any_connection_is_asked_for() -> None:
    class NoPool:
        def connection(self) -> None:
            raise AssertionError("no connection should be taken")

    with pytest.raises(ValueError, match="at least one event"):
        await journal.append(NoPool(), [])  # type: ignore[arg-type]  # never used: the refusal comes first


def test_an_event_id_is_the_callers_so_a_retried_batch_is_recognisable() -> None:
    first, second = NewEvent("t"), NewEvent("t")
    assert first.event_id != second.event_id and first.event_id.version == 4
    given = uuid.uuid4()
    assert NewEvent("t", event_id=given).event_id == given
    assert NewEvent("t").payload == {} and NewEvent("t").tier == "raw"
