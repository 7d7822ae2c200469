"""Gate data in the database: standing rules (migration 0017) and the evidence a gated handoff is built from."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import errors as pgerrors

from executor.gates.rules import apply_rule_requests
from executor.gates.store import GateStore
from executor.journal.writer import JournalWriter
from executor.settle import policy
from executor.sql import queries
from shared.database import Database
from tests import tables
from tests.pg import DB

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)
INSERT = ("INSERT INTO gate_rules (scope, session_id, project_id, tool_name, pattern, decision, created_by) "
          "VALUES (%s, %s, %s, 'Bash', 'npm test:*', 'allow', 'user') RETURNING id")


def test_a_rule_names_exactly_its_scope_and_the_page_may_only_revoke_it(db: DB) -> None:
    with psycopg.connect(db.executor_dsn, autocommit=True) as conn:
        project = tables.insert(conn, "projects", name="p")
        with pytest.raises(pgerrors.CheckViolation):
            conn.execute(INSERT, ["thread", None, project])  # a thread rule without its session
        with pytest.raises(pgerrors.CheckViolation):
            conn.execute(INSERT, ["project", uuid.uuid4(), project])  # two scope keys
        rule = conn.execute(INSERT, ["project", None, project]).fetchone()[0]  # type: ignore[index]
    with psycopg.connect(db.ingress_dsn, autocommit=True) as conn:
        with pytest.raises(pgerrors.InsufficientPrivilege):
            conn.execute(INSERT, ["project", None, project])
        with pytest.raises(pgerrors.InsufficientPrivilege):
            conn.execute("UPDATE gate_rules SET pattern = 'sudo:*' WHERE id = %s", [rule])
        with pytest.raises(pgerrors.CheckViolation):
            conn.execute("UPDATE gate_rules SET revoked_at = now() WHERE id = %s", [rule])  # by whom?
        conn.execute("UPDATE gate_rules SET revoked_at = now(), revoked_by = 'user' WHERE id = %s", [rule])
        assert conn.execute("SELECT count(*) FROM gate_rules WHERE revoked_at IS NULL").fetchone() == (0,)
    assert tables.rows(db.admin_dsn, "event_types", "tier", order=("name",), name="gate.decided") == [("derived",)]


def test_a_gated_handoff_measures_the_project_tree_from_the_directory_the_worker_ran_in(db: DB) -> None:
    denial = {"tool_name": "Write", "tool_input": {"file_path": "/srv/app/notes.txt"}}
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        task = tables.insert_task(conn)
        tables.append(conn, "task.spawned", {"workdir": "/srv/app"}, task_id=task)
        tables.append(conn, "task.exited", {"permission_denials": [denial]}, task_id=task)
        row = conn.execute(queries["get_exit_denials"], {"id": task}).fetchone()
    assert row == ([denial], "/srv/app", [])
    # inside the tree it ran in, the denial was the allowed-tools set's, not a gate's
    assert policy.gate_decisions(row[0], row[1])[0]["gate"] == "tool not allowed"
    assert policy.gate_decisions(row[0])[0]["gate"] == "outside the project tree"


async def test_a_rule_asked_for_a_thread_still_being_created_waits_for_it_instead_of_failing(db: DB) -> None:
    """The ingress issues a new thread's id at once and queues its creation; a standing rule asked for right
    after must not be taken (and fail as "no thread") before the threads loop has made the thread."""
    thread = uuid.uuid4()
    tables.add(db.admin_dsn, "thread_control_queue", thread_id=thread, action="create",
               args=psycopg.types.json.Jsonb({"title": "t", "mode": "autonomous"}))
    request = tables.insert(db.admin_dsn, "gate_rule_queue", scope="thread", thread_id=thread, tool_name="Bash",
                            pattern="echo ran", requested_by="user")
    async with Database(db.executor_dsn, name="rules-test", max_size=2) as database:
        writer = JournalWriter(database.pool)
        await writer.start()
        store = GateStore.over(database.pool)
        assert await apply_rule_requests(store, writer) == 0  # the thread's creation is still queued
        assert tables.row(db.admin_dsn, "gate_rule_queue", request, "status") == ("pending",)
        tables.insert_thread(db.admin_dsn, thread, mode="autonomous")
        tables.update_all(db.admin_dsn, "thread_control_queue", {"thread_id": thread}, status="done")
        assert await apply_rule_requests(store, writer) == 1
        await writer.flush_and_stop()
    assert tables.row(db.admin_dsn, "gate_rule_queue", request, "status", "error") == ("done", None)
    assert tables.count(db.admin_dsn, "gate_rules", session_id=thread, pattern="echo ran") == 1
