"""The hot queries' plans on a seeded store: each reads the journal through an index, and only the records it
needs, never a walk of the journal (the benchmark, tests/bench/bench_store_scale.py, times them on 10 million
events; this is the check that keeps them flat on every commit).

One store per module, seeded with tests/bench/seed_store.py at a small size: enough that a walk over the
journal shows as thousands of rows read, and that the planner's statistics have a long worker among their
most common values (the shape that once sent a task's events read down the journal's seq index). No planner
setting is changed: the plans are those the services get.

Two checks per query:
- its plan for the seeded values, executed (EXPLAIN ANALYZE, inside a transaction rolled back): no Seq Scan on
  `journal`, and the journal rows its scans read beyond those it returns are a small share of the journal;
- its generic plan (EXPLAIN (GENERIC_PLAN), what a prepared statement may settle on after five runs, when the
  parameters' values no longer shape it): no Seq Scan on `journal`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from executor.sql import queries as executor_sql
from ingress.reads import CONVERSATION_TYPES, PAGE_BYTES
from ingress.sql import queries as ingress_sql
from shared.sql import queries as shared_sql
from tests.bench import seed_store
from tests.pg import DB, Cluster

SHAPE = seed_store.Shape(events=20_000, tasks=120, threads=12, projects=2)
# a plan that reads more of the journal than this share walks it
MAX_SHARE = 0.05

REGISTRIES = {**ingress_sql, **executor_sql, **shared_sql}
NIL = uuid.UUID(int=0)


@dataclass(frozen=True)
class Ids:
    """The values the cases read with (zero ones name the cases before the store is seeded)."""

    thread: uuid.UUID = NIL
    worker: uuid.UUID = NIL
    turn: uuid.UUID = NIL
    head: int = 0


@dataclass(frozen=True)
class Store:
    db: DB
    events: int
    ids: Ids


@pytest.fixture(scope="module")
def store(cluster: Cluster) -> Iterator[Store]:
    db = cluster.create_migrated()
    try:
        seeded = seed_store.seed(db.admin_dsn, SHAPE, rebuild_indexes=True)
        with psycopg.connect(db.admin_dsn) as conn:
            # the worker with the most records: the one most likely to be in the statistics' common values
            row = conn.execute("SELECT task_id, count(*) FROM journal j JOIN tasks t ON t.id = j.task_id "
                               "WHERE t.role = 'worker' GROUP BY 1 ORDER BY 2 DESC LIMIT 1").fetchone()
            turn = conn.execute("SELECT id FROM tasks WHERE session_id = %s AND status <> 'pending' "
                                "ORDER BY created_at DESC LIMIT 1", (seeded.busiest_thread,)).fetchone()
            head = conn.execute("SELECT last_seq FROM journal_head").fetchone()
        assert row is not None and turn is not None and head is not None
        yield Store(db, seeded.events, Ids(seeded.busiest_thread, row[0], turn[0], head[0]))
    finally:
        cluster.drop(db)


def _cases(s: Ids) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each hot query with the values the page, the settler, the claim and the threads loop give it."""
    thread, worker, turn = s.thread, s.worker, s.turn
    nothing: dict[str, Any] = {"status": None, "running": None, "tier": None, "event_type": None, "before": None,
                               "before_at": None, "before_id": None, "max_bytes": PAGE_BYTES}
    return {
        # the page (static/js): chat, its paging back, threads, tasks, a task's events, asks, context, usage, SSE
        "conversation": ("list_thread_conversation", {"thread_id": thread, "after": 0, "before": None, "limit": 100,
                                                      "types": CONVERSATION_TYPES, "max_bytes": PAGE_BYTES}),
        "conversation, paged back": ("list_thread_conversation", {
            "thread_id": thread, "after": 0, "before": s.head // 2, "limit": 100, "types": CONVERSATION_TYPES,
            "max_bytes": PAGE_BYTES}),
        "threads": ("list_threads", {"limit": 200, "before_at": None, "before_id": None}),
        "projects": ("list_projects", {}),
        "tasks": ("list_tasks", {**nothing, "limit": 200}),
        "a thread's tasks": ("list_thread_tasks", {**nothing, "thread_id": thread, "limit": 500}),
        "a task's events": ("list_task_events", {**nothing, "task_id": worker, "after": 0, "limit": 1000}),
        "a task's first events": ("list_task_events", {**nothing, "task_id": worker, "after": 0, "limit": 5}),
        "activity": ("list_events", {**nothing, "task_id": None, "after": s.head - 200, "limit": 200}),
        "pending asks": ("list_asks", {"status": "pending", "thread_id": None, "limit": 100}),
        "answered asks": ("list_asks", {"status": "answered", "thread_id": None, "limit": 20}),
        "a thread's pending asks": ("list_asks", {"status": "pending", "thread_id": thread, "limit": 20}),
        "queued messages": ("list_pending_chat", {"thread_id": thread}),
        "a thread's handoffs": ("list_handoffs", {"scope": thread, "limit": 5}),
        "a task's handoff": ("list_handoffs", {"scope": worker, "limit": 1}),
        "a thread's usage": ("list_thread_usage", {"by": "thread", "task_id": None, "thread_id": thread,
                                                   "project_id": None}),
        "a task's usage": ("list_usage", {"by": "task", "task_id": worker, "thread_id": None, "project_id": None}),
        "gate rules": ("list_gate_rules", {"thread_id": thread, "revoked": False, "limit": 100}),
        "SSE resume, 1,000 back": ("read_journal_page", {"after": s.head - 1000, "limit": 500,
                                                         "max_bytes": 16 * 1024 * 1024}),
        # the executor: claiming, settlement, the threads loop, the notifier
        "claim": ("claim_pending_tasks", {"name": "host-1", "epoch": 1, "labels": [], "shared_config": False, "n": 4,
                                          "n_unattended": 3}),
        "settlement claim": ("claim_unsettled_task", {"skip": []}),
        "settled worker": ("get_settled_worker", {"id": worker}),
        "exit denials": ("get_exit_denials", {"id": worker}),
        "gate denials": ("list_task_gate_denials", {"id": worker}),
        "result line": ("get_task_result", {"id": worker, "max_bytes": 1024 * 1024}),
        "worker texts": ("list_worker_texts", {"id": worker, "limit": 20, "chars": 20_000}),
        "exit event": ("get_task_exit_event", {"id": worker}),
        "dispatch tool use": ("get_dispatch_tool_use", {"id": worker}),
        "raw seq range": ("get_raw_seq_range", {"id": worker}),
        "threads with chat": ("list_threads_with_pending_chat", {"id": None}),
        "thread state": ("list_threads_with_pending_chat", {"id": thread}),
        "take chat": ("take_pending_chat", {"thread_id": thread, "origin": None, "limit": 50}),
        "thread controls": ("claim_thread_controls", {"executor": "vm"}),
        "notify candidates": ("list_notify_candidates", {"after": s.head - 100, "limit": 100}),
        "rule-outs": ("list_scope_rule_outs", {"scope": thread, "limit": 20}),
        "turn reruns": ("list_turn_reruns", {"ids": [turn]}),
    }


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _journal_rows_read(plan: dict[str, Any]) -> int:
    """Rows the plan's scans of `journal` touched: returned and filtered out, over all their loops."""
    return sum(round((n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)
                      + n.get("Rows Removed by Index Recheck", 0)) * n.get("Actual Loops", 1))
               for n in _nodes(plan) if n.get("Relation Name") == "journal")


def _seq_scanned(plan: dict[str, Any]) -> list[str]:
    return [n["Relation Name"] for n in _nodes(plan) if n["Node Type"] == "Seq Scan"]


def test_the_seeded_store_has_the_shapes_the_plans_are_checked_against(store: Store) -> None:
    # the walk the checks would catch reads thousands of rows; the long worker is what tempts one
    assert store.events >= 15_000
    with psycopg.connect(store.db.admin_dsn) as conn:
        worker_events = conn.execute("SELECT count(*) FROM journal WHERE task_id = %s", (store.ids.worker,)).fetchone()
        common = conn.execute("SELECT %s::text = ANY(most_common_vals::text::text[]) FROM pg_stats "
                              "WHERE tablename = 'journal' AND attname = 'task_id'", (str(store.ids.worker),)).fetchone()
    assert worker_events is not None and worker_events[0] > 1000
    assert common == (True,), "the long worker is among the planner's most common task_ids"


@pytest.mark.parametrize("case", list(_cases(Ids())))
def test_a_hot_query_reads_the_journal_through_an_index_and_only_what_it_needs(store: Store, case: str) -> None:
    name, params = _cases(store.ids)[case]
    # executed, so the writes among them (claims, take_pending_chat) run inside a transaction undone after
    with psycopg.connect(store.db.admin_dsn) as conn, conn.transaction(force_rollback=True):
        row = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {REGISTRIES[name]}", params).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    assert "journal" not in _seq_scanned(plan), f"{name}: {json.dumps(plan)[:2000]}"
    # what it reads beyond what it returns: the rows it looked at in vain
    read = _journal_rows_read(plan) - round(plan.get("Actual Rows", 0))
    assert read <= MAX_SHARE * store.events, f"{name} read {read} of {store.events} journal rows: {json.dumps(plan)[:3000]}"


def _generic(text: str) -> str:
    """The query with $n placeholders, as a prepared statement has it."""
    order: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in order:
            order.append(m.group(1))
        return f"${order.index(m.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, text)


# the named queries that read the journal, of every registry (COPY and the append are writes)
JOURNAL_READS = sorted(name for name, text in REGISTRIES.items()
                       if re.search(r"\bjournal\b", text) and not text.lstrip().upper().startswith(("COPY", "INSERT"))
                       and name not in ("advance_journal_head", "append_small_batch"))


@pytest.mark.parametrize("name", JOURNAL_READS)
def test_no_generic_plan_scans_the_journal_sequentially(store: Store, name: str) -> None:
    with psycopg.connect(store.db.admin_dsn) as conn:
        row = conn.execute(f"EXPLAIN (GENERIC_PLAN, FORMAT JSON) {_generic(REGISTRIES[name])}").fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    assert "journal" not in _seq_scanned(plan), f"{name}: {json.dumps(plan)[:2000]}"


def test_the_checks_catch_a_walk_of_the_journal(store: Store) -> None:
    # negative control: a read that can only be answered by reading every record is caught by one check or
    # the other (as a Seq Scan, or as an index walk reading the whole journal)
    with psycopg.connect(store.db.admin_dsn) as conn:
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) SELECT seq FROM journal "
                           "WHERE seq > 0 AND payload ->> 'absent' = 'x' ORDER BY seq LIMIT 10").fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    assert "journal" in _seq_scanned(plan) or _journal_rows_read(plan) > MAX_SHARE * store.events


def test_an_attempts_tool_calls_say_which_returned(db: DB) -> None:
    # list_attempt_tool_calls reads the results' ids once: the answer is still per call, in order, bounded
    task = uuid.uuid4()

    def line(kind: str, content: list[dict[str, Any]]) -> str:
        return json.dumps({"type": kind, "message": {"content": content}})

    calls = [line("assistant", [{"type": "text", "text": "first"},
                                {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": str(i)}}])
             for i in range(3)]
    results = [line("user", [{"type": "tool_result", "tool_use_id": "toolu_0", "content": "ok"}]),
               line("user", [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "ok"}])]
    rows = [("stream.assistant", calls[0]), ("stream.user", results[0]), ("stream.assistant", calls[1]),
            ("stream.assistant", calls[2]), ("stream.user", results[1])]
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO tasks (id, role, status) VALUES (%s, 'worker', 'crashed')", (task,))
        for seq, (kind, payload) in enumerate(rows, start=1):
            conn.execute("INSERT INTO journal (event_id, seq, task_id, event_type, tier, payload) "
                         "VALUES (%s, %s, %s, %s, 'raw', %s)", (uuid.uuid4(), seq, task, kind, payload))
        got = conn.execute(executor_sql["list_attempt_tool_calls"], {"task_id": task, "limit": 2}).fetchall()
    assert [(name, inp, total, finished) for name, inp, total, finished in got] == [
        ("Bash", {"command": "0"}, 3, True), ("Bash", {"command": "1"}, 3, False)]
