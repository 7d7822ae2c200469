"""The ingress through a real hypercorn on loopback, against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from executor.sql import queries as executor_queries
from shared import journal, query
from shared.models import NewEvent
from tests import tables
from tests.pg import DB, lock_waiter
from tests.served import SSEEvent, collect, ingress_server
from tests.wait import until

TABLES = ("journal", "tasks", "sessions", "chat_queue", "stop_queue", "thread_control_queue", "questions",
          "projects", "contract", "event_types")


def _counts(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return {t: tables.count(conn, t) for t in TABLES}


async def _append(pool: AsyncConnectionPool, n: int, start: int = 0) -> None:
    await journal.append(pool, [NewEvent("task.stderr", {"n": i}) for i in range(start, start + n)])


async def test_a_chat_post_queues_exactly_one_row_and_a_retry_with_the_same_client_id_queues_none(db: DB) -> None:
    before = _counts(db.admin_dsn)
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        first = await http.post("/api/chat", json={"text": "hello", "client_msg_id": "m-1"})
        retry = await http.post("/api/chat", json={"text": "hello", "client_msg_id": "m-1"})
        other = await http.post("/api/chat", json={"text": "different", "client_msg_id": "m-1"})
        pending = (await http.get("/api/queue")).json()["pending"]
    after = _counts(db.admin_dsn)

    assert first.status_code == 202 and first.json()["status"] == "pending" and first.json()["duplicate"] is False
    assert retry.status_code == 202 and retry.json()["id"] == first.json()["id"] and retry.json()["duplicate"]
    assert other.status_code == 409
    assert {k: after[k] - before[k] for k in TABLES} == {**{k: 0 for k in TABLES}, "chat_queue": 1}
    assert [p["id"] for p in pending] == [first.json()["id"]]


async def test_sse_delivers_events_appended_by_the_executor_role_in_seq_order(db: DB, pool: AsyncConnectionPool) -> None:
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        ready = asyncio.Event()
        reader = asyncio.create_task(collect(http, 30, ready=ready))
        await ready.wait()
        for i in range(3):
            await _append(pool, 10, i * 10)
        events = await asyncio.wait_for(reader, 30)
    assert [int(e.id) for e in events] == list(range(1, 31))  # type: ignore[arg-type]  # journal events carry an id
    assert [json.loads(e.data)["payload"]["n"] for e in events] == list(range(30))
    assert {e.event for e in events} == {"task.stderr"}


async def test_live_frames_are_byte_for_byte_the_frames_a_resume_reads(db: DB, pool: AsyncConnectionPool) -> None:
    # small batches go out from their notification's rows, a large one (past NOTIFY's cap) from a read:
    # a client resuming from 0 must get exactly the bytes the live client got
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        ready = asyncio.Event()
        reader = asyncio.create_task(collect(http, 6, ready=ready))
        await ready.wait()
        await _append(pool, 2)
        await journal.append(pool, [NewEvent("task.stderr", {"line": "é" * 5000, "f": 1.5, "z": None})])
        await journal.append(pool, [NewEvent("task.stderr", {"b": [1, {"a": "x"}], "a": "\u2028"},
                                             task_id=None, created_at=datetime(2026, 1, 1, tzinfo=UTC))])
        await _append(pool, 2, 10)
        live = await asyncio.wait_for(reader, 30)
        replayed = await collect(http, 6, headers={"Last-Event-ID": "0"})
    assert [(e.id, e.event, e.data) for e in live] == [(e.id, e.event, e.data) for e in replayed]
    assert [int(e.id) for e in live] == list(range(1, 7))  # type: ignore[arg-type]  # journal events carry an id


async def test_a_client_that_missed_100_appends_gets_exactly_those_on_resume(db: DB, pool: AsyncConnectionPool) -> None:
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        ready = asyncio.Event()
        reader = asyncio.create_task(collect(http, 5, ready=ready))
        await ready.wait()
        await _append(pool, 5)
        seen = await asyncio.wait_for(reader, 30)
        last = seen[-1].id
        for i in range(10):  # missed while disconnected
            await _append(pool, 10, 100 + i * 10)
        resumed = await collect(http, 100, headers={"Last-Event-ID": str(last)})
        ready = asyncio.Event()
        tail = asyncio.create_task(collect(http, 1, headers={"Last-Event-ID": resumed[-1].id or ""}, ready=ready))
        await ready.wait()
        await _append(pool, 1, 999)
        after = await asyncio.wait_for(tail, 30)
    assert [int(e.id) for e in resumed] == list(range(6, 106))  # type: ignore[arg-type]  # journal events carry an id
    assert [json.loads(e.data)["payload"]["n"] for e in resumed] == list(range(100, 200))
    assert [int(e.id) for e in after] == [106]  # type: ignore[arg-type]  # journal events carry an id


async def test_fifty_concurrent_sse_clients_all_receive_every_event(db: DB, pool: AsyncConnectionPool) -> None:
    async with ingress_server(db.ingress_dsn) as url:
        limits = httpx.Limits(max_connections=60)
        async with httpx.AsyncClient(base_url=url, limits=limits) as http:
            readies = [asyncio.Event() for _ in range(50)]
            readers = [asyncio.create_task(collect(http, 40, ready=r)) for r in readies]
            await asyncio.gather(*(r.wait() for r in readies))
            for i in range(4):
                await _append(pool, 10, i * 10)
            results = await asyncio.wait_for(asyncio.gather(*readers), 60)
    # journal events carry an id
    assert all([int(e.id) for e in got] == list(range(1, 41)) for got in results)  # type: ignore[arg-type]


async def test_queue_and_question_changes_are_pushed_as_wakeups(db: DB) -> None:
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        got: list[SSEEvent] = []

        async def read() -> None:
            async with http.stream("GET", "/api/stream") as response:
                from tests.served import sse_events

                ready.set()
                async for ev in sse_events(response):
                    got.append(ev)
                    if len(got) == 2:
                        return

        ready = asyncio.Event()
        reader = asyncio.create_task(read())
        await ready.wait()
        # a wake-up is not replayed: the broadcaster must be listening before the changes
        await until(lambda: tables.listening(db.admin_dsn, "petal-ingress-listen"), "the ingress listening")
        queued = (await http.post("/api/chat", json={"text": "wake"})).json()
        qid = tables.insert(db.executor_dsn, "questions", questions=Jsonb([]))
        await asyncio.wait_for(reader, 20)
    assert [(e.event, json.loads(e.data)) for e in got] == [
        ("queue", {"kind": "chat", "id": queued["id"]}), ("question", {"kind": "asked", "id": str(qid)})]
    assert all(e.id is None for e in got)


async def test_stop_a_task_and_thread_actions(db: DB) -> None:
    with psycopg.connect(db.executor_dsn, autocommit=True) as conn:
        running = tables.insert_task(conn, status="running")
        done = tables.insert_task(conn, status="success")
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        stop = await http.post(f"/api/tasks/{running}/stop", json={"reason": "enough"})
        stop_empty = await http.post(f"/api/tasks/{running}/stop", headers={"content-type": "application/json"})
        ended = await http.post(f"/api/tasks/{done}/stop", json={})
        unknown = await http.post(f"/api/tasks/{uuid.uuid4()}/stop", json={})
        created = await http.post("/api/threads", json={"title": "Plan", "mode": "autonomous"})
        thread_id = created.json()["thread_id"]
        threads = (await http.get("/api/threads")).json()["threads"]
        patched = await http.patch(f"/api/threads/{thread_id}", json={"title": "Renamed", "archived": True})
        patch_unknown = await http.patch(f"/api/threads/{uuid.uuid4()}", json={"title": "x"})
        patch_empty = await http.patch(f"/api/threads/{thread_id}", json={})
    assert stop.status_code == 202 and stop.json()["status"] == "pending"
    assert stop_empty.status_code == 202
    assert ended.status_code == 409 and "already ended" in ended.json()["detail"]
    assert unknown.status_code == 404
    assert created.status_code == 202 and created.json()["action"] == "create"
    assert [(t["id"], t["title"], t["mode"], t["pending"]) for t in threads] == [(thread_id, "Plan", "autonomous", True)]
    assert patched.status_code == 202 and [q["action"] for q in patched.json()["queued"]] == ["rename", "archive"]
    assert patch_unknown.status_code == 404 and patch_empty.status_code == 422


QUESTIONS = [
    {"question": "Which database?", "header": "DB", "multiSelect": False,
     "options": [{"label": "Postgres", "description": "x"}, {"label": "SQLite", "description": "y"}]},
    {"question": "Which extras?", "header": "Extras", "multiSelect": True,
     "options": [{"label": "Auth", "description": "a"}, {"label": "Cache", "description": "b"}]},
]


def _ask(db: DB, tool_use_id: str) -> uuid.UUID:
    return tables.ask(db.executor_dsn, QUESTIONS, tool_use_id=tool_use_id)


async def test_answers_are_checked_against_the_stored_question_and_a_question_closes_once(db: DB) -> None:
    qid = _ask(db, "toolu_A")
    _ask(db, "toolu_B")
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        bad = [
            await http.post("/api/asks/toolu_A/answer", json={"answers": {"Which database?": "Oracle",
                                                                          "Which extras?": ["Auth"]}}),
            await http.post("/api/asks/toolu_A/answer", json={"answers": {"Which database?": ["Postgres"],
                                                                          "Which extras?": ["Auth"]}}),
            await http.post("/api/asks/toolu_A/answer", json={"answers": {"Which database?": "Postgres",
                                                                          "Which extras?": "Auth"}}),
            await http.post("/api/asks/toolu_A/answer", json={"answers": {"Which database?": "Postgres"}}),
            await http.post("/api/asks/toolu_A/answer", json={"answers": {"Nope?": "Postgres"}}),
            await http.post("/api/asks/toolu_A/answer", json={}),
        ]
        pending = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
        ok = await http.post(f"/api/asks/{qid}/answer", json={"answers": {
            "Which database?": {"other": "DuckDB, embedded"}, "Which extras?": ["Auth", "Cache"]}})
        again = await http.post("/api/asks/toolu_A/answer", json={"response": "never mind"})
        dismissed = await http.post("/api/asks/toolu_B/answer", json={"response": "Not now, do the docs first"})
        cancel_closed = await http.delete("/api/asks/toolu_B")
        missing = await http.delete("/api/asks/toolu_nope")
    assert [r.status_code for r in bad] == [422] * 6
    assert all(r.json()["detail"] for r in bad)
    assert {a["tool_use_id"] for a in pending} == {"toolu_A", "toolu_B"}
    assert ok.status_code == 200 and ok.json()["answers"] == {"Which database?": "DuckDB, embedded",
                                                              "Which extras?": ["Auth", "Cache"]}
    assert again.status_code == 409
    assert dismissed.status_code == 200 and dismissed.json()["response"] == "Not now, do the docs first"
    assert dismissed.json()["status"] == "answered" and dismissed.json()["answers"] == {}
    assert cancel_closed.status_code == 409 and missing.status_code == 404


async def test_an_answer_to_a_question_that_timed_out_between_its_read_and_its_write_is_told_late(db: DB) -> None:
    # The asking tool may stop waiting after the ingress read the question and before its answer lands.
    # The answer is then late (202: the thread gets it as a message), not what the tool returned (200).
    qid = _ask(db, "toolu_race")
    answer = {"answers": {"Which database?": "Postgres", "Which extras?": ["Auth"]}}
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=30) as http, \
            await psycopg.AsyncConnection.connect(db.executor_dsn) as executor:
        async with executor.transaction():
            # the tool's timeout, not yet committed: the ingress reads the row as pending and on time, and
            # its write waits for this transaction
            await executor.execute(executor_queries["mark_question_timed_out"], {"id": qid})
            post = asyncio.create_task(http.post("/api/asks/toolu_race/answer", json=answer))
            await lock_waiter(db.admin_dsn, "query LIKE '%%UPDATE questions SET status%%'")
        answered = await post
    assert answered.status_code == 202, answered.text
    assert answered.json()["late"] is True and answered.json()["status"] == "answered"


async def test_an_answer_to_a_question_seen_asked_is_written_without_reading_its_row_first(
        db: DB, pool: AsyncConnectionPool, monkeypatch: pytest.MonkeyPatch) -> None:
    # The broadcaster keeps the questions of each `question.asked` it fans out; an answer to one of those is
    # checked against them and written by the conditional UPDATE alone. Anything it cannot settle goes the
    # reading way: a question not seen, one named by tool_use_id, a refused answer, one already closed.
    seen, late = _ask(db, "toolu_seen"), _ask(db, "toolu_late")
    unseen = _ask(db, "toolu_unseen")  # no question.asked record: asked before this process, say
    ran: list[str] = []
    sql = query._Runner.sql

    def spied(self: query._Runner, name: str) -> str:
        ran.append(name)  # the name of every query the ingress runs, which still runs as it would
        return sql(self, name)
    monkeypatch.setattr(query._Runner, "sql", spied)
    answer = {"answers": {"Which database?": "Postgres", "Which extras?": ["Auth"]}}

    async def post(ref: object, json: dict[str, Any]) -> tuple[int, Any, list[str]]:
        ran.clear()
        r = await http.post(f"/api/asks/{ref}/answer", json=json)
        return r.status_code, r.json(), [n for n in ran if "question" in n]

    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        ready = asyncio.Event()
        reader = asyncio.create_task(collect(http, 2, ready=ready))
        await ready.wait()
        await journal.append(pool, [NewEvent("question.asked", {"question_id": str(q), "questions": QUESTIONS,
                                                                "tool_use_id": f"toolu_{q}"}) for q in (seen, late)])
        assert {json.loads(e.data)["event_type"] for e in await asyncio.wait_for(reader, 30)} == {"question.asked"}
        with psycopg.connect(db.executor_dsn, autocommit=True) as conn:
            conn.execute(executor_queries["mark_question_timed_out"], {"id": late})

        refused = await post(seen, {"answers": {"Which database?": "Oracle", "Which extras?": ["Auth"]}})
        by_tool_use_id = await post("toolu_seen", {"answers": {"Nope?": "x"}})
        ok = await post(seen, answer)
        again = await post(seen, answer)
        told_late = await post(late, answer)
        not_seen = await post(unseen, answer)
    assert refused[0] == 422 and "'Oracle' is not an option" in refused[1]["detail"]
    assert refused[2] == ["get_question_by_ref"]  # the reading way tells it, in its own words
    assert by_tool_use_id[0] == 422 and by_tool_use_id[2] == ["get_question_by_ref"]
    assert ok[0] == 200 and ok[1]["status"] == "answered" and ok[1]["answered_by"] == "open"
    assert ok[1]["answers"] == answer["answers"]
    assert ok[2] == ["answer_question"]  # one round trip: no read before the write
    assert again[0] == 409 and again[1]["detail"] == "question already answered"
    assert again[2] == ["answer_question", "get_question_by_ref"]
    assert told_late[0] == 202 and told_late[1]["late"] is True and told_late[2] == ["answer_question"]
    assert not_seen[0] == 200 and not_seen[2] == ["get_question_by_ref", "answer_question"]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("post", "/api/chat", {"content": b"{not json", "headers": {"content-type": "application/json"}}, 400),
        ("post", "/api/chat", {"json": {"text": 5}}, 422),
        ("post", "/api/chat", {"json": {"text": ""}}, 422),
        ("post", "/api/chat", {"json": {"text": "x", "thread_id": "not-a-uuid"}}, 422),
        ("post", "/api/chat", {"json": {"text": "x", "surprise": 1}}, 422),
        ("post", "/api/chat", {"json": ["text"]}, 422),
        ("post", "/api/chat", {"data": {"text": "form post"}}, 415),
        ("post", "/api/chat", {"content": b"text=hi", "headers": {"content-type": "text/plain"}}, 415),
        ("post", "/api/chat", {"json": {"text": "x" * 300_000}}, 413),
        ("post", "/api/tasks/not-a-uuid/stop", {"json": {}}, 404),
        ("patch", "/api/threads/not-a-uuid", {"json": {"title": "x"}}, 404),
        ("get", "/api/tasks", {"params": {"status": "bogus"}}, 400),
        ("get", "/api/events", {"params": {"after_seq": "-1"}}, 400),
        ("get", "/api/tasks/00000000-0000-0000-0000-000000000000", {}, 404),
        ("get", "/api/handoffs", {}, 400),
        ("get", "/api/stream", {"headers": {"Last-Event-ID": "abc"}}, 400),
    ],
)
async def test_bad_input_gets_a_clear_4xx_and_writes_nothing(db: DB, method: str, path: str, kwargs: dict[str, Any],
                                                           status: int) -> None:
    before = _counts(db.admin_dsn)
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        response = await http.request(method.upper(), path, **kwargs)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["detail"]
    assert _counts(db.admin_dsn) == before


async def test_reads_page_by_seq_and_show_task_state(db: DB, pool: AsyncConnectionPool) -> None:
    task = tables.insert_task(db.executor_dsn, status="running", activity="stalled")
    await journal.append(pool, [NewEvent("task.stderr", {"n": i}, task_id=task) for i in range(5)])
    await journal.append(pool, [NewEvent("handoff", {"goal": "g"}, tier="derived", task_id=task)])
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        page1 = (await http.get(f"/api/tasks/{task}/events", params={"limit": 3})).json()
        page2 = (await http.get(f"/api/tasks/{task}/events", params={"after_seq": page1["next_after_seq"]})).json()
        derived = (await http.get("/api/events", params={"tier": "derived"})).json()["events"]
        handoffs = (await http.get("/api/handoffs", params={"scope_id": str(task)})).json()["handoffs"]
        running = (await http.get("/api/tasks", params={"running": "true"})).json()["tasks"]
        one = (await http.get(f"/api/tasks/{task}")).json()
        spec = (await http.get("/openapi.json")).json()
        health, ready = await http.get("/healthz"), await http.get("/readyz")
    assert [e["seq"] for e in page1["events"]] == [1, 2, 3] and page1["more"] is True
    assert [e["seq"] for e in page2["events"]] == [4, 5, 6]
    assert [e["event_type"] for e in derived] == ["handoff"] and handoffs[0]["payload"] == {"goal": "g"}
    assert [t["id"] for t in running] == [str(task)] and one["activity"] == "stalled"
    assert {"/api/chat", "/api/stream", "/api/asks/{ask_id}/answer", "/api/context"} <= set(spec["paths"])
    assert health.status_code == 200 and ready.json()["status"] == "ready"


async def test_a_client_that_stops_reading_is_cut_off_without_delaying_others_and_resumes_exactly(
    db: DB, pool: AsyncConnectionPool
) -> None:
    from tests.served import sse_events

    blob = "x" * 20_000  # big frames, so the stalled client's socket buffers fill
    async with ingress_server(db.ingress_dsn, sse_client_buffer=50) as url:
        async with httpx.AsyncClient(base_url=url) as fast_http, httpx.AsyncClient(base_url=url) as slow_http:
            ready = asyncio.Event()
            fast_got: list[SSEEvent] = []
            fast = asyncio.create_task(collect(fast_http, 400, ready=ready, timeout=60, got=fast_got))
            await ready.wait()
            async with slow_http.stream("GET", "/api/stream") as slow:
                for i in range(40):
                    await journal.append(pool, [NewEvent("task.stderr", {"n": i * 10 + j, "blob": blob})
                                                for j in range(10)])
                    # the reading client keeps up (a ring of 50 frames: a busy machine could leave it behind as
                    # well), while the stalled one falls 400 frames behind
                    await until(lambda: len(fast_got) >= (i + 1) * 10 or fast.done(), "the reading client's events",
                                every=0.01)
                got_fast = await asyncio.wait_for(fast, 60)
                # now drain the stalled client: it was closed by the server somewhere before the end
                seen = [int(e.id) async for e in sse_events(slow) if e.id]
            resumed = await collect(slow_http, 400 - seen[-1], headers={"Last-Event-ID": str(seen[-1])})
    assert [int(e.id) for e in got_fast] == list(range(1, 401))  # type: ignore[arg-type]  # journal events carry an id
    assert seen == list(range(1, len(seen) + 1)) and len(seen) < 400
    # journal events carry an id
    assert [int(e.id) for e in resumed] == list(range(seen[-1] + 1, 401))  # type: ignore[arg-type]


async def _ingress_backends(admin: psycopg.AsyncConnection[Any]) -> dict[int, tuple[str, str | None]]:
    """The ingress's server connections: pid -> (state, wait event type)."""
    cur = await admin.execute("SELECT pid, state, wait_event_type FROM pg_stat_activity "
                              "WHERE usename = 'petal_ingress' AND datname = current_database()")
    return {pid: (state, wait) for pid, state, wait in await cur.fetchall()}


@pytest.mark.parametrize(("case", "hold_s"), [("as served", 0.5), ("held past the detached limit", 3.0),
                                              ("negative control: read interrupted", 0.5)])
async def test_a_client_gone_while_its_replay_reads_costs_the_ingress_no_connection(
    db: DB, pool: AsyncConnectionPool, monkeypatch: pytest.MonkeyPatch, case: str, hold_s: float
) -> None:
    """A resuming client that goes away while its replay's page is being read: the read runs to its end (or, held
    up past DETACHED_READ_S, is cancelled the way psycopg survives) and its connection goes back to the pool.
    Interrupted (the control), psycopg cancels the query and closes the connection under the ingress's pool."""
    from ingress import stream
    from shared import aio

    monkeypatch.setattr(stream, "POLL_S", 3600.0)  # the broadcaster's idle read would wait on the lock as well
    monkeypatch.setattr(stream, "DETACHED_READ_S", 1.0)
    if case.startswith("negative"):
        async def interrupted(coro: Any, **_: Any) -> Any:
            return await coro
        monkeypatch.setattr(aio, "finished", interrupted)
    await _append(pool, 50)
    async with ingress_server(db.ingress_dsn) as url, \
            await psycopg.AsyncConnection.connect(db.admin_dsn, autocommit=True) as admin, \
            await psycopg.AsyncConnection.connect(db.admin_dsn, autocommit=True) as locker:
        async with httpx.AsyncClient(base_url=url) as http:
            await http.get("/api/events?after_seq=0&limit=1")  # the pool has its connection open
            await locker.execute("BEGIN")
            await locker.execute("LOCK TABLE journal IN ACCESS EXCLUSIVE MODE")  # the replay's read waits on it
            async with http.stream("GET", "/api/stream", headers={"Last-Event-ID": "0"}):
                reader = await lock_waiter(db.admin_dsn, "usename = 'petal_ingress'")
                assert [pid for pid, (_, wait) in (await _ingress_backends(admin)).items() if wait == "Lock"] \
                    == [reader], "the replay's read is not the only one waiting on the lock"
            # the client is gone; its read waits on: then the lock goes
            await asyncio.sleep(hold_s)  # not a wait: the lock is held this long, past DETACHED_READ_S or not (the case)
            if case.startswith("held"):  # given up at the detached limit, before the lock went, and kept
                assert (await _ingress_backends(admin)).get(reader) == ("idle", "Client"), "still waiting"
            await locker.execute("COMMIT")

            async def settled() -> dict[int, tuple[str, str | None]] | None:
                backends = await _ingress_backends(admin)
                return backends if reader not in backends or backends[reader][0] == "idle" else None
            backends = await until(settled, "the read's connection to be idle again, or gone", timeout=10,
                                   every=0.05)
            kept = reader in backends
            # either way the next reader is served
            replayed = await collect(http, 50, headers={"Last-Event-ID": "0"})
    assert kept is not case.startswith("negative"), backends
    assert [e.id for e in replayed] == [str(i) for i in range(1, 51)]
