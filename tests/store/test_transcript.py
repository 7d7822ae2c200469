from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg_pool import AsyncConnectionPool

from executor.run import transcript
from tests import tables
from tests.harness import FINAL
from tests.pg import DB

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

HERE = Path(__file__).parents[1] / "transcripts"
# the pinned CLI's everyday runs (top level), and interrupted and failed runs per CLI version (v<version>/),
# recorded with `python -m tests.transcripts.record [--runs] [--claude BIN]`
TRANSCRIPTS = sorted(HERE.glob("*.jsonl")) + sorted(HERE.glob("v*/*.jsonl"))
EXPECTED = {
    "text.jsonl": "success",
    "tool_use.jsonl": "success",
    "partial_messages.jsonl": "success",
    "rate_limited.jsonl": "rate_limited",
    "denied.jsonl": "gated",
    "sigterm.jsonl": "crashed",
    "garbage.jsonl": "success",
    # 2.1.29: interrupts, max-turns and max-budget stops end with is_error false and exit 0
    "v2.1.29/success.jsonl": "success",
    "v2.1.29/sigint_streaming.jsonl": "crashed",  # printed nothing at all before exiting 0
    "v2.1.29/sigint_tool.jsonl": "crashed",  # likewise
    "v2.1.29/sigterm_streaming.jsonl": "crashed",  # init only; an import has no exit code to tell
    "v2.1.29/control_interrupt.jsonl": "cancelled",  # error_during_execution, is_error false
    "v2.1.29/max_turns.jsonl": "partial",  # error_max_turns, is_error false, after a tool ran
    "v2.1.29/max_budget.jsonl": "failed",  # error_max_budget_usd, is_error false, before any tool ran
    "v2.1.29/api_error_500.jsonl": "failed",
    "v2.1.29/api_error_401.jsonl": "rate_limited",
    "v2.1.29/rate_limited_429.jsonl": "rate_limited",
    # 2.1.328 (pinned) and 2.1.332: the same runs with is_error true and terminal_reason set
    **{f"v{v}/{name}": status for v in ("2.1.328", "2.1.332") for name, status in {
        "success.jsonl": "success",
        "sigint_streaming.jsonl": "cancelled",
        "sigterm_streaming.jsonl": "crashed",
        "control_interrupt.jsonl": "cancelled",
        "max_turns.jsonl": "partial",
        "max_budget.jsonl": "failed",
        "api_error_500.jsonl": "failed",
        "api_error_401.jsonl": "rate_limited",
        "rate_limited_429.jsonl": "rate_limited",
    }.items()},
    "v2.1.328/sigint_tool.jsonl": "cancelled",  # aborted_tools
    "v2.1.332/sigint_tool.jsonl": "crashed",  # this recording lost its result line (a race the CLI has)
}


def _key(path: Path) -> str:
    return path.relative_to(HERE).as_posix()


def test_every_recorded_transcript_has_an_expected_status() -> None:
    assert {_key(p) for p in TRANSCRIPTS} == set(EXPECTED)


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[_key(p) for p in TRANSCRIPTS])
async def test_import_journals_every_non_empty_line_and_derives_the_status(
    pool: AsyncConnectionPool, db: DB, path: Path
) -> None:
    non_empty = [raw for raw in path.read_bytes().split(b"\n") if raw.strip()]

    summary = await transcript.import_transcript(pool, path)

    assert summary["events"] == len(non_empty)
    assert summary["status"] == EXPECTED[_key(path)]
    types = tables.event_types(db.admin_dsn, summary["task_id"])
    status = tables.status(db.admin_dsn, summary["task_id"])
    assert types[0] == "task.spawned" and types[-1] == "task.exited"
    assert len(types) == len(non_empty) + 2
    assert status == summary["status"] and status in FINAL


def test_the_command_prints_a_json_summary(db: DB, tmp_path: Path) -> None:
    env = {**os.environ, "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_INGRESS_DSN": db.ingress_dsn}
    path = Path(__file__).parents[1] / "transcripts" / "garbage.jsonl"
    out = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "import-transcript", str(path)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["events"] == 4 and summary["unparsed"] == 2 and summary["status"] == "success"

    missing = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "import-transcript", str(tmp_path / "no.jsonl")],
                             env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such file" in missing.stderr


@pytest.mark.parametrize("version", ["2.1.29", "2.1.328"])
async def test_control_protocol_lines_are_journaled_as_their_own_registered_types(
    pool: AsyncConnectionPool, db: DB, version: str
) -> None:
    # registered by the migrations, before any run showed them
    registered = {n for (n,) in tables.rows(db.admin_dsn, "event_types", "name", order=("name",),
                                            name=tables.Like("stream.control%"), tier="raw")}
    summary = await transcript.import_transcript(pool, HERE / f"v{version}" / "control_interrupt.jsonl")
    control = tables.records(db.admin_dsn, "event_type", "payload", task_id=summary["task_id"],
                             event_type=tables.Like("stream.control%"))
    assert registered == {"stream.control_request", "stream.control_response", "stream.control_cancel_request"}
    assert [(t, p["response"]["request_id"]) for t, p in control] == [("stream.control_response", "req-1")]
    assert summary["status"] == "cancelled"
