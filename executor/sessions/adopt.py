"""A thread made from a CLI conversation stored on this executor, and its journal kept up with the terminal.

Adoption (a `create` thread control naming `adopt`, claimed only by the executor holding the file): the
file is read whole and must parse (a file that does not is refused, never imported in part); its directory
must lie under the project roots; a conversation another live thread continues is refused. The thread
speaks in the conversation itself (`--resume <id>` in its directory, with its config directory), or, when a
live process (the terminal) is using it now, in a fork of it (`--fork-session`): the terminal's file is then
never written. Its history goes into the journal once, in the same commit as the thread, as records marked
`imported` (the last MAX_IMPORTED of them; the rest stay in the file).

After that, what a terminal adds to the conversation between the phone's turns is imported the same way
(`import_grown`): the bytes past the thread's offset, less what its own turns wrote (their lines fall
inside the turns' run windows and are in the journal already as the turns' own lines).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from executor.sessions import live
from executor.sessions.index import Index
from executor.sessions.parse import Message, outside_turns
from executor.sql import queries
from shared import consume, database, logs
from shared.listener import Subscription
from shared.models import NewEvent
from shared.query import Queries
from shared.work import work

log = logs.get(__name__)

# most messages of a conversation's history one adoption imports (the newest)
MAX_IMPORTED = 200


async def run(index: Index, sub: Subscription) -> None:
    """The index's loop: each pass refreshes the index, then imports what terminals added (also at once
    when a turn ends: its thread may have been waiting for it)."""
    async def imports() -> bool:
        return await import_grown(index)
    await consume.consume("claude-sessions", sub, {"task_ended": [index.refresh, imports]}, index.poll_s,
                          database.availability(index.pool))


def _imported(messages: list[Message], thread_id: uuid.UUID, session_id: str) -> list[NewEvent]:
    """The messages as the records Chat renders (a user's message, an answer), marked with their origin."""
    events = []
    for m in messages:
        origin = {"session_id": session_id, "uuid": m.uuid, "at": m.at.isoformat() if m.at else None}
        if m.role == "user":
            events.append(NewEvent("task.user_message", {"text": m.text, "thread_id": str(thread_id),
                                                         "origin": "imported", "imported": origin},
                                   session_id=thread_id, created_at=m.at))
        else:
            events.append(NewEvent("stream.result", {"type": "result", "subtype": "success", "is_error": False,
                                                     "result": m.text, "imported": origin},
                                   session_id=thread_id, created_at=m.at))
    return events


async def adopt(index: Index, thread_id: uuid.UUID, args: dict[str, Any]) -> str | None:
    """Make the thread from the conversation `args["adopt"]["session_id"]`; None, or why not."""
    session_id = str(args["adopt"].get("session_id"))
    try:
        session_id = str(uuid.UUID(session_id))
    except ValueError:
        return f"{session_id!r} is not a conversation id (a UUID)"
    q = Queries(index.pool, queries)
    made = await q.one("get_session_cli", {"id": thread_id})
    if made is not None and made["adopted_session_id"] == session_id:
        return None  # made before a restart cut the control's own end short (it was queued again)
    await index.refresh()  # the file as it is now, not as the last pass saw it
    f = index.by_session(session_id)
    if f is None:
        return f"no conversation {session_id} on executor {index.executor}"
    if f.scan.unreadable is not None:
        return f"the conversation's file cannot be read: {f.scan.unreadable}"
    cwd = f.scan.cwd
    why = index.adoptable(cwd)
    if why is not None or cwd is None:
        return why or "the conversation names no working directory"
    messages, end, bad = await asyncio.to_thread(index.read_messages, f, 0)
    if bad is not None:
        return f"the conversation's file cannot be read: {bad}"
    taken = await q.one("check_conversation_taken", {"session_id": session_id})
    if taken is not None:
        return f"the conversation is already continued by thread {taken['id']}"
    held = (await asyncio.to_thread(live.live_sessions, index.config_dirs)).get(session_id)
    # a live process writes into the file: the thread forks it rather than interleave two histories
    cli_session = str(thread_id) if held is not None else session_id
    history = messages[-MAX_IMPORTED:]
    title = args.get("title") or f.scan.title or f.scan.summary or f"conversation {session_id[:8]}"
    mode = args.get("mode") or "interactive"
    adopted = {"session_id": session_id, "executor": index.executor, "cwd": cwd, "config_dir": str(f.config_dir),
               "forked": held is not None, "live_pid": held, "cli_session_id": cli_session,
               "messages": len(messages), "imported": len(history)}
    async with work(q) as tx:
        made = await tx.one("insert_adopted_thread", {
            "id": thread_id, "title": title[:200], "mode": mode, "executor": index.executor,
            "adopted_session_id": session_id, "cli_session_id": cli_session, "cli_config_dir": str(f.config_dir),
            "cli_workdir": cwd, "cli_fork_from": session_id if held is not None else None,
            # a fork's own file starts with the copied history: its offset is taken when it first appears
            "cli_import_offset": end if held is None else None,
            "resume_command": index.resume_command(cwd, f.config_dir, session_id)})
        if made is None:
            return f"thread {thread_id} exists"
        tx.emit(NewEvent("thread.created", {"title": title, "mode": mode, "adopted": adopted}, session_id=thread_id),
                NewEvent("thread.adopted", adopted, session_id=thread_id))
        if len(history) < len(messages):
            tx.emit(NewEvent("thread.harness_message", {
                "text": f"[harness] {len(messages) - len(history)} earlier messages of this conversation are in "
                        f"its file only ({f.path}).", "thread_id": str(thread_id), "origin": "harness"},
                session_id=thread_id))
        tx.emit(*_imported(history, thread_id, session_id))
        if held is not None:
            tx.emit(NewEvent("thread.harness_message", {
                "text": f"[harness] A live process (pid {held}) is using this conversation, so this thread "
                        f"continues a fork of it ({cli_session}); the terminal's conversation stays as it is.",
                "thread_id": str(thread_id), "origin": "harness"}, session_id=thread_id))
    log.info("thread_adopted", thread=str(thread_id), session=session_id, forked=held is not None,
             imported=len(history), messages=len(messages))
    return None


async def import_grown(index: Index) -> bool:
    """What terminals added to the conversations of this executor's threads while they had no turn open."""
    if not index.grown:
        return False
    q = Queries(index.pool, queries)
    ids, index.grown = sorted(index.grown), set()  # what grows meanwhile is the next pass's
    try:
        threads = await q.all("list_threads_of_conversations", {"executor": index.executor, "ids": ids})
    except BaseException:
        index.grown |= set(ids)  # an outage: asked again when it is over
        raise
    # a conversation no thread speaks in needs nothing; one whose thread has a turn open waits for its end
    index.grown |= {t["cli_session_id"] for t in threads if t["turn_open"]}
    for thread in threads:
        if thread["turn_open"]:
            continue
        config_dir = Path(thread["cli_config_dir"]) if thread["cli_config_dir"] else None
        f = index.by_session(thread["cli_session_id"], config_dir)
        previous = thread["cli_import_offset"]
        if f is None or f.scan.unreadable is not None:
            continue
        if previous is None:  # first seen (a fork, a thread's first turn): what it holds is in the journal
            await q.one("advance_thread_import", {"id": thread["id"], "previous": None, "offset": f.scan.parsed_to})
            continue
        if f.scan.parsed_to <= previous:
            continue
        messages, end, bad = await asyncio.to_thread(index.read_messages, f, previous)
        if bad is not None:
            log.warning("adopted_conversation_unreadable", thread=str(thread["id"]), reason=bad)
            continue
        windows = [(w["started_at"], w["ended_at"]) for w in await q.all("list_thread_turn_windows",
                                                                          {"id": thread["id"]})]
        added = outside_turns(messages, windows)
        skipped = len(added) - MAX_IMPORTED
        added = added[-MAX_IMPORTED:]  # bounded as an adoption is: the newest
        async with work(q) as tx:
            if await tx.one("advance_thread_import", {"id": thread["id"], "previous": previous, "offset": end}) is None:
                continue  # another pass took this stretch
            if added:
                tx.emit(NewEvent("thread.imported", {"session_id": f.scan.session_id, "messages": len(added),
                                                     "left_in_file": max(0, skipped),
                                                     "from_byte": previous, "to_byte": end},
                                 session_id=thread["id"]),
                        *_imported(added, thread["id"], f.scan.session_id))
        if added:
            log.info("terminal_messages_imported", thread=str(thread["id"]), messages=len(added))
    return False
