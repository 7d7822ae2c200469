"""What the executor keeps of a spawn's stdout and stderr beyond their journal rows: the lines are the spawn's word (a
process in its sandbox writes the CLI's pipes), so an exit's record keeps a bounded part of the result line, a run
remembers only tool-call ids as the CLI makes them, a line too deep to parse is text, and the journal writer's hold
weighs every line as long as it is (executor/run/stream.py, executor/run/lineage.py, executor/journal/writer.py)."""

from __future__ import annotations

import uuid

import pytest

from executor.run import stream
from shared.models import NewEvent

pytestmark = pytest.mark.unit


def _facts(result: dict[str, object]) -> stream.TurnFacts:
    facts = stream.TurnFacts()
    facts.feed(stream.Line("stream.result", result, {"type": "result", **result}))
    return facts


def test_a_result_lines_denials_and_summary_are_kept_bounded() -> None:
    huge = "x" * 1_000_000
    facts = _facts({"subtype": huge, "is_error": False, "num_turns": 3,
                    "errors": [huge, {"nested": huge}, 7] + ["e"] * 100,
                    "permission_denials": [{"tool_name": "Bash", "tool_use_id": "t1",
                                            "tool_input": {"command": "rm -rf /tmp/x"}},
                                           {"tool_name": "Bash", "tool_input": {"command": huge}},
                                           "not a dict"] + [{"tool_name": "Read"}] * 10_000})
    denials = facts.permission_denials
    assert len(denials) == stream.MAX_DENIALS - 1  # the first MAX_DENIALS entries, less the one not a dict
    assert denials[0] == {"tool_name": "Bash", "tool_use_id": "t1", "tool_input": {"command": "rm -rf /tmp/x"}}
    assert len(denials[1]["tool_input"]["cut"]) == stream.MAX_VALUE_CHARS
    summary = facts.result_summary()
    assert summary is not None and len(summary["subtype"]) == stream.MAX_VALUE_CHARS and summary["num_turns"] == 3
    errors = summary["errors"]
    assert len(errors) == 20 and len(errors[0]) == stream.MAX_VALUE_CHARS and errors[2] == 7
    assert errors[1].startswith('{"nested": "xxx') and len(errors[1]) == stream.MAX_VALUE_CHARS


def test_denials_that_are_not_a_list_are_none() -> None:
    assert _facts({"permission_denials": {"tool_name": "Bash"}}).permission_denials == []


def test_a_line_nested_past_both_parsers_depth_is_kept_as_unparsed_text() -> None:
    # orjson refuses it (over 1,024 deep) and Python's json raised RecursionError, which ended the run's stdout reader
    line = stream.classify(b"[" * 1100 + b"]" * 1100 + b"\n")
    assert line.event_type == "stream.unparsed" and line.payload["line"].startswith("[[[")


def test_a_runs_tool_calls_are_remembered_only_as_the_cli_makes_them_and_only_so_many() -> None:
    from executor.run import lineage

    calls: dict[str, uuid.UUID] = {}
    line = uuid.uuid4()
    blocks = [{"type": "tool_use", "id": "toolu_01"}, {"type": "tool_use", "id": "x" * 8_000_000}]
    lineage.tool_parent(calls, "stream.assistant", {"message": {"content": blocks}}, line)
    assert calls == {"toolu_01": line}  # an 8 MB id is not kept for the rest of the run
    many = [{"type": "tool_use", "id": f"toolu_{i}"} for i in range(lineage.MAX_CALLS + 50)]
    lineage.tool_parent(calls, "stream.assistant", {"message": {"content": many}}, line)
    assert len(calls) == lineage.MAX_CALLS
    result = {"message": {"content": [{"type": "tool_result", "tool_use_id": "toolu_01"}]}}
    assert lineage.tool_parent(calls, "stream.user", result, uuid.uuid4()) == line


def test_a_spawns_stderr_and_unparsed_lines_weigh_in_the_journal_writers_hold_as_long_as_they_are() -> None:
    from executor.journal import writer

    big = "e" * 6_000_000
    # the hold's bound (32 MiB) counted these as 256 bytes each: sixty 6 MiB stderr lines held 354 MiB in memory
    assert writer._size([NewEvent("task.stderr", {"line": big})]) > 6_000_000
    assert writer._size([NewEvent("stream.unparsed", {"line": big, "invalid_utf8": True})]) > 6_000_000
    assert writer._size([NewEvent("task.spawned", {"pid": 1})]) < 1_000
    assert writer._size([NewEvent("stream.result", {"x": 1}, payload_json='{"x":1}')]) == 8
