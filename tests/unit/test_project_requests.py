"""The project queue's refusals (executor/projects/service.py) on the fake query layer: what is refused before
git or the filesystem is touched, and how a refusal is finished and journaled."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from executor.journal.writer import JournalWriter
from executor.projects import service
from executor.projects.service import Projects, ProjectsConfig, Refused
from executor.projects.store import ProjectStore
from shared.models import NewEvent
from tests.fake_queries import FakeWork

pytestmark = pytest.mark.unit

REQUEST, TASK, PROJECT = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


class _Writer:
    def __init__(self) -> None:
        self.events: list[NewEvent] = []

    async def write(self, events: Sequence[NewEvent]) -> None:
        self.events.extend(events)


def projects(answers: Mapping[str, Any], roots: tuple[Path, ...] = ()) -> tuple[Projects, FakeWork, _Writer]:
    writer = _Writer()
    made = Projects(None, cast(JournalWriter, writer), ProjectsConfig(roots))  # type: ignore[arg-type]  # no pool
    unit = FakeWork({"finish_project_request": 1, **answers})
    made.store = ProjectStore(unit)
    return made, unit, writer


def request(action: str, **args: Any) -> dict[str, Any]:
    return {"id": REQUEST, "action": action, "task_id": None if action == "create" else TASK, "args": args,
            "created_at": datetime.now(UTC)}


def task(**kw: Any) -> dict[str, Any]:
    return {"id": TASK, "project_id": PROJECT, "session_id": None, "status": "success", "worktree": None,
            "branch": f"petal/{TASK}", "base_branch": "main", "base_commit": "abc", "review": None,
            "changes_recorded_at": datetime.now(UTC), "project_workdir": "/srv/repo", **kw}


async def refused(answers: Mapping[str, Any], roots: tuple[Path, ...] = ()) -> tuple[str, FakeWork, _Writer]:
    made, unit, writer = projects(answers, roots)
    assert await made.apply() == 1
    finished = unit.params("finish_project_request")
    assert finished["status"] == "failed" and finished["result"] is None
    return str(finished["error"]), unit, writer


async def test_a_slug_that_is_no_name_is_refused_and_the_refusal_journaled_with_its_args() -> None:
    error, _, writer = await refused({"claim_project_requests": [request("create", slug="Bad Slug!")]})
    assert error.startswith("slug 'Bad Slug!' must be 1-63 of a-z 0-9")
    (record,) = writer.events
    assert record.event_type == "project.refused"
    assert record.payload == {"request_id": str(REQUEST), "reason": error, "args": {"slug": "Bad Slug!"}}


async def test_a_workdir_outside_the_roots_is_refused_before_git_runs(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    error, unit, _ = await refused({"claim_project_requests": [request("create", slug="app", workdir=str(outside))]},
                                   roots=(tmp_path / "roots",))
    assert "outside the allowed project roots" in error
    assert unit.names() == ["claim_project_requests", "finish_project_request"]


async def test_a_merge_of_a_task_still_running_is_refused_and_journaled_on_the_task() -> None:
    error, _, writer = await refused({"claim_project_requests": [request("merge")],
                                      "get_task_worktree": task(status="running")})
    assert error == f"task {TASK} is still running"
    (record,) = writer.events
    assert (record.event_type, record.task_id, record.project_id) == ("task.merge_failed", TASK, PROJECT)
    assert record.payload == {"request_id": str(REQUEST), "action": "merge", "reason": error}


async def test_a_branch_reviewed_already_is_not_reviewed_again() -> None:
    error, _, _ = await refused({"claim_project_requests": [request("discard")],
                                 "get_task_worktree": task(review="merged")})
    assert error == f"the branch of task {TASK} was already merged"


async def test_a_branch_whose_changes_are_not_recorded_yet_waits() -> None:
    error, _, _ = await refused({"claim_project_requests": [request("merge")],
                                 "get_task_worktree": task(changes_recorded_at=None)})
    assert error.endswith("changes are not recorded yet; try again in a moment")


async def test_a_task_with_no_branch_of_a_project_has_nothing_to_merge() -> None:
    error, _, writer = await refused({"claim_project_requests": [request("merge")], "get_task_worktree": None})
    assert error == f"task {TASK} has no branch of a project"
    assert writer.events[0].task_id is None  # no such task: the record names none


async def test_a_merge_is_only_of_a_commit_the_user_reviewed() -> None:
    error, unit, _ = await refused({"claim_project_requests": [request("merge")], "get_task_worktree": task(),
                                    "get_latest_task_changes": {"payload": {"error": "git said no"}}})
    assert error == f"task {TASK}'s changes could not be recorded (git said no): there is no reviewed commit to merge"
    assert "set_task_review" not in unit.names()


async def test_a_push_of_a_running_or_discarded_task_is_refused_and_journaled_as_a_failed_push() -> None:
    error, unit, writer = await refused({"claim_project_requests": [request("push")],
                                         "get_task_worktree": task(status="running")})
    assert error == f"task {TASK} is still running" and "get_latest_task_changes" not in unit.names()
    (record,) = writer.events
    assert (record.event_type, record.task_id, record.payload) == (
        "task.push_failed", TASK, {"request_id": str(REQUEST), "action": "push", "reason": error})
    error, _, _ = await refused({"claim_project_requests": [request("push")],
                                 "get_task_worktree": task(review="discarded")})
    assert error == f"the branch of task {TASK} was discarded: there is nothing to push"


async def test_a_push_needs_a_reviewed_commit_and_a_remote_the_user_set() -> None:
    error, _, _ = await refused({"claim_project_requests": [request("push")],
                                 "get_task_worktree": task(review="merged"),
                                 "get_latest_task_changes": {"payload": {"error": "git said no"}}})
    assert error == f"task {TASK} has no reviewed commit to push (its changes are not recorded: git said no)"
    error, _, _ = await refused({"claim_project_requests": [request("push")], "get_task_worktree": task(),
                                 "get_latest_task_changes": {"payload": {"head_commit": "a" * 40}},
                                 "get_project_remote": {"id": PROJECT, "workdir": "/srv/repo", "push_remote": None}})
    assert error == f"the project of task {TASK} has no push remote: set one first"


async def test_a_push_remote_that_is_no_repository_is_refused_and_nothing_is_set(tmp_path: Path) -> None:
    update = request("update", project_id=str(PROJECT), push_remote=str(tmp_path / "nowhere.git"))
    error, unit, writer = await refused({"claim_project_requests": [update], "get_project_remote": {
        "id": PROJECT, "workdir": str(tmp_path / "repo"), "push_remote": None}})
    assert error == f"push_remote {tmp_path / 'nowhere.git'} does not exist or is not a directory"
    assert "set_project_push_remote" not in unit.names() and writer.events[0].event_type == "project.refused"


async def test_an_unexpected_error_fails_the_request_visibly_instead_of_leaving_it_claimed() -> None:
    looked: list[int] = []

    def broken_once(_params: Mapping[str, Any]) -> Any:
        looked.append(1)
        if len(looked) == 1:
            raise RuntimeError("boom")
        return task()  # the refusal's record still names the task
    error, _, writer = await refused({"claim_project_requests": [request("discard")],
                                      "get_task_worktree": broken_once})
    assert error == "internal error: RuntimeError('boom')"
    assert writer.events[0].event_type == "task.merge_failed" and writer.events[0].task_id == TASK


async def test_a_requests_outcome_is_finished_for_each_row_claimed() -> None:
    made, unit, _ = projects({"claim_project_requests": [request("create", slug="A"), request("create", slug="")]})
    assert await made.apply() == 2
    assert [c.params["status"] for c in unit.calls if c.name == "finish_project_request"] == ["failed", "failed"]


def test_a_projects_sandbox_allowlist_is_hosts_checked_one_by_one() -> None:
    assert service.sandbox_allow(None) == []
    assert service.sandbox_allow([" pypi.org ", "", "*.npmjs.org", "registry.example:8443"]) == [
        "pypi.org", "*.npmjs.org", "registry.example:8443"]
    with pytest.raises(Refused, match="must be a list"):
        service.sandbox_allow("pypi.org")
    with pytest.raises(Refused, match="'http://x' is not a host"):
        service.sandbox_allow(["http://x"])


def test_a_plan_is_read_only_from_inside_the_repository(tmp_path: Path) -> None:
    (tmp_path / "PLAN.md").write_text("- [ ] T-001 one\n")
    assert service.read_plan(tmp_path, "PLAN.md") == "- [ ] T-001 one\n"
    with pytest.raises(Refused, match="outside the repository"):
        service.read_plan(tmp_path, "../etc/passwd")
    with pytest.raises(Refused, match="not a file"):
        service.read_plan(tmp_path, "MISSING.md")
