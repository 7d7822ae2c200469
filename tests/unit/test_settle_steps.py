"""The settler's steps on the fake query layer (executor/settle/settler.py, extraction.py, changes.py): each takes
the settler's unit of work; what it runs, and what it emits in the journal's order. Git and the contract's
registry, which these steps read outside the settle store, are stood in for."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from executor.settle import changes, extraction
from executor.settle.dispatch import DispatchRefused
from executor.settle.settler import Settler, SettlerConfig, Step
from executor.settle.store import Ended
from shared.models import ContractField
from tests.fake_queries import FakeWork

WORKER, EXTRACTOR, THREAD, PROJECT, EXIT_EVENT = (uuid.uuid4() for _ in range(5))
SCHEMA = {"type": "object", "required": ["goal"], "properties": {"goal": {"type": "string"}},
          "$comment": "petal-dispatch contract version 3"}
GOAL = ContractField(id=1, field_key="goal", required=True, read_by=["orchestrator"], semantics="what it was for",
                     shape={"type": "string"}, supersedes=None, retired=False,
                     created_at=datetime(2026, 1, 1, tzinfo=UTC))


def source(**kw: Any) -> dict[str, Any]:
    base = {"id": WORKER, "brief": "count the files", "status": "success", "project_id": PROJECT,
            "session_id": uuid.uuid4(), "plan_ref": "T-1"}
    return {**base, **kw}


def extractor_end(**kw: Any) -> Ended:
    base: dict[str, Any] = {"id": EXTRACTOR, "role": "extractor", "status": "success", "status_reason": "completed",
                            "parent_task_id": WORKER, "json_schema": SCHEMA, "exit_event": EXIT_EVENT}
    return Ended(**{**base, **kw})


@pytest.fixture(autouse=True)
def no_git(monkeypatch: pytest.MonkeyPatch) -> None:
    async def artifacts(conn: Any, task_id: uuid.UUID) -> list[str]:
        return [f"branch petal/{task_id}"]

    async def active_on(conn: Any) -> tuple[int, list[ContractField]]:
        return 3, [GOAL]

    monkeypatch.setattr("executor.projects.worktrees.artifacts", artifacts)
    monkeypatch.setattr("shared.contract.active_on", active_on)


# ---- extraction -----------------------------------------------------------------------------------------

async def test_an_extractor_is_requested_with_the_workers_last_words_and_the_contracts_schema() -> None:
    texts = [{"event_type": "stream.result", "text": "all 12 counted"},
             {"event_type": "stream.assistant", "text": "counting"}, {"event_type": "stream.assistant", "text": None}]
    unit = FakeWork({"get_extraction_source": source(), "list_worker_texts": texts,
                     "insert_task": lambda p: {"id": p["id"]}})
    extractor_id = await extraction.request_on(unit, WORKER)
    asked = unit.params("insert_task")
    assert asked["id"] == extractor_id and asked["role"] == "extractor" and asked["parent_task_id"] == WORKER
    assert "all 12 counted" in asked["brief"] and "counting" in asked["brief"] and "- goal (required)" in asked["brief"]
    assert asked["json_schema"].obj["$comment"] == "petal-dispatch contract version 3"
    assert [e.event_type for e in unit.events] == ["task.dispatch_requested"]


async def test_no_extractor_for_a_task_that_is_gone() -> None:
    unit = FakeWork({"get_extraction_source": None})
    with pytest.raises(DispatchRefused, match=f"no task {WORKER}"):
        await extraction.request_on(unit, WORKER)


def validating(structured: Any, **answers: Any) -> FakeWork:
    return FakeWork({"get_extraction_source": source(), "get_task_result": {"structured_output": structured,
                                                                     "structured_bytes": 10},
                     "list_schema_complaints": [], "get_raw_seq_range": {"min": 4, "max": 9},
                     "mark_extraction_failed": 1,
                     "get_exit_denials": {"denials": None, "workdir": None, "decided": []},
                     "get_review_target": None, **answers})


async def test_a_valid_output_is_stored_as_the_workers_handoff_under_the_extraction_run() -> None:
    unit = validating({"goal": "count", "status": "failed"})
    validated = await extraction.validate(unit, extractor_end())
    assert validated is not None and validated.record_type == "handoff" and validated.worker_id == WORKER
    assert validated.payload["status"] == "success" and validated.payload["claimed_status"] == "failed"
    assert validated.payload["artifacts"] == [f"branch petal/{WORKER}"]
    (handoff,) = unit.events
    assert handoff.event_type == "handoff" and handoff.parent_id == EXIT_EVENT and handoff.task_id == WORKER
    assert handoff.payload["raw_seq_range"] == [4, 9] and handoff.payload["extractor_task_id"] == str(EXTRACTOR)
    assert "mark_extraction_failed" not in unit.names()


async def test_an_invalid_output_fails_the_workers_extraction() -> None:
    unit = validating({"status": "success"})
    validated = await extraction.validate(unit, extractor_end())
    assert validated is not None and validated.record_type == "handoff.extraction_failed"
    assert unit.params("mark_extraction_failed")["id"] == WORKER
    (failed,) = unit.events
    assert failed.event_type == "handoff.extraction_failed" and "goal" in failed.payload["errors"][0]


async def test_no_output_fails_with_what_the_cli_told_the_extractor() -> None:
    unit = validating(None, list_schema_complaints=[{"event_type": "stream.user", "text": "bad shape"}])
    validated = await extraction.validate(unit, extractor_end(status="failed", status_reason="max_turns"))
    assert validated is not None
    assert validated.payload["errors"] == ["the extractor returned no structured output (its run ended failed: "
                                           "max_turns)", "the CLI said: bad shape"]


async def test_a_re_extraction_that_passes_restores_the_workers_own_status() -> None:
    unit = validating({"goal": "count"}, get_extraction_source=source(status="extraction_failed"),
                      restore_exit_status={"status": "partial"})
    validated = await extraction.validate(unit, extractor_end())
    assert validated is not None and validated.payload["status"] == "partial"


async def test_validation_for_a_worker_that_is_gone_does_nothing() -> None:
    unit = FakeWork({"get_extraction_source": None})
    assert await extraction.validate(unit, extractor_end()) is None and unit.events == []


# ---- a project worker's changes -------------------------------------------------------------------------

def worktree_row(**kw: Any) -> dict[str, Any]:
    base = {"id": WORKER, "project_id": PROJECT, "session_id": None, "status": "success", "worktree": "/w/tree",
            "branch": f"petal/{WORKER}", "base_branch": "main", "base_commit": "abc", "changes_recorded_at": None,
            "review": None, "project_workdir": "/w/repo"}
    return {**base, **kw}


@pytest.fixture
def git(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    done: list[str] = []

    async def record(repo: Path, worktree: Path | None, task_id: uuid.UUID, branch: str, base: str) -> dict[str, Any]:
        done.append(f"changes {repo} {worktree} {branch} {base}")
        return {"branch": branch, "files": ["a.py"]}

    async def remove(repo: Path, path: Path) -> None:
        done.append(f"remove {path}")

    monkeypatch.setattr("executor.projects.worktrees.changes", record)
    monkeypatch.setattr("executor.projects.worktrees.remove", remove)
    return done


async def test_a_workers_changes_are_recorded_and_its_worktree_removed(git: list[str]) -> None:
    unit = FakeWork({"get_task_worktree": worktree_row(), "mark_changes_recorded": 1})
    await changes.record(unit, WORKER, keep_worktree=False)
    assert git == [f"changes /w/repo /w/tree petal/{WORKER} abc", "remove /w/tree"]
    assert unit.names() == ["get_task_worktree", "mark_changes_recorded"]
    recorded, removed = unit.events
    assert recorded.event_type == "task.changes" and recorded.payload["base_branch"] == "main"
    assert removed.event_type == "task.worktree_removed"


async def test_a_kept_worktree_stays_and_recorded_changes_are_not_recorded_again(git: list[str]) -> None:
    unit = FakeWork({"get_task_worktree": worktree_row(), "mark_changes_recorded": 1})
    await changes.record(unit, WORKER, keep_worktree=True)
    assert [e.event_type for e in unit.events] == ["task.changes"] and len(git) == 1
    again = FakeWork({"get_task_worktree": worktree_row(changes_recorded_at="2026-01-01")})
    await changes.record(again, WORKER, keep_worktree=False)
    assert again.events == [] and len(git) == 1


async def test_changes_that_cannot_be_read_are_recorded_as_the_error(git: list[str]) -> None:
    unit = FakeWork({"get_task_worktree": worktree_row(base_commit=None), "mark_changes_recorded": 1})
    await changes.record(unit, WORKER, keep_worktree=False)
    (recorded,) = unit.events  # the worktree stays for the user
    assert recorded.payload == {"branch": f"petal/{WORKER}", "error": f"no base commit recorded for branch petal/{WORKER}"}
    assert git == []


# ---- the settler's settlement of an end -----------------------------------------------------------------

def settler() -> Settler:
    return Settler(AsyncConnectionPool("postgresql://unused", open=False), SettlerConfig())


async def test_a_turn_boundary_is_only_marked_settled() -> None:
    unit = FakeWork({"mark_task_settled": 1})
    turn = Ended(uuid.uuid4(), "orchestrator", "success", "completed", thread_turn=True)
    await settler().settle(unit, turn, Step.TELL_THREAD)
    assert unit.names() == ["mark_task_settled"] and unit.events == []


async def test_a_workers_changes_are_recorded_before_its_step_and_the_marker_last(git: list[str]) -> None:
    unit = FakeWork({"get_task_worktree": worktree_row(), "mark_changes_recorded": 1, "get_extraction_source": source(),
                     "list_worker_texts": [], "insert_task": lambda p: {"id": p["id"]}, "mark_task_settled": 1})
    end = Ended(WORKER, "worker", "success", "completed", extract_on_exit=True, changes_due=True,
                exited={"lines": 3})
    await settler().settle(unit, end, Step.EXTRACT)
    assert unit.names() == ["get_task_worktree", "mark_changes_recorded", "get_extraction_source",
                            "list_worker_texts", "insert_task", "mark_task_settled"]
    assert [e.event_type for e in unit.events] == ["task.changes", "task.worktree_removed", "task.dispatch_requested"]


async def test_a_validated_extraction_goes_on_to_the_policy() -> None:
    worker = {"id": WORKER, "role": "worker", "session_id": None, "status": "success", "status_reason": "completed",
              "attempt": 1, "brief": "b", "project_id": PROJECT, "first_attempt": WORKER, "follows_policy": True,
              "thread_id": THREAD}
    unit = validating({"goal": "count"}, get_settled_worker=worker, enqueue_orchestrator_note=None,
                      mark_task_settled=1)
    await settler().settle(unit, extractor_end(), Step.VALIDATE)
    assert [e.event_type for e in unit.events] == ["handoff", "policy.decision"]
    assert unit.params("enqueue_orchestrator_note")["thread_id"] == THREAD
    assert unit.params("mark_task_settled") == {"id": EXTRACTOR}


async def test_an_output_too_large_to_read_fails_the_extraction_saying_its_size() -> None:
    unit = validating(None, get_task_result={"structured_output": None, "structured_bytes": 5_000_000})
    validated = await extraction.validate(unit, extractor_end())
    assert validated is not None and validated.record_type == "handoff.extraction_failed"
    assert validated.payload["errors"] == ["the extractor's structured output is 5,000,000 bytes of JSON, over the "
                                           "1,048,576 a handoff may hold"]
    assert "list_schema_complaints" not in unit.names()
