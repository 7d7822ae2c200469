"""What an exit's record keeps of the CLI's result line: the line is the spawn's word (a process in its sandbox can print
one), so its denials and summary are bounded before they are journaled and classified again at settlement
(executor/run/stream.py)."""

from __future__ import annotations

import pytest

from executor.run import stream

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
