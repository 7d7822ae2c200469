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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.sessions import live
from executor.sessions.index import Index, File
from executor.sessions.parse import Message, outside_turns
from executor.sessions.store import ConversationThread, NewAdoptedThread
from shared import consume, database, logs
from shared.listener import Subscription
from shared.models import NewEvent

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


class NotAdoptable(Exception):
    """Why a conversation is not made a thread (the control's failure, as the user reads it)."""


@dataclass(frozen=True)
class Adoption:
    """What an adoption writes, decided from the conversation's file and whether a live process holds it."""

    thread: NewAdoptedThread
    title: str  # the thread's title (stored cut to 200 characters)
    adopted: dict[str, Any]  # the thread.adopted record
    history: list[Message]  # the messages imported (the newest MAX_IMPORTED)
    left_out: int  # earlier messages left in the file only
    path: Path
    held: int | None  # the live process using the conversation (the thread continues a fork)


def conversation_id(args: dict[str, Any]) -> str:
    """The conversation a `create` control names (`args["adopt"]["session_id"]`), as a UUID's text."""
    given = str(args["adopt"].get("session_id"))
    try:
        return str(uuid.UUID(given))
    except ValueError:
        raise NotAdoptable(f"{given!r} is not a conversation id (a UUID)") from None


def adoptable_cwd(index: Index, f: File | None, session_id: str) -> str:
    """The directory a conversation of the index was had in, when it may be adopted."""
    if f is None:
        raise NotAdoptable(f"no conversation {session_id} on executor {index.executor}")
    if f.scan.unreadable is not None:
        raise NotAdoptable(f"the conversation's file cannot be read: {f.scan.unreadable}")
    cwd, why = index.kept_cwd(f)
    why = why or index.adoptable(cwd)
    if why is not None or cwd is None:
        raise NotAdoptable(why or "the conversation names no working directory")
    return cwd


def decide(index: Index, thread_id: uuid.UUID, args: dict[str, Any], f: File, cwd: str,
           messages: list[Message], end: int, held: int | None) -> Adoption:
    """The thread an adoption makes (pure): a live process writes into the file, so the thread then speaks in
    a fork rather than interleave two histories; a fork's own file starts with the copied history, so its
    import offset is taken when it first appears."""
    session_id = f.scan.session_id
    cli_session = str(thread_id) if held is not None else session_id
    history = messages[-MAX_IMPORTED:]
    title = args.get("title") or f.scan.title or f.scan.summary or f"conversation {session_id[:8]}"
    mode = args.get("mode") or "interactive"
    adopted = {"session_id": session_id, "executor": index.executor, "cwd": cwd, "config_dir": str(f.config_dir),
               "forked": held is not None, "live_pid": held, "cli_session_id": cli_session,
               "messages": len(messages), "imported": len(history)}
    thread = NewAdoptedThread(
        id=thread_id, title=title[:200], mode=mode, executor=index.executor, adopted_session_id=session_id,
        cli_session_id=cli_session, cli_config_dir=str(f.config_dir), cli_workdir=cwd,
        cli_fork_from=session_id if held is not None else None, cli_import_offset=end if held is None else None,
        resume_command=index.resume_command(cwd, f.config_dir, session_id))
    return Adoption(thread, title, adopted, history, len(messages) - len(history), f.path, held)


def records(a: Adoption) -> list[NewEvent]:
    """What an adoption journals with its thread: its creation, the adoption, the imported history (and what
    was left in the file), and the fork when a live process holds the conversation."""
    thread_id = a.thread.id
    events = [NewEvent("thread.created", {"title": a.title, "mode": a.thread.mode, "adopted": a.adopted},
                       session_id=thread_id),
              NewEvent("thread.adopted", a.adopted, session_id=thread_id)]
    if a.left_out:
        events.append(NewEvent("thread.harness_message", {
            "text": f"[harness] {a.left_out} earlier messages of this conversation are in its file only ({a.path}).",
            "thread_id": str(thread_id), "origin": "harness"}, session_id=thread_id))
    events.extend(_imported(a.history, thread_id, a.thread.adopted_session_id))
    if a.held is not None:
        events.append(NewEvent("thread.harness_message", {
            "text": f"[harness] A live process (pid {a.held}) is using this conversation, so this thread "
                    f"continues a fork of it ({a.thread.cli_session_id}); the terminal's conversation stays as it is.",
            "thread_id": str(thread_id), "origin": "harness"}, session_id=thread_id))
    return events


async def _prepare(index: Index, thread_id: uuid.UUID, args: dict[str, Any]) -> Adoption | None:
    """The adoption to write, None when the thread was made already, or NotAdoptable."""
    session_id = conversation_id(args)
    if await index.store.adopted_session(thread_id) == session_id:
        return None  # made before a restart cut the control's own end short (it was queued again)
    await index.refresh()  # the file as it is now, not as the last pass saw it
    f = index.by_session(session_id)
    cwd = adoptable_cwd(index, f, session_id)
    assert f is not None  # adoptable_cwd refuses a missing one
    messages, end, bad = await asyncio.to_thread(index.read_messages, f, 0)
    if bad is not None:
        raise NotAdoptable(f"the conversation's file cannot be read: {bad}")
    taken = await index.store.conversation_taken(session_id)
    if taken is not None:
        raise NotAdoptable(f"the conversation is already continued by thread {taken}")
    held = (await asyncio.to_thread(live.live_sessions, index.config_dirs)).get(session_id)
    return decide(index, thread_id, args, f, cwd, messages, end, held)


async def adopt(index: Index, thread_id: uuid.UUID, args: dict[str, Any]) -> str | None:
    """Make the thread from the conversation `args["adopt"]["session_id"]`; None, or why not."""
    try:
        adoption = await _prepare(index, thread_id, args)
    except NotAdoptable as exc:
        return str(exc)
    if adoption is None:
        return None
    async with index.store.work() as (store, unit):
        if not await store.insert_adopted_thread(adoption.thread):
            return f"thread {thread_id} exists"
        unit.emit(*records(adoption))
    log.info("thread_adopted", thread=str(thread_id), session=adoption.thread.adopted_session_id,
             forked=adoption.held is not None, imported=len(adoption.history), messages=adoption.adopted["messages"])
    return None


async def import_grown(index: Index) -> bool:
    """What terminals added to the conversations of this executor's threads while they had no turn open."""
    if not index.grown:
        return False
    ids, index.grown = sorted(index.grown), set()  # what grows meanwhile is the next pass's
    try:
        threads = await index.store.threads_of_conversations(index.executor, ids)
    except BaseException:
        index.grown |= set(ids)  # an outage: asked again when it is over
        raise
    # a conversation no thread speaks in needs nothing; one whose thread has a turn open waits for its end
    index.grown |= {t.cli_session_id for t in threads if t.turn_open}
    for thread in threads:
        if not thread.turn_open:
            await _import_thread(index, thread)
    return False


async def _import_thread(index: Index, thread: ConversationThread) -> None:
    """What a terminal added to one thread's conversation past its import offset, less its own turns' lines."""
    config_dir = Path(thread.cli_config_dir) if thread.cli_config_dir else None
    f = index.by_session(thread.cli_session_id, config_dir)
    previous = thread.cli_import_offset
    if f is None or f.scan.unreadable is not None:
        return
    if previous is None:  # first seen (a fork, a thread's first turn): what it holds is in the journal
        await index.store.advance_import(thread.id, None, f.scan.parsed_to)
        return
    if f.scan.parsed_to <= previous:
        return
    messages, end, bad = await asyncio.to_thread(index.read_messages, f, previous)
    if bad is not None:
        log.warning("adopted_conversation_unreadable", thread=str(thread.id), reason=bad)
        return
    windows = [(w.started_at, w.ended_at) for w in await index.store.turn_windows(thread.id)]
    added = outside_turns(messages, windows)
    skipped = len(added) - MAX_IMPORTED
    added = added[-MAX_IMPORTED:]  # bounded as an adoption is: the newest
    async with index.store.work() as (store, unit):
        if not await store.advance_import(thread.id, previous, end):
            return  # another pass took this stretch
        if added:
            unit.emit(NewEvent("thread.imported", {"session_id": f.scan.session_id, "messages": len(added),
                                                   "left_in_file": max(0, skipped),
                                                   "from_byte": previous, "to_byte": end},
                               session_id=thread.id),
                      *_imported(added, thread.id, f.scan.session_id))
    if added:
        log.info("terminal_messages_imported", thread=str(thread.id), messages=len(added))
