"""A terminal session's new thread is titled by its directory, numbered when sessions there made threads before:
two sessions of one project are told apart in the thread picker."""

from __future__ import annotations

import uuid

from psycopg_pool import AsyncConnectionPool

from executor.terminals.store import NewTerminal, TerminalStore
from tests import tables
from tests.pg import DB


async def _begin(store: TerminalStore, cwd: str, thread_id: uuid.UUID | None = None) -> uuid.UUID:
    """A session's rows as the terminal server writes them (a new thread, titled by the store, or a thread that
    exists, continued), then its end."""
    thread, task = thread_id or uuid.uuid4(), uuid.uuid4()
    title = await store.new_title(cwd) if thread_id is None else ""
    async with store.work() as (unit_store, _):
        await unit_store.insert(NewTerminal(task, thread, "exec", str(uuid.uuid4()), cwd, "/cfg", title, 0,
                                            "claude --resume x", False, "/dev/pts/1"), new_thread=thread_id is None)
    assert await store.end(task, 0, "success", "exited")
    return thread


async def test_sessions_in_one_directory_make_numbered_threads_and_a_continued_one_keeps_its_title(
        pool: AsyncConnectionPool, db: DB) -> None:
    store = TerminalStore.over(pool)
    first = await _begin(store, "/home/me/app")
    second = await _begin(store, "/home/me/app")
    other = await _begin(store, "/home/me/site")
    await _begin(store, "/home/me/app", thread_id=first)  # the first conversation continued in a terminal
    third = await _begin(store, "/home/me/app")
    titles = {t: title for t, title in tables.rows(db.admin_dsn, "sessions", "id", "title")}
    assert [titles[t] for t in (first, second, other, third)] == [
        "Terminal: app", "Terminal: app (2)", "Terminal: site", "Terminal: app (3)"]
    assert await store.new_title("/") == "Terminal: /"  # a directory with no name is named by its path
    long = "/home/me/" + "d" * 250  # a long name is cut, never its number
    await _begin(store, long)
    assert (await store.new_title(long)).endswith(" (2)") and len(await store.new_title(long)) <= 200
