"""The one door of task creation (executor/settle/dispatch.py), on the fake query layer: what request_task
inserts, what it emits into the unit of work, and what it refuses before anything is run."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from executor.settle import dispatch
from executor.settle.dispatch import TaskRequest
from tests.fake_queries import FakeWork, UnknownQuery

PROJECT, PARENT, THREAD = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def inserted(params: Any) -> dict[str, Any]:
    return {"id": params["id"]}


async def test_a_worker_request_inserts_one_pending_row_and_emits_its_dispatch_record(tmp_path: Path) -> None:
    unit = FakeWork({"insert_task": inserted})
    asked = TaskRequest("worker", "count the files", project_id=PROJECT, parent_task_id=PARENT, plan_ref="T-1",
                        workdir=tmp_path, allowed_tools=("Read",), labels=("gpu",), requested_by="a turn",
                        tool_use_id="toolu_1")
    assert await dispatch.request_task(unit, asked) == asked.id
    assert unit.names() == ["insert_task"]
    assert unit.params("insert_task") == {
        "id": asked.id, "project_id": PROJECT, "session_id": None, "parent_task_id": PARENT, "role": "worker",
        "brief": "count the files", "plan_ref": "T-1", "workdir": str(tmp_path), "allowed_tools": ["Read"],
        "json_schema": None, "executor": None, "labels": ["gpu"], "attempt": 1, "retry_of": None,
        "delay_s": None, "attachment_ids": [], "chat": False, "continues_task_id": None, "check_round": 0}  # a first request waits for nothing: no not_before
    (record,) = unit.events
    assert (record.event_type, record.task_id, record.project_id, record.session_id) == (
        "task.dispatch_requested", asked.id, PROJECT, None)
    assert record.payload == {"role": "worker", "brief": "count the files", "plan_ref": "T-1",
                              "workdir": str(tmp_path), "requested_by": "a turn", "parent_task_id": str(PARENT),
                              "tool_use_id": "toolu_1"}


async def test_a_worker_of_a_project_runs_in_the_projects_workdir(tmp_path: Path) -> None:
    unit = FakeWork({"get_project_workdir": {"workdir": str(tmp_path)}, "insert_task": inserted})
    await dispatch.request_task(unit, TaskRequest("worker", "b", project_id=PROJECT, project_workdir=True))
    assert unit.names() == ["get_project_workdir", "insert_task"]
    assert unit.params("insert_task")["workdir"] == unit.events[0].payload["workdir"] == str(tmp_path)


async def test_a_turn_of_a_project_thread_does_not_take_the_projects_workdir() -> None:
    unit = FakeWork({"insert_task": inserted})  # get_project_workdir is not answered: it must not be run
    turn = TaskRequest(dispatch.TURN_ROLE, "hello", project_id=PROJECT, session_id=THREAD, record={"messages": 1})
    await dispatch.request_task(unit, turn)
    assert unit.params("insert_task")["workdir"] is None
    (record,) = unit.events
    assert record.session_id == THREAD and record.payload["messages"] == 1


@pytest.mark.parametrize(("asked", "answers", "why"), [
    (TaskRequest("worker", "  \n"), {}, "non-empty brief"),
    (TaskRequest("worker", "b", project_id=PROJECT, project_workdir=True), {"get_project_workdir": None},
     f"no project {PROJECT}"),
    (TaskRequest("worker", "b", workdir=Path("/nonexistent/petal")), {}, "does not exist"),
])
async def test_a_request_that_cannot_run_is_refused_before_anything_is_written(
        asked: TaskRequest, answers: dict[str, Any], why: str) -> None:
    unit = FakeWork({**answers, "insert_task": inserted})
    with pytest.raises(dispatch.DispatchRefused, match=why):
        await dispatch.request_task(unit, asked)
    assert "insert_task" not in unit.names() and unit.events == []


ATTACHMENT = uuid.uuid4()
ROW = {"role": "worker", "brief": "first brief", "project_id": PROJECT, "session_id": uuid.uuid4(),
       "parent_task_id": PARENT, "plan_ref": "T-2", "workdir": "/gone/since", "allowed_tools": ["Bash"],
       "json_schema": None, "placement_executor": "alpha", "required_labels": ["gpu"], "attempt": 2,
       "attachment_ids": [ATTACHMENT], "continues_task_id": None, "check_round": 0}


async def test_a_retry_asks_what_the_task_was_asked_one_attempt_further_in_a_conversation_of_its_own() -> None:
    first = uuid.uuid4()
    unit = FakeWork({"get_task_request": ROW, "insert_task": inserted})
    again = await dispatch.retry_request(unit, first, requested_by="policy", brief="with a hint", delay_s=4.0)
    await dispatch.request_task(unit, again)  # its vanished workdir is not checked again: the run says so
    params = unit.params("insert_task")
    assert {k: params[k] for k in ("brief", "session_id", "workdir", "allowed_tools", "executor", "labels",
                                   "attempt", "retry_of", "delay_s", "parent_task_id", "attachment_ids")} == {
        "brief": "with a hint", "session_id": None, "workdir": "/gone/since", "allowed_tools": ["Bash"],
        "executor": "alpha", "labels": ["gpu"], "attempt": 3, "retry_of": first, "delay_s": 4.0,
        "parent_task_id": PARENT, "attachment_ids": [ATTACHMENT]}  # a run again carries the same files
    (record,) = unit.events
    assert {k: record.payload[k] for k in ("retry_of", "attempt", "delay_s", "requested_by")} == {
        "retry_of": str(first), "attempt": 3, "delay_s": 4.0, "requested_by": "policy"}


async def test_a_turn_runs_again_in_its_thread_at_most_once() -> None:
    turn = uuid.uuid4()
    row = {**ROW, "role": dispatch.TURN_ROLE, "session_id": THREAD, "workdir": None}
    unit = FakeWork({"get_task_request": row, "insert_task": None})  # another run already repeats it
    again = await dispatch.retry_request(unit, turn, requested_by="settler", record={"rerun_of": str(turn)})
    assert again.session_id == THREAD
    with pytest.raises(dispatch.AlreadyRepeated):
        await dispatch.request_task(unit, again)
    assert unit.events == []


async def test_the_fake_query_layer_fails_loudly_on_a_query_it_was_not_given() -> None:
    with pytest.raises(UnknownQuery, match="'get_project_workdir'"):
        await dispatch.request_task(FakeWork({"insert_task": inserted}),
                                    TaskRequest("worker", "b", project_id=PROJECT, project_workdir=True))
    with pytest.raises(UnknownQuery, match="insert_taks"):
        FakeWork({"insert_taks": inserted})
    with pytest.raises(UnknownQuery, match="insert_task.* was run without its parameters"):
        await FakeWork({"insert_task": inserted}).one("insert_task", {})
