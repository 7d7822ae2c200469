"""The not-clean-return policy's decisions (executor/settle/policy.py), as pure functions."""

from __future__ import annotations

import pytest

from executor.settle import policy


def test_the_policy_table_retries_within_budget_then_escalates() -> None:
    assert policy.decide("success", 1, 10).action == policy.REPORT
    assert [policy.decide("crashed", n, 10).action for n in (1, 2)] == [policy.RETRY_SAME, policy.ESCALATE]
    assert [policy.decide("failed", n, 10).action for n in (1, 2)] == [policy.RETRY_MODIFIED, policy.ESCALATE]
    assert [policy.decide("partial", n, 10).action for n in (1, 2)] == [policy.RETRY_MODIFIED, policy.ESCALATE]
    backoffs = [policy.decide("rate_limited", n, 10) for n in (1, 2, 3, 4)]
    assert [d.action for d in backoffs] == [policy.BACK_OFF] * 3 + [policy.ESCALATE]
    assert [d.delay_s for d in backoffs[:3]] == [10, 20, 40]  # the delay grows
    assert policy.decide("cancelled", 1, 10).action == policy.SKIP
    assert policy.decide("gated", 1, 10).action == policy.ESCALATE
    assert policy.decide("extraction_failed", 1, 10).action == policy.ESCALATE
    assert policy.decide("some_new_status", 1, 10).action == policy.ESCALATE  # unknown: the user decides


@pytest.mark.parametrize("status", ["skipped", "failed", "crashed"])
def test_a_worker_that_never_started_escalates_at_once_instead_of_being_retried(status: str) -> None:
    decision = policy.decide(status, 1, 10, started=False)
    assert decision.action == policy.ESCALATE and "never started" in decision.why


def test_a_worker_cancelled_before_it_started_is_still_skipped() -> None:
    assert policy.decide("cancelled", 1, 10, started=False).action == policy.SKIP


def test_a_retry_decision_says_which_retry_of_the_budget_it_is() -> None:
    first = policy.decide("crashed", 1, 10)
    spent = policy.decide("crashed", 2, 10)
    assert (first.budget, first.why) == (1, "crashed: retry 1 of 1")
    assert spent.why == "crashed: the retry budget (1) is spent" and spent.delay_s == 0.0


def test_a_turn_follows_its_own_table_rerun_once_back_off_else_escalate() -> None:
    def turn(status: str, attempt: int = 1) -> policy.Decision:
        return policy.decide(status, attempt, 10, role="orchestrator")

    assert [turn("crashed", n).action for n in (1, 2)] == [policy.RETRY_SAME, policy.ESCALATE]
    assert [turn("rate_limited", n).action for n in (1, 2, 3, 4)] == [policy.BACK_OFF] * 3 + [policy.ESCALATE]
    assert turn("rate_limited", 2).delay_s == 20
    assert turn("failed").action == policy.ESCALATE  # a worker's failure is retried modified; a turn's is not
    assert policy.decide("failed", 1, 10).action == policy.RETRY_MODIFIED
    assert turn("partial").action == policy.ESCALATE and turn("gated").action == policy.ESCALATE
    assert turn("cancelled").action == policy.SKIP  # the user stopped it: left to their Retry
    assert turn("crashed", 1).action == policy.RETRY_SAME
    assert policy.decide("crashed", 1, 10, started=False, role="orchestrator").action == policy.ESCALATE
