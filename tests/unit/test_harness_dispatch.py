"""dispatch_worker's checks (executor/harness/workers.py) on the fake query layer: the caller's project and
bounds before anything is written, the refusal's record within its budget, a routine's worker limit, the files
a worker is handed, and what the caller may read."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from executor.harness import scope as scopes
from executor.harness.refusals import RefusalBudget
from executor.harness.scope import DispatchLimits, Lineage
from executor.harness.services import Harness
from executor.harness.store import HarnessStore
from executor.harness.workers import _Workers, chosen_files
from executor.run.caller import Caller
from shared.models import NewEvent
from tests.fake_queries import FakeWork

pytestmark = pytest.mark.unit

PROJECT, THREAD = uuid.uuid4(), uuid.uuid4()


class _Writer:
    def __init__(self) -> None:
        self.events: list[NewEvent] = []

    async def put(self, event: NewEvent) -> None:
        self.events.append(event)

    async def write(self, events: Sequence[NewEvent]) -> None:
        self.events.extend(events)


def caller(project: uuid.UUID | None = PROJECT, thread: uuid.UUID | None = None) -> Caller:
    return Caller(task_id=uuid.uuid4(), session_id=uuid.uuid4(), thread_id=thread, project_id=project, role="worker")


def workers(answers: Mapping[str, Any], limits: DispatchLimits = DispatchLimits(),
            budget: RefusalBudget | None = None) -> tuple[_Workers, FakeWork, _Writer]:
    unit, writer = FakeWork(answers), _Writer()
    harness = SimpleNamespace(db=SimpleNamespace(pool=None), store=HarnessStore(unit), q=unit, writer=writer,
                              dispatch_limits=limits, identities=SimpleNamespace(refusals=budget or RefusalBudget()))
    return _Workers(cast(Harness, harness)), unit, writer


def lineage(depth: int, dispatched: int = 0, thread: uuid.UUID | None = None) -> dict[str, Any]:
    return {"depth": depth, "thread_id": thread, "dispatched": dispatched}


# ---- the caller's bounds -------------------------------------------------------------------------------------


async def test_a_caller_within_its_bounds_gets_its_lineage_and_nothing_is_journaled() -> None:
    made, unit, writer = workers({"get_caller_lineage": lineage(1, 3, THREAD)})
    asker = caller()
    assert await made._within_bounds(asker, "b", PROJECT) == Lineage(depth=1, thread_id=THREAD, dispatched=3)
    assert unit.params("get_caller_lineage") == {"task_id": asker.task_id}
    assert writer.events == []


async def test_naming_another_project_is_refused_before_the_lineage_is_read() -> None:
    made, unit, writer = workers({})  # get_caller_lineage unanswered: it must not run
    asker, other = caller(), uuid.uuid4()
    with pytest.raises(ToolError, match="dispatch refused: a worker runs in its caller's project"):
        await made._within_bounds(asker, "count the files", other)
    (record,) = writer.events
    assert (record.event_type, record.task_id, record.project_id) == ("task.dispatch_refused", asker.task_id, PROJECT)
    assert record.payload == {"brief": "count the files", "reason": "another project", "project_id": str(other)}
    assert unit.calls == []


async def test_a_worker_at_the_deepest_depth_may_not_dispatch_and_the_record_says_how_deep() -> None:
    made, _, writer = workers({"get_caller_lineage": lineage(2, 1)}, DispatchLimits(max_depth=2))
    with pytest.raises(ToolError, match="at depth 2"):
        await made._within_bounds(caller(), "b", None)
    assert writer.events[0].payload == {"brief": "b", "reason": "dispatch depth", "depth": 2, "dispatched": 1}


async def test_a_task_that_asked_for_its_most_workers_may_ask_for_no_more() -> None:
    made, _, writer = workers({"get_caller_lineage": lineage(0, 5)}, DispatchLimits(max_per_task=5))
    with pytest.raises(ToolError, match="PETAL_MAX_DISPATCH_PER_TASK=5"):
        await made._within_bounds(caller(), "b", None)
    assert writer.events[0].payload["reason"] == "dispatches per task"


async def test_refusals_past_the_callers_budget_are_refused_but_not_journaled_and_counted_later() -> None:
    made, _, writer = workers({}, budget=RefusalBudget(limit=1, window_s=3600))
    asker = caller()
    for _ in range(3):
        with pytest.raises(ToolError):
            await made._within_bounds(asker, "b", uuid.uuid4())
    assert len(writer.events) == 1  # one per window; the other two only refused
    other = caller()  # another caller's budget is its own
    with pytest.raises(ToolError):
        await made._within_bounds(other, "b", uuid.uuid4())
    assert len(writer.events) == 2 and writer.events[1].task_id == other.task_id


async def test_a_caller_whose_task_row_is_not_found_counts_as_a_turn() -> None:
    store = HarnessStore(FakeWork({"get_caller_lineage": None}))
    assert await store.lineage(uuid.uuid4()) == Lineage(depth=0, thread_id=None, dispatched=0)


# ---- a routine's worker limit --------------------------------------------------------------------------------


async def test_a_routine_run_at_its_worker_limit_is_refused_with_the_routines_name() -> None:
    unit = FakeWork({"check_routine_workers_full": {"name": "nightly", "max_workers": 2}})
    with pytest.raises(ToolError, match="routine nightly runs at most 2 worker"):
        await _Workers._check_routine_workers(HarnessStore(unit), THREAD)
    assert unit.params("check_routine_workers_full") == {"thread_id": THREAD}


async def test_a_routine_run_below_its_worker_limit_may_dispatch() -> None:
    await _Workers._check_routine_workers(HarnessStore(FakeWork({"check_routine_workers_full": None})), THREAD)


# ---- the files a worker is handed ----------------------------------------------------------------------------


A, B = uuid.uuid4(), uuid.uuid4()
FILES = [{"id": A, "name": "a.csv", "media_type": "text/csv", "size_bytes": 3},
         {"id": B, "name": "b.png", "media_type": "image/png", "size_bytes": 9}]


def test_by_default_a_worker_is_handed_every_file_of_the_turn() -> None:
    assert chosen_files(FILES, None) == FILES


def test_files_are_chosen_by_name_or_id_each_once_in_the_order_asked() -> None:
    assert chosen_files(FILES, ["b.png", str(A), "a.csv"]) == [FILES[1], FILES[0]]
    assert chosen_files(FILES, []) == []


def test_an_unknown_file_is_refused_naming_what_was_sent() -> None:
    with pytest.raises(ToolError, match=r"no file c.txt was sent with this turn \(sent: a.csv, b.png\)"):
        chosen_files(FILES, ["a.csv", "c.txt"])
    with pytest.raises(ToolError, match=r"\(sent: none\)"):
        chosen_files([], ["a.csv"])


# ---- what a caller may read ----------------------------------------------------------------------------------


async def test_a_callers_own_ids_and_project_are_readable_without_asking_the_store() -> None:
    store = HarnessStore(FakeWork({}))  # any query would fail: none may run
    asker = caller(thread=THREAD)
    for own in (asker.task_id, asker.session_id, THREAD, PROJECT):
        assert await scopes.readable(store, asker, own)


async def test_any_other_id_is_the_stores_answer_for_the_callers_tree_and_project() -> None:
    asker, other = caller(), uuid.uuid4()
    unit = FakeWork({"check_caller_may_read": None})
    assert not await scopes.readable(HarnessStore(unit), asker, other)
    assert unit.params("check_caller_may_read") == {"task_id": asker.task_id, "project": PROJECT, "scope": other}
    assert await scopes.readable(HarnessStore(FakeWork({"check_caller_may_read": {"readable": True}})), asker, other)
