"""The supervisor with the real claude CLI against the scripted model, on a real PostgreSQL."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from shared.models import Event
from tests.harness import Harness, config_for, live_in_group, running_supervisor, substrate_for
from tests import tables
from tests.pg import DB

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)


def _types(events: list[Event]) -> list[str]:
    return [e.event_type for e in events]


async def _run_one(db: DB, tmp_path: Path, scenario: Scenario, brief: str = "do the thing",
                   **cfg: object) -> tuple[dict[str, Any], list[Event], ScriptedModelServer]:
    with ScriptedModelServer(scenario) as model:
        async with running_supervisor(db.executor_dsn, db.admin_dsn, substrate_for(model, tmp_path),
                                      config_for(tmp_path, **cfg)) as h:
            task_id = await h.dispatch(brief)
            row = await h.wait_final(task_id)
            events = await h.events(task_id)
    return row, events, model


async def test_a_text_only_worker_succeeds_and_its_lines_are_journaled_in_order(db: DB, tmp_path: Path) -> None:
    row, events, model = await _run_one(db, tmp_path, Scenario.single({"text": "all done"}, role="worker"))

    assert row["status"] == "success" and row["exit_code"] == 0 and row["activity"] is None
    types = _types(events)
    assert types[:3] == ["task.dispatch_requested", "task.spawned", "stream.system.init"]
    assert types[-1] == "task.exited"
    assert "stream.assistant" in types and types.index("stream.assistant") < types.index("stream.result")
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    result = next(e for e in events if e.event_type == "stream.result")
    assert result.payload["result"] == "all done"
    exited = events[-1].payload
    assert exited["status"] == "success" and exited["exit_code"] == 0
    # the harness chose the conversation id, and Claude used it
    assert events[2].payload["session_id"] == str(events[2].session_id) == exited["substrate_session_id"]
    assert model.requests[0].role == "worker"


async def test_a_worker_that_uses_a_tool_journals_the_tool_use_and_its_result(db: DB, tmp_path: Path) -> None:
    scenario = Scenario.single(
        {"tool_use": {"name": "Bash", "input": {"command": "echo hi-from-bash"}}},
        {"text": "ran it"},
        role="worker",
    )
    row, events, _ = await _run_one(db, tmp_path, scenario)

    assert row["status"] == "success"
    uses = [b for e in events if e.event_type == "stream.assistant" for b in e.payload["message"]["content"]
            if b["type"] == "tool_use"]
    results = [b for e in events if e.event_type == "stream.user" for b in e.payload["message"]["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result"]
    assert uses[0]["name"] == "Bash"
    assert results[0]["tool_use_id"] == uses[0]["id"]
    assert "hi-from-bash" in str(results[0]["content"])


async def test_a_429_from_the_api_ends_rate_limited(db: DB, tmp_path: Path) -> None:
    row, events, _ = await _run_one(db, tmp_path, Scenario.single({"error": {"status": 429, "retry_after": 0}}))
    assert row["status"] == "rate_limited"
    assert row["exit_code"] == 1
    assert events[-1].payload["result"]["is_error"] is True


async def test_a_500_from_the_api_ends_failed(db: DB, tmp_path: Path) -> None:
    row, events, _ = await _run_one(db, tmp_path, Scenario.single({"error": {"status": 500}}))
    assert row["status"] == "failed" and row["status_reason"] == "api_error"


async def test_a_missing_working_directory_is_refused_at_dispatch_and_skipped_at_spawn(
    db: DB, tmp_path: Path
) -> None:
    from executor.settle import dispatch

    with ScriptedModelServer(Scenario.single({"text": "x"})) as model:
        async with running_supervisor(db.executor_dsn, db.admin_dsn, substrate_for(model, tmp_path),
                                      config_for(tmp_path)) as h:
            with pytest.raises(dispatch.DispatchRefused, match="does not exist"):
                await h.dispatch("x", workdir=tmp_path / "nope")
            gone = tmp_path / "vanishing"
            gone.mkdir()
            # a pending task whose directory disappeared before it started
            tid = tables.insert_task(db.executor_dsn, brief="x", workdir=str(tmp_path / "vanished"))
            row = await h.wait_final(tid)
    assert row["status"] == "skipped" and "does not exist" in row["status_reason"]


async def _started(h: Harness, task_id: uuid.UUID) -> int:
    await h.wait_event(task_id, "stream.system.init")
    return (await h.task(task_id))["pid"]  # type: ignore[no-any-return]  # a column: the driver's Any


async def test_a_stop_request_mid_stream_cancels_within_the_grace_and_the_group_is_gone(
    db: DB, tmp_path: Path
) -> None:
    with ScriptedModelServer(Scenario.single({"stall": {"seconds": None}})) as model:
        async with running_supervisor(db.executor_dsn, db.admin_dsn, substrate_for(model, tmp_path),
                                      config_for(tmp_path, stop_grace_s=8)) as h:
            task_id = await h.dispatch("wait forever")
            pid = await _started(h, task_id)
            await tables.ask_stop(db.ingress_dsn, task_id)
            row = await h.wait_final(task_id, timeout=30)
            events = await h.events(task_id)
            ((stop_status,),) = tables.rows(db.admin_dsn, "stop_queue", "status")

    assert row["status"] == "cancelled" and row["status_reason"] == "stop_requested"
    assert row["exit_code"] == 143
    signals = [e.payload["signal"] for e in events if e.event_type == "task.signal_sent"]
    assert signals == ["SIGTERM"]
    assert stop_status == "done"
    assert live_in_group(pid) == []


async def test_a_worker_killed_with_sigkill_ends_crashed(db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(Scenario.single({"stall": {"seconds": None}})) as model:
        async with running_supervisor(db.executor_dsn, db.admin_dsn, substrate_for(model, tmp_path),
                                      config_for(tmp_path)) as h:
            task_id = await h.dispatch("wait forever")
            pid = await _started(h, task_id)
            os.kill(pid, signal.SIGKILL)
            row = await h.wait_final(task_id, timeout=30)
            events = await h.events(task_id)
    assert row["status"] == "crashed" and row["exit_signal"] == signal.SIGKILL
    assert events[-1].payload["signal"] == "SIGKILL"


async def test_a_silent_worker_is_marked_stalled_and_resumed_when_output_returns(db: DB, tmp_path: Path) -> None:
    scenario = Scenario.single({"stall": {"seconds": 5, "text": "back again"}})
    row, events, _ = await _run_one(db, tmp_path, scenario, stall_timeout_s=1.5)

    types = _types(events)
    assert row["status"] == "success"
    # the model's silence, between the CLI's first line and its reply (on busy cores a start, or the result line
    # after the reply, slower than the threshold is a stall of its own, rightly marked, and not the one under test)
    init, reply = types.index("stream.system.init"), types.index("stream.assistant")
    silence = types[init:reply]
    assert silence.count("task.stalled") == 1 and silence.count("task.resumed") == 1, types
    stalled, resumed = init + silence.index("task.stalled"), init + silence.index("task.resumed")
    assert stalled < resumed < reply
    assert events[resumed].payload["stalled_for_s"] > 1


async def test_a_five_megabyte_line_is_journaled_intact(db: DB, tmp_path: Path) -> None:
    big = "".join(f"{i:08d} " for i in range(5 * 1024 * 1024 // 9))
    row, events, _ = await _run_one(db, tmp_path, Scenario.single({"text": big}))

    assert row["status"] == "success"
    result = next(e for e in events if e.event_type == "stream.result")
    assert result.payload["result"] == big


async def test_a_garbage_line_is_kept_as_unparsed_and_the_task_still_succeeds(db: DB, tmp_path: Path) -> None:
    from tests.harness import claude_bin

    wrapper = tmp_path / "claude-noisy"
    wrapper.write_text(f"#!/bin/sh\nprintf 'not json at all \\377\\376\\n{{\"broken\": \\n'\nexec {claude_bin()} \"$@\"\n")
    wrapper.chmod(0o755)
    with ScriptedModelServer(Scenario.single({"text": "fine"})) as model:
        sub = substrate_for(model, tmp_path)
        from dataclasses import replace

        async with running_supervisor(db.executor_dsn, db.admin_dsn, replace(sub, claude_bin=str(wrapper)),
                                      config_for(tmp_path)) as h:
            task_id = await h.dispatch("noisy")
            row = await h.wait_final(task_id)
            events = await h.events(task_id)

    assert row["status"] == "success"
    unparsed = [e.payload for e in events if e.event_type == "stream.unparsed"]
    assert unparsed[0]["line"].startswith("not json at all") and unparsed[0]["invalid_utf8"] is True
    assert unparsed[1]["line"] == '{"broken": '
    assert events[-1].payload["unparsed"] == 2


async def test_a_silent_run_is_marked_stalled_and_one_that_ignores_sigterm_is_killed_after_the_grace(
    db: DB, tmp_path: Path
) -> None:
    from dataclasses import replace

    # a "claude" that says nothing and ignores SIGTERM (its children inherit the ignore)
    stubborn = tmp_path / "claude-stubborn"
    stubborn.write_text("#!/bin/sh\ntrap '' TERM\nwhile :; do sleep 0.2; done\n")
    stubborn.chmod(0o755)
    with ScriptedModelServer(Scenario.single({"text": "unused"})) as model:
        sub = replace(substrate_for(model, tmp_path), claude_bin=str(stubborn))
        async with running_supervisor(db.executor_dsn, db.admin_dsn, sub,
                                      config_for(tmp_path, stall_timeout_s=1, stop_grace_s=1)) as h:
            task_id = await h.dispatch("say nothing")
            stalled = await h.wait_task(task_id, lambda r: r["activity"] == "stalled", 30)
            await tables.ask_stop(db.ingress_dsn, task_id)
            row = await h.wait_final(task_id, timeout=30)
            events = await h.events(task_id)

    assert stalled["status"] == "running"
    stall = next(e.payload for e in events if e.event_type == "task.stalled")
    assert stall["threshold_s"] == 1 and stall["silent_s"] >= 1
    signals = [(e.payload["signal"], e.payload["reason"]) for e in events if e.event_type == "task.signal_sent"]
    assert signals == [("SIGTERM", "stop_requested"), ("SIGKILL", "grace_expired")]
    assert (row["status"], row["status_reason"], row["exit_signal"]) == ("cancelled", "stop_requested", 9)
    assert row["activity"] is None
    exited = events[-1]
    assert exited.event_type == "task.exited" and exited.payload["signal"] == "SIGKILL"
    stop_at = next(e.created_at for e in events if e.event_type == "task.signal_sent")
    kill_at = [e.created_at for e in events if e.event_type == "task.signal_sent"][1]
    assert (kill_at - stop_at).total_seconds() >= 0.5  # the grace (1 s) was waited, not skipped
