from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg_pool import AsyncConnectionPool

from executor import transcript
from tests.harness import FINAL
from tests.pg import DB

TRANSCRIPTS = sorted((Path(__file__).parent / "transcripts").glob("*.jsonl"))
EXPECTED = {
    "text.jsonl": "success",
    "tool_use.jsonl": "success",
    "partial_messages.jsonl": "success",
    "rate_limited.jsonl": "rate_limited",
    "denied.jsonl": "gated",
    "sigterm.jsonl": "crashed",
    "garbage.jsonl": "success",
}


def test_every_recorded_transcript_has_an_expected_status() -> None:
    assert {p.name for p in TRANSCRIPTS} == set(EXPECTED)


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[p.name for p in TRANSCRIPTS])
async def test_import_journals_every_non_empty_line_and_derives_the_status(
    pool: AsyncConnectionPool, path: Path
) -> None:
    non_empty = [raw for raw in path.read_bytes().split(b"\n") if raw.strip()]

    summary = await transcript.import_transcript(pool, path)

    assert summary["events"] == len(non_empty)
    assert summary["status"] == EXPECTED[path.name]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT event_type FROM journal WHERE task_id = %s ORDER BY seq", [summary["task_id"]])
        types = [t for (t,) in await cur.fetchall()]
        status = (await (await conn.execute("SELECT status FROM tasks WHERE id = %s",
                                            [summary["task_id"]])).fetchone())[0]  # type: ignore[index]
    assert types[0] == "task.spawned" and types[-1] == "task.exited"
    assert len(types) == len(non_empty) + 2
    assert status == summary["status"] and status in FINAL


def test_the_command_prints_a_json_summary(db: DB, tmp_path: Path) -> None:
    env = {**os.environ, "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_INGRESS_DSN": db.ingress_dsn}
    path = Path(__file__).parent / "transcripts" / "garbage.jsonl"
    out = subprocess.run([sys.executable, "-m", "shared.cli", "import-transcript", str(path)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["events"] == 4 and summary["unparsed"] == 2 and summary["status"] == "success"

    missing = subprocess.run([sys.executable, "-m", "shared.cli", "import-transcript", str(tmp_path / "no.jsonl")],
                             env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such file" in missing.stderr
