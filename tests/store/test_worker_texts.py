"""What the settlement reads of a worker's stdout to brief its extractor: only the texts, each cut by the server, of
lines of any shape — the lines are the spawn's word (a process in its sandbox writes the CLI's stdout) and can be
64 MiB each; the executor read forty of them whole, and a line whose text was not a string failed the settlement
(executor/sql/settle.sql `list_worker_texts`, executor/settle/extraction.py)."""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool

from executor.settle import extraction
from executor.settle.store import SettleStore
from shared import journal
from shared.models import NewEvent
from tests import tables
from tests.pg import DB


def _assistant(content: object) -> NewEvent:
    return NewEvent("stream.assistant", {"type": "assistant", "message": {"content": content}})


async def test_the_texts_of_odd_and_huge_lines_come_cut_and_never_fail_the_read(db: DB,
                                                                              pool: AsyncConnectionPool) -> None:
    task = tables.insert_task(db.executor_dsn, status="success")
    lines = [_assistant([{"type": "text", "text": "first"}, {"type": "tool_use", "name": "Bash"},
                         {"type": "text", "text": "second"}]),
             _assistant("content that is not a list"), _assistant([5, "x", None, {"type": "text", "text": 7}]),
             NewEvent("stream.assistant", ["not", "an", "object"]),
             _assistant([{"type": "text", "text": "y" * 3_000_000}]),
             NewEvent("stream.result", {"type": "result", "result": {"not": "a string"}}),
             NewEvent("stream.result", {"type": "result", "result": "z" * 3_000_000})]
    await journal.append(pool, [NewEvent(e.event_type, e.payload, task_id=task) for e in lines])
    texts = await SettleStore.over(pool).worker_texts(task, 40, 1000)
    assert [(t.event_type, None if t.text is None else t.text[:8]) for t in texts] == [
        ("stream.result", "z" * 8), ("stream.result", None), ("stream.assistant", "y" * 8),
        ("stream.assistant", None), ("stream.assistant", "7"), ("stream.assistant", None),
        ("stream.assistant", "first\nse")]
    assert all(t.text is None or len(t.text) <= 1000 for t in texts)
    result, messages = extraction._texts(texts)
    assert result == "z" * 1000 and messages == ["first\nsecond", "7", "y" * 1000]


async def test_an_extractors_output_and_complaints_are_read_bounded_from_lines_of_any_shape(
        db: DB, pool: AsyncConnectionPool) -> None:
    extractor = tables.insert_task(db.executor_dsn, status="success")
    user = [NewEvent("stream.user", {"message": {"content": "not a list"}}),
            NewEvent("stream.user", {"message": {"content": [7, {"type": "tool_result", "is_error": True,
                                                                 "content": [{"type": "text", "text": "bad"}]},
                                                             {"type": "tool_result", "is_error": "yes", "content": "x"},
                                                             {"type": "tool_result", "is_error": True,
                                                              "content": "e" * 100_000}]}}),
            NewEvent("stream.result", {"type": "result", "structured_output": {"goal": "g" * 2_000_000}})]
    await journal.append(pool, [NewEvent(e.event_type, e.payload, task_id=extractor) for e in user])
    store = SettleStore.over(pool)
    complaints = await store.schema_complaints(extractor, 20, 500)
    assert complaints == ['[{"text": "bad", "type": "text"}]', "e" * 500]
    found = await store.task_result(extractor, 1024 * 1024)
    assert found is not None and found.structured_output is None and (found.structured_bytes or 0) > 2_000_000
    small = await store.task_result(extractor, 4 * 1024 * 1024)
    assert small is not None and small.structured_output == {"goal": "g" * 2_000_000}
