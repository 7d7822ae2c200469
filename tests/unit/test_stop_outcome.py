"""Why the harness stopped a run decides its status (executor/run/outcome.py `end_outcome`, pure)."""

from __future__ import annotations

import json
from typing import Any

from executor.run import stream
from executor.run.outcome import end_outcome

OK = {"type": "result", "subtype": "success", "is_error": False, "result": "done", "terminal_reason": "completed"}


def _facts(*objs: dict[str, Any]) -> stream.TurnFacts:
    facts = stream.TurnFacts()
    for obj in objs:
        facts.feed(stream.classify(json.dumps(obj).encode()))
    return facts


def test_only_the_users_stop_is_a_cancellation() -> None:
    assert end_outcome(143, _facts(), "stop_requested") == stream.Outcome("cancelled", "stop_requested")
    assert end_outcome(143, _facts(), "executor_shutdown") == stream.Outcome("crashed", "executor_shutdown")
    assert end_outcome(-9, _facts(), "executor_shutdown") == stream.Outcome("crashed", "executor_shutdown")
    assert end_outcome(143, _facts(), "max_runtime") == stream.Outcome("failed", "max_runtime")


def test_a_run_that_finished_cleanly_before_the_harness_stop_took_effect_keeps_its_success() -> None:
    assert end_outcome(0, _facts(OK), "executor_shutdown").status == "success"
    assert end_outcome(0, _facts(OK), "stop_requested").status == "cancelled"  # as before: the user's word


def test_without_a_stop_the_exit_decides() -> None:
    assert end_outcome(0, _facts(OK), None) == stream.Outcome("success", "completed")
    assert end_outcome(-9, _facts(), None) == stream.Outcome("crashed", "signal SIGKILL")
