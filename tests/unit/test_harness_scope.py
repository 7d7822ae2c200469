"""The harness's scope decisions (executor/harness/scope.py) and the refusal journal's budget per credential."""

from __future__ import annotations

import uuid

from executor.harness.refusals import RefusalBudget, anonymous_key, credential_key
from executor.harness.scope import DispatchLimits, Lineage, over_bounds, project_refusal, project_visible
from executor.run.caller import Caller

A, B = uuid.uuid4(), uuid.uuid4()


def _caller(project: uuid.UUID | None) -> Caller:
    return Caller(task_id=uuid.uuid4(), session_id=uuid.uuid4(), thread_id=None, project_id=project, role="worker")


def test_a_worker_runs_only_in_its_callers_project_and_the_refusal_tells_nothing_about_the_one_named() -> None:
    in_a, free = _caller(A), _caller(None)
    assert project_refusal(in_a, None) is None and project_refusal(in_a, A) is None
    assert project_refusal(free, None) is None
    other, unknown = project_refusal(in_a, B), project_refusal(in_a, uuid.uuid4())
    assert other is not None and other == unknown and str(B) not in other
    assert project_refusal(free, A) == project_refusal(free, uuid.uuid4()) is not None
    assert project_visible(in_a, A) and not project_visible(in_a, B) and not project_visible(free, A)


def test_dispatches_are_bounded_by_depth_and_by_count_per_task() -> None:
    limits = DispatchLimits(max_depth=3, max_per_task=20)
    assert over_bounds(limits, Lineage(depth=0, thread_id=None, dispatched=0)) is None  # a turn
    assert over_bounds(limits, Lineage(depth=2, thread_id=None, dispatched=19)) is None
    deep = over_bounds(limits, Lineage(depth=3, thread_id=None, dispatched=0))
    assert deep is not None and deep[0] == "dispatch depth" and "PETAL_MAX_DISPATCH_DEPTH" in deep[1]
    many = over_bounds(limits, Lineage(depth=1, thread_id=None, dispatched=20))
    assert many is not None and many[0] == "dispatches per task" and "PETAL_MAX_DISPATCH_PER_TASK=20" in many[1]


def test_one_credentials_flood_spends_only_its_own_refusal_budget() -> None:
    budget = RefusalBudget(limit=3, window_s=60)
    flooder, victim = credential_key(uuid.uuid4()), credential_key(uuid.uuid4())
    assert [budget.admit(flooder, now=t) for t in range(6)] == [0, 0, 0, None, None, None]
    assert [budget.admit(anonymous_key("127.0.0.1"), now=t) for t in range(5)] == [0, 0, 0, None, None]
    assert budget.admit(victim, now=7) == 0  # journaled: its own budget is whole
    assert budget.admit(flooder, now=60.5) == 3  # the flooder's first fell out of the window; three were left out
