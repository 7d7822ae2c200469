"""The database enforces the invariants itself: append-only journal, immutable contract, least privilege."""

from __future__ import annotations

import hashlib
import json
import uuid

import psycopg
import pytest
from psycopg import errors as pgerrors

from tests.pg import DB

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)


def _insert_event(conn: psycopg.Connection, event_type: str = "task.spawned", tier: str = "raw") -> uuid.UUID:
    event_id = uuid.uuid4()
    conn.execute(
        "INSERT INTO journal (event_id, seq, event_type, tier, payload) VALUES (%s, 1, %s, %s, '{}')",
        [event_id, event_type, tier],
    )
    return event_id


def test_journal_rows_cannot_be_updated_deleted_or_truncated_even_by_the_owner(db: DB) -> None:
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        event_id = _insert_event(conn)
        for statement in (
            "UPDATE journal SET payload = '{\"x\": 1}' WHERE event_id = %s",
            "DELETE FROM journal WHERE event_id = %s",
        ):
            with pytest.raises(pgerrors.ObjectNotInPrerequisiteState, match="append-only"):
                conn.execute(statement, [event_id])
        with pytest.raises(pgerrors.ObjectNotInPrerequisiteState, match="append-only"):
            conn.execute("TRUNCATE journal")
        assert conn.execute("SELECT count(*) FROM journal").fetchone() == (1,)


def test_journal_refuses_an_event_type_not_in_the_reference_table_and_accepts_it_once_inserted(db: DB) -> None:
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        with pytest.raises(pgerrors.ForeignKeyViolation):
            _insert_event(conn, "worker.sneezed")
        conn.execute("INSERT INTO event_types (name, tier) VALUES ('worker.sneezed', 'raw')")
        _insert_event(conn, "worker.sneezed")


def test_journal_refuses_a_type_in_the_wrong_tier(db: DB) -> None:
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        with pytest.raises(pgerrors.ForeignKeyViolation):
            _insert_event(conn, "handoff", "raw")
        with pytest.raises(pgerrors.CheckViolation):
            _insert_event(conn, "handoff", "cooked")


def test_contract_rows_are_immutable_and_change_only_by_supersession(db: DB) -> None:
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        goal_id = conn.execute("SELECT id FROM contract WHERE field_key = 'goal'").fetchone()[0]  # type: ignore[index]
        with pytest.raises(pgerrors.ObjectNotInPrerequisiteState):
            conn.execute("UPDATE contract SET required = false WHERE id = %s", [goal_id])
        with pytest.raises(pgerrors.ObjectNotInPrerequisiteState):
            conn.execute("DELETE FROM contract WHERE id = %s", [goal_id])
        with pytest.raises(pgerrors.UniqueViolation, match="already exists"):
            conn.execute(
                "INSERT INTO contract (field_key, semantics, shape) VALUES ('goal', 'again', '{}')",
            )
        with pytest.raises(pgerrors.CheckViolation):
            conn.execute(
                "INSERT INTO contract (field_key, semantics, shape, supersedes) VALUES ('next_step', 'x', '{}', %s)",
                [goal_id],
            )

        conn.execute(
            "INSERT INTO contract (field_key, required, semantics, shape, supersedes) "
            "VALUES ('goal', false, 'the goal, now optional', '{\"type\": \"string\"}', %s)",
            [goal_id],
        )
        active = conn.execute("SELECT required, semantics FROM contract_active WHERE field_key = 'goal'").fetchall()
        assert active == [(False, "the goal, now optional")]
        keys = {k for (k,) in conn.execute("SELECT field_key FROM contract_active")}
        assert keys == {"goal", "current_state", "next_step", "ruled_out", "status", "artifacts", "gate_decisions"}
        assert conn.execute("SELECT count(*) FROM contract").fetchone() == (8,)


def test_ingress_role_cannot_write_the_journal_but_can_enqueue_a_chat_message(db: DB) -> None:
    with psycopg.connect(db.ingress_dsn, autocommit=True) as conn:
        with pytest.raises(pgerrors.InsufficientPrivilege, match="permission denied"):
            _insert_event(conn)
        with pytest.raises(pgerrors.InsufficientPrivilege):
            conn.execute("UPDATE journal_head SET last_seq = 99")
        with pytest.raises(pgerrors.InsufficientPrivilege):
            conn.execute("INSERT INTO tasks (role) VALUES ('worker')")
        with pytest.raises(pgerrors.InsufficientPrivilege):
            conn.execute("INSERT INTO event_types (name, tier) VALUES ('x', 'raw')")
        # the queue's bookkeeping columns belong to the executor
        with pytest.raises(pgerrors.InsufficientPrivilege):
            conn.execute("INSERT INTO chat_queue (thread_id, text, status) VALUES (gen_random_uuid(), 'hi', 'delivered')")

        row = conn.execute(
            "INSERT INTO chat_queue (thread_id, text, client_msg_id) VALUES (%s, 'hello', 'c-1') RETURNING id, status",
            [uuid.uuid4()],
        ).fetchone()
        assert row is not None and row[1] == "pending"
        conn.execute("INSERT INTO stop_queue (task_id) VALUES (%s)", [uuid.uuid4()])
        conn.execute("INSERT INTO thread_control_queue (thread_id, action) VALUES (%s, 'create')", [uuid.uuid4()])


def test_ingress_may_answer_a_question_only_through_the_answer_columns_and_only_once(db: DB) -> None:
    with psycopg.connect(db.executor_dsn, autocommit=True) as conn:
        qid = conn.execute(  # type: ignore[index]
            "INSERT INTO questions (tool_use_id, questions) VALUES ('toolu_1', %s) RETURNING id",
            [json.dumps([{"question": "Which?", "header": "Pick", "options": [], "multiSelect": False}])],
        ).fetchone()[0]
    with psycopg.connect(db.ingress_dsn, autocommit=True) as conn:
        with pytest.raises(pgerrors.InsufficientPrivilege):
            conn.execute("UPDATE questions SET questions = '[]' WHERE id = %s", [qid])
        conn.execute(
            "UPDATE questions SET status = 'answered', answers = '{\"Which?\": \"A\"}' WHERE id = %s", [qid]
        )
        with pytest.raises(pgerrors.ObjectNotInPrerequisiteState, match="already answered"):
            conn.execute("UPDATE questions SET status = 'cancelled' WHERE id = %s", [qid])
        answered_at = conn.execute("SELECT answered_at FROM questions WHERE id = %s",
                                   [qid]).fetchone()[0]  # type: ignore[index]
        assert answered_at is not None


def test_queue_inserts_notify_their_channel_with_the_row_id(db: DB) -> None:
    with psycopg.connect(db.executor_dsn, autocommit=True) as listener:
        for channel in ("chat_queue", "stop_queue", "thread_control_queue"):
            listener.execute(f"LISTEN {channel}")
        ids = {}
        with psycopg.connect(db.ingress_dsn, autocommit=True) as conn:
            ids["chat_queue"] = conn.execute(  # type: ignore[index]
                "INSERT INTO chat_queue (thread_id, text) VALUES (gen_random_uuid(), 'x') RETURNING id"
            ).fetchone()[0]
            ids["stop_queue"] = conn.execute(  # type: ignore[index]
                "INSERT INTO stop_queue (task_id) VALUES (gen_random_uuid()) RETURNING id"
            ).fetchone()[0]
            ids["thread_control_queue"] = conn.execute(  # type: ignore[index]
                "INSERT INTO thread_control_queue (thread_id, action) VALUES (gen_random_uuid(), 'create') RETURNING id"
            ).fetchone()[0]
        got = {n.channel: n.payload for n in listener.notifies(timeout=5, stop_after=3)}
    assert got == {channel: str(row_id) for channel, row_id in ids.items()}


def test_ingress_may_store_attachments_and_tie_them_to_a_message_but_the_executor_only_reads_them(db: DB) -> None:
    data = b"hello\n"
    digest = hashlib.sha256(data).digest()
    with psycopg.connect(db.ingress_dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO attachments (sha256, size_bytes, media_type, name, data, sent_by)"
            " VALUES (%s, %s, 'text/plain', 'log.txt', %s, 'open') RETURNING id",
            [digest, len(data), data],
        ).fetchone()
        assert row is not None
        attachment_id = row[0]
        # the detected type is one of the accepted ones, whatever a client writes
        with pytest.raises(pgerrors.CheckViolation):
            conn.execute(
                "INSERT INTO attachments (sha256, size_bytes, media_type, name, data)"
                " VALUES (%s, %s, 'image/svg+xml', 'x.svg', %s)",
                [digest, len(data), data],
            )
        message = conn.execute(
            "INSERT INTO chat_queue (thread_id, text, attachment_ids) VALUES (%s, 'see', %s) RETURNING id",
            [uuid.uuid4(), [attachment_id]],
        ).fetchone()
        assert message is not None
        conn.execute("UPDATE attachments SET chat_message_id = %s WHERE id = %s", [message[0], attachment_id])
        # the bytes are immutable for the ingress: only the message link may change
        with pytest.raises(pgerrors.InsufficientPrivilege):
            conn.execute("UPDATE attachments SET data = 'x' WHERE id = %s", [attachment_id])
        with pytest.raises(pgerrors.InsufficientPrivilege):
            conn.execute("DELETE FROM attachments")
    with psycopg.connect(db.executor_dsn, autocommit=True) as conn:
        stored = conn.execute("SELECT data, chat_message_id FROM attachments WHERE id = %s", [attachment_id]).fetchone()
        assert stored is not None and bytes(stored[0]) == data and stored[1] == message[0]
        with pytest.raises(pgerrors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO attachments (sha256, size_bytes, media_type, name, data)"
                " VALUES (%s, 1, 'text/plain', 'y', 'y')",
                [digest],
            )
