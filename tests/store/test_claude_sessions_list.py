"""The Sessions picker lists the user's conversations only: the CLI conversations petal itself started for its
workers, extractors and routine runs are in the index (the executor indexes every stored file) but not in what
the ingress serves; the user's own (a terminal's, a chat thread's, an adopted one) are."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from ingress.sql import queries as ingress_sql
from tests import tables
from tests.pg import DB, Cluster


@pytest.fixture(scope="module")
def store(cluster: Cluster) -> Iterator[tuple[DB, dict[str, str]]]:
    db = cluster.create_migrated()
    ids = {name: str(uuid.uuid4()) for name in
           ("terminal", "chat", "chat_cli", "adopted", "worker", "extractor", "routine_run", "routine_cli")}
    try:
        with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
            # a chat thread whose turns speak in a conversation of their own id, one that continues a terminal's
            tables.insert_thread(conn, ids["chat"], lifecycle="running", cli_session_id=ids["chat_cli"])
            tables.insert_thread(conn, lifecycle="running", adopted_session_id=ids["adopted"],
                                 cli_session_id=ids["adopted"])
            for role in ("worker", "extractor"):  # their CLI conversation is named by their session's id
                tables.insert_thread(conn, ids[role], role=role, lifecycle="done")
            routine = tables.insert(conn, "routines", name="nightly", prompt="check")
            tables.insert_thread(conn, ids["routine_run"], lifecycle="running", cli_session_id=ids["routine_cli"])
            tables.insert(conn, "routine_runs", routine_id=routine, trigger="run", thread_id=ids["routine_run"])
            for name, sid in ids.items():
                if name in ("chat", "routine_run"):
                    continue  # a thread's own id names no file here: its cli_session_id does
                tables.add(conn, "claude_sessions", executor="ex", session_id=sid, config_dir="/c",
                           path=f"/c/{sid}.jsonl", cwd=f"/work/{name}")
        yield db, ids
    finally:
        cluster.drop(db)


def _listed(db: DB, name: str, **params: Any) -> list[Any]:
    # as the ingress reads it: under its own role, which must be able to read what the filter looks at
    with psycopg.connect(db.ingress_dsn) as conn:
        return conn.execute(ingress_sql[name], params).fetchall()


def test_the_picker_lists_the_users_conversations_not_petals_own(store: tuple[DB, dict[str, str]]) -> None:
    db, ids = store
    rows = _listed(db, "list_claude_sessions", q=None, dir=None, executor=None, limit=50, offset=0)
    listed = {r[1] for r in rows}
    assert listed == {ids["terminal"], ids["chat_cli"], ids["adopted"]}
    # negative control: petal's own conversations are in the index; the query is what leaves them out
    indexed = {sid for (sid,) in tables.rows(db.ingress_dsn, "claude_sessions", "session_id", order=("session_id",))}
    assert {ids["worker"], ids["extractor"], ids["routine_cli"]} <= indexed


def test_the_directory_filter_offers_only_the_users_directories(store: tuple[DB, dict[str, str]]) -> None:
    db, _ = store
    dirs = {r[0] for r in _listed(db, "list_claude_session_dirs")}
    assert dirs == {"/work/terminal", "/work/chat_cli", "/work/adopted"}
