"""Adoption and the index's look-up (executor/sessions/) on real files and the fake query layer: which
conversation may become a thread, what the thread speaks in, what is journaled with it, and what a terminal
added afterwards."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from executor.sandbox.cliconfig import session_dir
from executor.sessions import adopt, live
from executor.sessions import index as index_module
from executor.sessions import reading
from executor.sessions.adopt import NotAdoptable
from executor.sessions.index import Index
from executor.sessions.store import SessionStore
from shared.work import Work
from tests.fake_queries import FakeWork

pytestmark = pytest.mark.unit

SID = str(uuid.uuid4())
THREAD = uuid.uuid4()


class _Store(SessionStore):
    """The sessions store on the fake query layer: what a pass publishes is kept, a unit of work is the fake."""

    def __init__(self, answers: Mapping[str, Any]):
        self.unit = FakeWork(answers)
        super().__init__(self.unit)
        self.published: list[tuple[list[str], list[str], list[str] | None]] = []

    async def publish(self, executor: str, rows: Sequence[Mapping[str, Any]], gone: Sequence[str], *,
                      keep: Sequence[str] | None = None) -> None:
        self.published.append(([r["session_id"] for r in rows], list(gone), None if keep is None else list(keep)))

    @asynccontextmanager
    async def work(self) -> AsyncIterator[tuple[SessionStore, Work]]:
        yield self, self.unit


def line(kind: str, text: str, at: str, cwd: Path, sid: str = SID) -> bytes:
    return json.dumps({"type": kind, "message": {"role": kind, "content": text}, "timestamp": at,
                       "uuid": f"u-{at}", "cwd": str(cwd), "sessionId": sid, "isSidechain": False}).encode() + b"\n"


def conversation(tmp_path: Path, n: int = 2, sid: str = SID, config: str = "cfg", cwd: Path | None = None) -> Path:
    cwd = cwd or tmp_path / "app"
    cwd.mkdir(exist_ok=True)
    path = session_dir(tmp_path / config, cwd) / f"{sid}.jsonl"  # where the CLI keeps it
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(line("user" if i % 2 == 0 else "assistant", f"message {i}",
                                   f"2026-12-01T18:{i // 60:02d}:{i % 60:02d}.000Z", cwd, sid) for i in range(n)))
    return path


def index(tmp_path: Path, answers: Mapping[str, Any] | None = None, *configs: str) -> tuple[Index, _Store]:
    made = Index(None, "exec", tuple(tmp_path / c for c in (configs or ("cfg",))), (tmp_path,),  # type: ignore[arg-type]
                 tmp_path / "home" / ".claude")
    store = _Store(answers or {})
    made.store = store
    return made, store


# ---- the conversation named ----------------------------------------------------------------------------------


def test_a_conversation_is_named_by_its_uuid_in_any_spelling() -> None:
    assert adopt.conversation_id({"adopt": {"session_id": SID.upper()}}) == SID
    with pytest.raises(NotAdoptable, match="'not-a-uuid' is not a conversation id"):
        adopt.conversation_id({"adopt": {"session_id": "not-a-uuid"}})


async def test_a_conversation_the_index_does_not_hold_is_refused_naming_the_executor(tmp_path: Path) -> None:
    made, _ = index(tmp_path)
    with pytest.raises(NotAdoptable, match=f"no conversation {SID} on executor exec"):
        adopt.adoptable_cwd(made, made.by_session(SID), SID)


async def test_a_conversation_whose_lines_name_another_directory_than_it_is_kept_under_is_listed_without_it(
        tmp_path: Path) -> None:
    """A spawn writes its own conversation: lines whose `cwd` names another directory (the user's checkout) made
    the index list it there, with the title its lines chose, and an adoption run its turns there."""
    own, victim = tmp_path / "spawn-work", tmp_path / "app"
    victim.mkdir()
    path = conversation(tmp_path, cwd=own)  # kept under the spawn's own directory, as the CLI keeps it
    path.write_bytes(path.read_bytes().replace(json.dumps(str(own)).encode(), json.dumps(str(victim)).encode()))
    made, _ = index(tmp_path)
    await made.refresh()
    f = made.by_session(SID)
    assert f is not None and f.scan.cwd == str(victim)  # what the lines say
    row = made.row(f)
    assert row["cwd"] is None and row["adoptable"] is False
    with pytest.raises(NotAdoptable, match="not the directory its file is kept under"):
        adopt.adoptable_cwd(made, f, SID)
    # the same lines kept where the CLI keeps that directory's conversations: listed there, adoptable
    moved = session_dir(tmp_path / "cfg", victim) / path.name
    moved.parent.mkdir(parents=True)
    path.rename(moved)
    made, _ = index(tmp_path)
    await made.refresh()
    f = made.by_session(SID)
    assert f is not None and made.row(f)["cwd"] == str(victim) and made.row(f)["adoptable"] is True
    assert adopt.adoptable_cwd(made, f, SID) == str(victim)


async def test_a_conversation_had_outside_the_project_roots_is_not_adoptable(tmp_path: Path) -> None:
    conversation(tmp_path / "roots", cwd=tmp_path / "elsewhere")
    made, _ = index(tmp_path / "roots")
    await made.refresh()
    f = made.by_session(SID)
    assert f is not None and made.row(f)["adoptable"] is False
    with pytest.raises(NotAdoptable, match="outside the allowed project roots"):
        adopt.adoptable_cwd(made, f, SID)


def test_a_conversation_with_no_directory_is_not_adoptable(tmp_path: Path) -> None:
    made, _ = index(tmp_path)
    assert made.adoptable(None) == made.adoptable("") == "the conversation names no working directory"


# ---- what the thread speaks in -------------------------------------------------------------------------------


async def _decided(tmp_path: Path, n: int, held: int | None, args: dict[str, Any] | None = None) -> adopt.Adoption:
    conversation(tmp_path, n)
    made, _ = index(tmp_path)
    await made.refresh()
    f = made.by_session(SID)
    assert f is not None
    messages, end, bad = made.read_messages(f, 0)
    assert bad is None
    return adopt.decide(made, THREAD, {"adopt": {"session_id": SID}, **(args or {})}, f,
                        adopt.adoptable_cwd(made, f, SID), messages, end, held)


async def test_a_conversation_no_process_holds_is_continued_itself_from_where_it_ends(tmp_path: Path) -> None:
    a = await _decided(tmp_path, 4, None)
    assert (a.thread.cli_session_id, a.thread.cli_fork_from) == (SID, None)
    assert a.thread.cli_import_offset == (session_dir(tmp_path / "cfg", tmp_path / "app") / f"{SID}.jsonl").stat().st_size
    assert a.adopted["forked"] is False and a.thread.mode == "interactive"
    assert f"cd {tmp_path / 'app'} && CLAUDE_CONFIG_DIR={tmp_path / 'cfg'} claude --resume {SID} " in (
        a.thread.resume_command)  # its config directory is not the service user's ~/.claude: named


async def test_a_conversation_a_live_process_holds_is_continued_in_a_fork_named_for_the_thread(
        tmp_path: Path) -> None:
    a = await _decided(tmp_path, 2, 4242)
    assert (a.thread.cli_session_id, a.thread.cli_fork_from, a.thread.cli_import_offset) == (str(THREAD), SID, None)
    assert a.adopted["live_pid"] == 4242 and a.adopted["forked"] is True


async def test_the_title_is_the_one_asked_else_the_conversations_and_is_stored_cut(tmp_path: Path) -> None:
    a = await _decided(tmp_path, 2, None, {"title": "x" * 300, "mode": "autonomous"})
    assert (len(a.title), len(a.thread.title), a.thread.mode) == (300, 200, "autonomous")
    b = await _decided(tmp_path, 2, None)
    assert b.title == "message 0"  # the first user message


async def test_a_long_history_is_imported_in_its_newest_part_and_the_rest_is_said_to_be_in_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adopt, "MAX_IMPORTED", 3)
    a = await _decided(tmp_path, 5, None)
    assert [m.text for m in a.history] == ["message 2", "message 3", "message 4"] and a.left_out == 2
    events = adopt.records(a)
    assert [e.event_type for e in events] == ["thread.created", "thread.adopted", "thread.harness_message",
                                              "task.user_message", "stream.result", "task.user_message"]
    assert "2 earlier messages" in events[2].payload["text"]
    assert events[0].payload == {"title": "message 0", "mode": "interactive", "adopted": a.adopted}
    assert all(e.session_id == THREAD for e in events)
    assert events[3].payload["origin"] == "imported" and events[3].created_at == datetime(2026, 12, 1, 18, 0, 2,
                                                                                          tzinfo=UTC)


async def test_a_forked_adoption_tells_the_thread_whose_process_holds_the_conversation(tmp_path: Path) -> None:
    events = adopt.records(await _decided(tmp_path, 1, 99))
    assert [e.event_type for e in events][-1] == "thread.harness_message"
    assert "pid 99" in events[-1].payload["text"] and str(THREAD) in events[-1].payload["text"]


# ---- adopt as a whole ----------------------------------------------------------------------------------------


async def test_an_adoption_writes_its_thread_and_journals_its_records_in_one_unit(tmp_path: Path) -> None:
    conversation(tmp_path, 2)
    made, store = index(tmp_path, {"get_adopted_session": None, "check_conversation_taken": None,
                                   "insert_adopted_thread": {"id": THREAD}})
    assert await adopt.adopt(made, THREAD, {"adopt": {"session_id": SID}}) is None
    assert store.unit.names() == ["get_adopted_session", "check_conversation_taken", "insert_adopted_thread"]
    assert store.unit.params("insert_adopted_thread")["adopted_session_id"] == SID
    assert [e.event_type for e in store.unit.events][:2] == ["thread.created", "thread.adopted"]
    assert store.published == [([SID], [], [SID])]  # the file as it is now: a pass first


async def test_an_adoption_queued_again_after_it_was_made_does_nothing(tmp_path: Path) -> None:
    made, store = index(tmp_path, {"get_adopted_session": {"adopted_session_id": SID}})
    assert await adopt.adopt(made, THREAD, {"adopt": {"session_id": SID}}) is None
    assert store.unit.names() == ["get_adopted_session"] and store.published == [] and store.unit.events == []


async def test_a_conversation_another_thread_continues_is_refused(tmp_path: Path) -> None:
    conversation(tmp_path, 2)
    other = uuid.uuid4()
    made, store = index(tmp_path, {"get_adopted_session": None, "check_conversation_taken": {"id": other}})
    assert await adopt.adopt(made, THREAD, {"adopt": {"session_id": SID}}) == (
        f"the conversation is already continued by thread {other}")
    assert store.unit.events == []


async def test_an_adoption_into_an_existing_thread_id_is_refused_and_journals_nothing(tmp_path: Path) -> None:
    conversation(tmp_path, 2)
    made, store = index(tmp_path, {"get_adopted_session": None, "check_conversation_taken": None,
                                   "insert_adopted_thread": None})
    assert await adopt.adopt(made, THREAD, {"adopt": {"session_id": SID}}) == f"thread {THREAD} exists"
    assert store.unit.events == []


# ---- what a terminal added -----------------------------------------------------------------------------------


def thread_row(offset: int | None, turn_open: bool = False, config_dir: Path | None = None) -> dict[str, Any]:
    return {"id": THREAD, "cli_session_id": SID, "cli_config_dir": str(config_dir) if config_dir else None,
            "cli_import_offset": offset, "turn_open": turn_open}


async def test_a_thread_with_a_turn_open_waits_and_its_conversation_is_asked_about_again(tmp_path: Path) -> None:
    conversation(tmp_path, 2)
    made, store = index(tmp_path, {"list_threads_of_conversations": [thread_row(0, turn_open=True)]})
    await made.refresh()
    await adopt.import_grown(made)
    assert made.grown == {SID} and store.unit.names() == ["list_threads_of_conversations"]


async def test_a_conversation_first_seen_takes_its_end_as_the_offset_and_imports_nothing(tmp_path: Path) -> None:
    path = conversation(tmp_path, 2)
    made, store = index(tmp_path, {"list_threads_of_conversations": [thread_row(None)],
                                   "advance_thread_import": {"id": THREAD}})
    await made.refresh()
    await adopt.import_grown(made)
    assert store.unit.params("advance_thread_import") == {"id": THREAD, "previous": None,
                                                          "offset": path.stat().st_size}
    assert store.unit.events == [] and made.grown == set()


async def test_what_a_terminal_added_outside_the_threads_turns_is_imported_once(tmp_path: Path) -> None:
    path = conversation(tmp_path, 2)
    start = path.stat().st_size
    with path.open("ab") as fh:  # one line during the thread's own turn, one after it
        fh.write(line("user", "the turn's own", "2026-12-01T19:00:00.000Z", tmp_path / "app"))
        fh.write(line("user", "from the terminal", "2026-12-01T19:10:00.000Z", tmp_path / "app"))
    turn = {"started_at": datetime(2026, 12, 1, 18, 59, tzinfo=UTC), "ended_at": datetime(2026, 12, 1, 19, 1, tzinfo=UTC)}
    made, store = index(tmp_path, {"list_threads_of_conversations": [thread_row(start, config_dir=tmp_path / "cfg")],
                                   "list_thread_turn_windows": [turn], "advance_thread_import": {"id": THREAD}})
    await made.refresh()
    await adopt.import_grown(made)
    assert store.unit.params("advance_thread_import") == {"id": THREAD, "previous": start,
                                                          "offset": path.stat().st_size}
    imported, message = store.unit.events
    assert imported.payload == {"session_id": SID, "messages": 1, "left_in_file": 0, "from_byte": start,
                                "to_byte": path.stat().st_size}
    assert message.payload["text"] == "from the terminal"


async def test_a_stretch_another_pass_imported_is_not_imported_again(tmp_path: Path) -> None:
    path = conversation(tmp_path, 3)
    first_line = path.read_bytes().index(b"\n") + 1
    made, store = index(tmp_path, {"list_threads_of_conversations": [thread_row(first_line)],
                                   "list_thread_turn_windows": [], "advance_thread_import": None})
    await made.refresh()
    await adopt.import_grown(made)
    assert store.unit.params("advance_thread_import")["offset"] == path.stat().st_size and store.unit.events == []


# ---- the index's look-up -------------------------------------------------------------------------------------


async def test_one_conversation_in_two_config_directories_is_found_in_the_one_asked(tmp_path: Path) -> None:
    conversation(tmp_path, 2, config="one")
    conversation(tmp_path, 3, config="two")
    made, _ = index(tmp_path, None, "one", "two")
    changed, gone = made._look()
    assert len(changed) == 2 and gone == []
    two = made.by_session(SID, tmp_path / "two")
    assert two is not None and two.scan.message_count == 3
    assert made.by_session(SID) is not None and made.by_session(SID, tmp_path / "three") is None


async def test_only_conversation_files_are_indexed_never_through_a_link(tmp_path: Path) -> None:
    path = conversation(tmp_path, 2)
    (path.parent / "notes.txt").write_text("not a conversation")
    elsewhere = conversation(tmp_path, 2, sid=str(uuid.uuid4()), config="outside")
    (path.parent / elsewhere.name).symlink_to(elsewhere)
    made, _ = index(tmp_path)
    changed, _ = made._look()
    assert [f.scan.session_id for f in changed] == [SID]


async def test_a_conversation_whose_process_comes_or_goes_is_published_again_though_its_file_did_not_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conversation(tmp_path, 2)
    held: dict[str, int] = {}
    monkeypatch.setattr(live, "registered", lambda _dir: dict(held))
    monkeypatch.setattr(live, "named_on_command_lines", lambda: {})
    made, store = index(tmp_path)
    await made.refresh()
    held[SID] = 777
    await made.refresh()
    f = made.by_session(SID)
    assert f is not None and f.live_pid == 777
    held.clear()
    await made.refresh()
    await made.refresh()  # nothing changed: nothing published
    let_go = made.by_session(SID)
    assert let_go is not None and let_go.live_pid is None
    assert store.published == [([SID], [], [SID]), ([SID], [], None), ([SID], [], None)]


async def test_a_file_that_went_is_unpublished_unless_another_directory_still_holds_it(tmp_path: Path) -> None:
    one = conversation(tmp_path, 2, config="one")
    two = conversation(tmp_path, 2, config="two")
    made, store = index(tmp_path, None, "one", "two")
    await made.refresh()
    one.unlink()
    await made.refresh()
    two.unlink()
    await made.refresh()
    assert [p[1] for p in store.published] == [[], [], [SID]]


async def test_a_conversations_messages_are_read_a_chunk_at_a_time_to_where_the_index_parsed_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = conversation(tmp_path, 40)
    made, _ = index(tmp_path)
    await made.refresh()
    f = made.by_session(SID)
    assert f is not None
    whole, end, bad = made.read_messages(f, 0)
    assert bad is None and end == path.stat().st_size and len(whole) == 40
    reads: list[int] = []
    real_open = open

    def counted(*args: Any, **kw: Any) -> Any:  # each read's size, as the file is read
        fh = real_open(*args, **kw)
        read = fh.read

        def sized(n: int = -1) -> Any:
            reads.append(n)
            return read(n)

        fh.read = sized
        return fh

    chunk = 3 * max(len(line) + 1 for line in path.read_bytes().splitlines())  # a few lines (their length: the path's)
    assert chunk * 3 < path.stat().st_size
    monkeypatch.setattr(reading, "READ_CHUNK", chunk)
    monkeypatch.setattr(index_module, "open", counted, raising=False)
    with path.open("ab") as fh:  # lines the index has not parsed yet are not read
        fh.write(b'{"type": "user", "message": {"content": "later"}}\n')
    chunked, end2, bad2 = made.read_messages(f, 0)
    assert bad2 is None and end2 == end and [m.text for m in chunked] == [m.text for m in whole]
    assert len(reads) > 3 and all(0 < n <= chunk for n in reads), reads


@pytest.mark.parametrize("passed_over", [False, True], ids=["read alone", "too long: passed over"])
async def test_a_line_longer_than_a_chunk_does_not_stop_the_file_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      passed_over: bool) -> None:
    path = conversation(tmp_path, 2)
    at, cwd = "2026-12-01T19:00:00.000Z", tmp_path / "app"
    long = line("assistant", "x" * 5000, at, cwd)  # a large tool result or image in one message
    with path.open("ab") as fh:
        fh.write(long + line("user", "after it", "2026-12-01T19:00:01.000Z", cwd))
    monkeypatch.setattr(reading, "READ_CHUNK", 1024)
    monkeypatch.setattr(reading, "MAX_LINE", 1024 if passed_over else 64 * 1024)
    made, _ = index(tmp_path)
    await made.refresh()
    f = made.by_session(SID)
    assert f is not None and f.scan.parsed_to == path.stat().st_size and f.scan.lines == 4
    messages, end, bad = made.read_messages(f, 0)
    assert bad is None and end == path.stat().st_size
    texts = [m.text for m in messages]
    assert texts[0] == "message 0" and texts[-1] == "after it"
    assert ("x" * 5000 in texts) is not passed_over
    with path.open("ab") as fh:  # a long line still being written waits: nothing passed over, nothing half read
        fh.write(long[:3000])
    await made.refresh()
    assert made.by_session(SID).scan.parsed_to == end  # type: ignore[union-attr]
