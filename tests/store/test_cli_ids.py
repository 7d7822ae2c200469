"""The command line fits together: ids as `status` prints them (8-character prefixes) are taken everywhere an id
is (a unique prefix resolves; an unknown or ambiguous one is one line naming it); `routine list|history` print
tables (`--json`: as the API answers); `routine enable|disable|delete` do what the API does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from shared import journal
from shared.models import NewEvent
from tests import tables
from tests.pg import DB

A1 = "aaaaaaaa-0000-4000-8000-000000000001"
A2 = "aaaaaaaa-0000-4000-8000-000000000002"
B1 = "bbbbbbbb-0000-4000-8000-000000000001"


def _cli(db: DB, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_INGRESS_DSN": db.ingress_dsn,
           "PETAL_LOG_FORMAT": "json"}
    return subprocess.run([sys.executable, "-m", "petal_dispatch.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def _error(out: subprocess.CompletedProcess[str], *names: str) -> str:
    assert out.returncode != 0, out.stdout
    assert "Traceback" not in out.stderr, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("petal-dispatch:")]
    assert len(lines) == 1, out.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


@pytest.fixture
async def tasks(db: DB, pool: AsyncConnectionPool) -> DB:
    """Two tasks whose ids share their first 8 characters, one that does not, and a thread: what `status`
    prints of them is ambiguous for the first two."""
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        tables.insert_thread(conn, B1, lifecycle="active")
        for task_id in (A1, A2, B1):
            tables.insert_task(conn, id=task_id, brief=f"task {task_id[-1]}", status="success", session_id=B1)
    await journal.append(pool, [NewEvent("task.user_message", {"text": "hello from b"}, task_id=uuid.UUID(B1),
                                         session_id=uuid.UUID(B1))])
    return db


def test_a_unique_prefix_names_its_task_and_thread_in_the_journal(tasks: DB) -> None:
    by_task = _cli(tasks, "journal", "--task", B1[:8])
    by_thread = _cli(tasks, "journal", "--thread", B1[:8].upper())
    assert by_task.returncode == 0, by_task.stderr
    assert "hello from b" in by_task.stdout
    assert by_thread.returncode == 0 and "hello from b" in by_thread.stdout


def test_an_ambiguous_or_unknown_prefix_is_one_line_naming_it(tasks: DB, tmp_path: Path) -> None:
    recorded = tmp_path / "t.jsonl"
    recorded.write_text("")
    _error(_cli(tasks, "journal", "--task", A1[:8]), "task id aaaaaaaa is ambiguous", A1, A2)
    _error(_cli(tasks, "journal", "--task", "cccccccc"), "no task cccccccc")
    _error(_cli(tasks, "journal", "--thread", A1[:8]), "no thread aaaaaaaa")  # a task's id is no thread's
    _error(_cli(tasks, "journal", "--task", "not-an-id%"), "'not-an-id%' is not a task id")
    _error(_cli(tasks, "reextract", A1[:8]), "ambiguous")
    _error(_cli(tasks, "reextract", "dddd"), "no task dddd")
    _error(_cli(tasks, "routine", "history", "eeee"), "no routine eeee")
    _error(_cli(tasks, "import-transcript", str(recorded), "--project", "ffff"), "no project ffff")


def test_the_whole_id_still_works_and_a_prefix_reextracts(tasks: DB) -> None:
    whole = _cli(tasks, "journal", "--task", B1)
    again = _cli(tasks, "reextract", B1[:4])  # any unique prefix, not only 8 characters
    assert whole.returncode == 0 and "hello from b" in whole.stdout
    assert again.returncode == 0, again.stderr
    (parent,) = tables.task(tasks.admin_dsn, json.loads(again.stdout)["extractor_task_id"], "parent_task_id")
    assert str(parent) == B1


def test_routines_by_prefix_as_tables_and_enabled_disabled_deleted(db: DB) -> None:
    added = _cli(db, "routine", "add", "--name", "nightly", "--prompt", "build", "--cron", "0 3 * * *",
                 "--tz", "Europe/Berlin")
    assert added.returncode == 0, added.stderr
    routine = json.loads(added.stdout)["id"]
    short = routine[:8]
    table = _cli(db, "routine", "list")
    listed = json.loads(_cli(db, "routine", "list", "--json").stdout)["routines"]
    fired = _cli(db, "routine", "fire", short)
    history = _cli(db, "routine", "history", short)
    runs = json.loads(_cli(db, "routine", "history", short, "--json").stdout)["runs"]
    disabled = _cli(db, "routine", "disable", short)
    after_disable = json.loads(_cli(db, "routine", "list", "--json").stdout)["routines"]
    enabled = _cli(db, "routine", "enable", short, "--json")
    deleted = _cli(db, "routine", "delete", short)
    after_delete = json.loads(_cli(db, "routine", "list", "--json").stdout)["routines"]
    gone = _cli(db, "routine", "fire", short)

    # list: a table as `status` prints one, the 8-character id first; --json as GET /api/routines
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == "routines (1)"
    assert lines[1].split()[:4] == [short, "nightly", "autonomous", "enabled"] and "0 3 * * * Europe/Berlin" in lines[1]
    assert "never run" in lines[1] and " 03:00 CE" in lines[1]  # the next fire in its zone (CET or CEST)
    assert [r["id"] for r in listed] == [routine]
    # fire and history by the prefix: the queued trigger; the history a table, --json as the API
    assert fired.returncode == 0, fired.stderr
    assert json.loads(fired.stdout)["routine_id"] == routine
    assert history.returncode == 0 and history.stdout.splitlines()[0] == f"runs ({len(runs)}, newest first)"
    # disable / enable through the API's own rules: no next fire while disabled, scheduled from now again
    assert disabled.returncode == 0 and f"routine {short} nightly disabled" in disabled.stdout
    assert after_disable[0]["enabled"] is False and after_disable[0]["next_fire_at"] is None
    assert enabled.returncode == 0, enabled.stderr
    shown = json.loads(enabled.stdout)
    assert shown["enabled"] is True and shown["next_fire_at"] is not None
    # delete: gone from the list, and its id no longer names a routine
    assert deleted.returncode == 0 and routine in deleted.stdout
    assert after_delete == []
    _error(gone, f"no routine {short}")
