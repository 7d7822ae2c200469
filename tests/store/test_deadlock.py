"""How a deadlock is classified (a real PostgreSQL, two connections locking in opposite orders): the
transaction PostgreSQL aborts (40P01) is a retryable contention, not the database being away — the query
layer raises `Contended`, availability declares no outage, and the ingress answers 409 (retry), not 503."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import psycopg
from psycopg import errors as pgerrors
from psycopg.types.json import Jsonb

from shared.availability import OUTAGE_ERRORS, Availability
from shared.database import Database
from shared.errors import Contended, DatabaseUnavailable
from shared.query import Queries
from tests.pg import DB, lock_waiter
from tests.served import ingress_server

LOCK_SESSION = {"lock_session": "SELECT id FROM sessions WHERE id = %(id)s FOR UPDATE"}
QUESTIONS = [{"question": "Go?", "header": "Go", "multiSelect": False,
              "options": [{"label": "Yes", "description": ""}, {"label": "No", "description": ""}]}]


def _sessions(db: DB, n: int) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(n)]
    with psycopg.connect(db.admin_dsn) as conn:
        for i in ids:
            conn.execute("INSERT INTO sessions (id, role, lifecycle, mode) VALUES (%s, 'orchestrator', 'idle',"
                         " 'interactive')", [i])
    return ids


async def _deadlock_through_the_query_layer(db: DB, q: Queries, a: uuid.UUID, b: uuid.UUID) -> BaseException:
    """Lock a then b through `q` while another connection locks b then a; what `q` raised."""
    async with await psycopg.AsyncConnection.connect(db.admin_dsn) as other:
        # the other side checks for a deadlock late, so the query layer's transaction is the one aborted
        await other.execute("SET deadlock_timeout = '20s'")
        got_a, other_got_b = asyncio.Event(), asyncio.Event()

        async def ours() -> None:
            async with q.transaction() as tx:
                await tx.execute("lock_session", {"id": a})
                got_a.set()
                await other_got_b.wait()
                await tx.execute("lock_session", {"id": b})  # waits on the other, which then waits on us

        run = asyncio.create_task(ours())
        await got_a.wait()
        await other.execute(LOCK_SESSION["lock_session"], {"id": b})
        other_got_b.set()
        await lock_waiter(db.admin_dsn, "application_name = 'test-deadlock'")
        await other.execute(LOCK_SESSION["lock_session"], {"id": a})  # the cycle: ours is aborted, this goes on
        await other.rollback()
        try:
            await asyncio.wait_for(run, 30)
        except Exception as exc:  # noqa: BLE001 - what it raised is the subject
            return exc
    raise AssertionError("no deadlock: both transactions got through")


async def test_a_deadlock_in_the_query_layer_is_contended_not_the_database_away(db: DB) -> None:
    a, b = _sessions(db, 2)
    async with Database(db.admin_dsn, name="test-deadlock", max_size=2) as database:
        q = Queries(database.pool, LOCK_SESSION)
        raised = await _deadlock_through_the_query_layer(db, q, a, b)
        availability = Availability("test")
        availability.failed(raised, "test")
        availability.failed(raised.__cause__ or raised, "test")  # the raw 40P01 a raw connection would raise
        # a loop that met it retries the same work, and it gets through
        async with q.transaction() as tx:
            await tx.execute("lock_session", {"id": a})
            await tx.execute("lock_session", {"id": b})
        availability.succeeded()
    assert isinstance(raised.__cause__, pgerrors.DeadlockDetected), repr(raised)
    assert raised.__cause__.sqlstate == "40P01"
    assert isinstance(raised, Contended) and not isinstance(raised, DatabaseUnavailable), repr(raised)
    assert "deadlock detected" in str(raised)
    assert isinstance(raised, OUTAGE_ERRORS)  # the loops that wait out an outage retry it too ...
    assert (availability.down, availability.outages) == (False, 0)  # ... but no outage is declared


async def test_the_ingress_answers_a_deadlocked_request_409_to_retry_not_503_and_the_retry_gets_through(
        db: DB) -> None:
    with psycopg.connect(db.executor_dsn, autocommit=True) as conn:
        qid = conn.execute("INSERT INTO questions (tool_use_id, questions) VALUES ('toolu_dead', %s) RETURNING id",
                           [Jsonb(QUESTIONS)]).fetchone()[0]  # type: ignore[index]
    answer = {"answers": {"Go?": "Yes"}}
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=30) as http, \
            await psycopg.AsyncConnection.connect(db.admin_dsn) as other:
        await other.execute("SET deadlock_timeout = '20s'")
        # the other side holds the question's row; the ingress's UPDATE, holding its table lock, waits on it
        await other.execute("SELECT id FROM questions WHERE id = %s FOR UPDATE", [qid])
        post = asyncio.create_task(http.post(f"/api/asks/{qid}/answer", json=answer))
        await lock_waiter(db.admin_dsn, "query LIKE '%%UPDATE questions SET status%%'")
        # then wants a table lock the ingress's UPDATE holds against it: a cycle, the ingress's side aborted
        await other.execute("LOCK TABLE questions IN SHARE MODE")
        deadlocked = await post
        await other.rollback()
        ready = await http.get("/readyz")
        retried = await http.post(f"/api/asks/{qid}/answer", json=answer)
    assert deadlocked.status_code == 409, deadlocked.text
    assert "deadlock" in deadlocked.json()["detail"] and "retry" in deadlocked.json()["detail"]
    assert "Retry-After" not in deadlocked.headers  # not an outage to wait out: retry at once
    assert ready.status_code == 200, ready.text
    assert retried.status_code == 200, retried.text
    assert retried.json()["status"] == "answered"
