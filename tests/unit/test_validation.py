"""Extraction's validation: its verdict and the stored handoff (executor/settle/extraction.py), as pure functions."""

from __future__ import annotations

from executor.settle import extraction

SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
          "properties": {"goal": {"type": "string"}, "ruled_out": {"type": "array"}}, "required": ["goal"]}


def test_a_valid_object_passes_the_gate() -> None:
    assert extraction.verdict(SCHEMA, {"goal": "g", "ruled_out": []}, "success: completed", []) == []


def test_no_structured_output_fails_with_how_the_run_ended_and_what_the_cli_said() -> None:
    errors = extraction.verdict(SCHEMA, None, "failed: max_turns", ["Output does not match the schema"])
    assert errors[0].endswith("(its run ended failed: max_turns)")
    assert errors[1] == "the CLI said: Output does not match the schema"


def test_a_non_object_or_a_schema_breach_fails_naming_the_field() -> None:
    assert extraction.verdict(SCHEMA, ["x"], "success: completed", []) == [
        "(root): the output is list, not a JSON object"]
    assert extraction.verdict(SCHEMA, {"goal": "g", "ruled_out": "no"}, "success: completed", []) == [
        "ruled_out: 'no' is not of type 'array'"]


def test_the_handoffs_status_is_the_exit_derived_one_and_the_models_claim_is_kept_aside() -> None:
    handoff = extraction.handoff_of({"goal": "g", "status": "success"}, "failed", [])
    assert handoff["status"] == "failed" and handoff["claimed_status"] == "success"
    assert "claimed_status" not in extraction.handoff_of({"goal": "g", "status": "failed"}, "failed", [])


def test_a_gated_handoff_carries_gate_decisions_from_the_exit_record() -> None:
    denial = {"tool_name": "Bash", "tool_input": {"command": "sudo reboot"}}
    handoff = extraction.handoff_of({"goal": "g"}, "gated", [denial, "not a dict"])
    assert [g["gate"] for g in handoff["gate_decisions"]] == ["privilege escalation"]
