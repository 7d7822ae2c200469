"""A terminal session's pure parts (executor/terminals/): what the screen says of the CLI's prompt, which
conversation entries are journaled and how, how the CLI is started, and the wire's frames."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from typing import Any, cast
from pathlib import Path

import pytest

from executor.terminals import boxed, follow, launch, server
from executor.terminals.follow import Follower, blocks, conversation_file
from executor.terminals.screen import Screen, read, without_strings
from shared import terminal_wire as wire
from tests.wait import until

pytestmark = pytest.mark.unit

RULE = "─" * 40


def test_the_prompt_is_ready_only_when_its_box_shows_empty_and_no_turn_runs() -> None:
    assert read(["● done", RULE, "❯\u00a0", RULE, "  ⏸ manual mode on · ? for shortcuts"]).ready
    typing = read([RULE, "❯\u00a0half a thought", RULE, "  ⏸ manual mode on"])
    assert typing.at_prompt and typing.typed == "half a thought" and not typing.ready
    busy = read(["✢ Crafting…", RULE, "❯\u00a0", RULE, "  ⏸ manual mode on · esc to interrupt"])
    assert busy.box and not busy.at_prompt and not busy.ready
    # a dialog over the box: a past prompt (`❯ text` with no rule above) and an option line are not the box
    dialog = read(["❯ RUN: touch x", "", "● Bash(touch x)", RULE, " Do you want to proceed?", " ❯ 1. Yes", "   4. No"])
    assert not dialog.box and not dialog.ready
    draft = read([RULE, "❯\u00a0line one", "  line two", RULE])
    assert draft.typed == "line one\nline two"


def test_the_screen_is_kept_from_the_bytes_and_redrawn_for_a_terminal_attaching() -> None:
    s = Screen(6, 30)
    s.feed(f"\x1b[2J\x1b[H● hello\r\n{RULE[:30]}\r\n❯\u00a0\r\n{RULE[:30]}".encode())
    assert s.state().ready
    assert b"hello" in s.redraw() and s.redraw().startswith(b"\x1b[H\x1b[2J")


def test_the_cli_s_terminal_queries_are_not_taken_for_typed_text_even_cut_across_reads() -> None:
    # its graphics probe (APC), ended by ST, once whole and once across two reads; an OSC title ended by BEL
    assert without_strings(b"", b"ab\x1b_Gi=31,s=1;AAAA\x1b\\cd") == (b"abcd", b"")
    shown, carried = without_strings(b"", b"ab\x1b_Gi=31;AA")
    assert (shown, without_strings(carried, b"AA\x1b\\cd")) == (b"ab", (b"cd", b""))
    assert without_strings(b"", b"\x1b]0;title\x07z") == (b"z", b"")
    assert without_strings(*without_strings(b"", b"x\x1b")[1:], b"[2Jy") == (b"\x1b[2Jy", b"")
    s = Screen(6, 40)
    s.feed(f"{RULE[:40]}\r\n❯\u00a0".encode() + b"\x1b_Gi=31,s=1,v=1,a=q,t=d,f=24;AAAA")
    s.feed(f"\x1b\\\r\n{RULE[:40]}".encode())
    assert s.state().ready  # the probe's text is not on the input line


def _entry(kind: str, content: object, **more: object) -> dict[str, object]:
    return {"type": kind, "message": {"role": kind, "content": content}, "uuid": "u1", **more}


def test_a_prompt_a_reply_a_tool_call_and_its_result_are_told_apart_and_bookkeeping_is_not_journaled() -> None:
    assert blocks(_entry("user", "hello")) == ("hello", [])
    assert blocks(_entry("user", [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])) == ("a\nb", [])
    said = blocks(_entry("assistant", [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "hi"},
                                       {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]))
    assert said == (None, [{"type": "text", "text": "hi"},
                           {"type": "tool_use", "id": "t1", "name": "Bash", "input": '{"command": "ls"}'}])
    result = blocks(_entry("user", [{"type": "tool_result", "tool_use_id": "t1", "content": "x" * 5000}]))
    assert result[0] is None and result[1][0]["tool_use_id"] == "t1" and len(result[1][0]["text"]) < 2100
    assert blocks(_entry("user", "<meta>", isMeta=True)) == (None, [])
    assert blocks({"type": "file-history-snapshot"}) == (None, [])


def test_a_bang_command_is_the_prompt_typed_and_its_output_a_block_not_tagged_text() -> None:
    # the two user entries the CLI (2.1.328) wrote for `!echo hi there; echo oops >&2`, and for a failing `!ls`
    assert blocks(_entry("user", "<bash-input>echo hi there; echo oops >&2</bash-input>")) == (
        "!echo hi there; echo oops >&2", [])
    assert blocks(_entry("user", "<bash-stdout>hi there\noops</bash-stdout><bash-stderr></bash-stderr>")) == (
        None, [{"type": "shell_output", "is_error": False, "text": "hi there\noops"}])
    failed = "<bash-stdout></bash-stdout><bash-stderr>ls: cannot access '/x': No such file or directory\n</bash-stderr>"
    assert blocks(_entry("user", failed)) == (
        None, [{"type": "shell_output", "is_error": True, "text": "ls: cannot access '/x': No such file or directory"}])
    # only the whole entry: text that merely mentions the tags is a prompt like any other
    assert blocks(_entry("user", "what does <bash-input>ls</bash-input> print?"))[0] == (
        "what does <bash-input>ls</bash-input> print?")


def test_the_follower_journals_whole_lines_once_and_not_a_prompt_the_page_typed(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    lines = [_entry("user", "from the phone"), _entry("user", "at the desk"),
             _entry("assistant", [{"type": "text", "text": "echo"}]),
             _entry("user", [{"type": "text", "text": "[Request interrupted by user]"}])]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"type": "user", "mess')  # a line half written
    f = Follower(path, uuid.uuid4(), uuid.uuid4(), 0, typed=["from the phone"])
    end, events = f.read()
    assert end == path.read_text().rfind("\n") + 1
    assert [(e.event_type, e.payload.get("text") or e.payload.get("role")) for e in events] == [
        ("task.user_message", "at the desk"), ("terminal.entry", "assistant"), ("terminal.entry", "interrupted")]
    assert events[0].payload["origin"] == "terminal" and f.typed == []


def test_the_follower_reads_its_conversation_only_as_a_regular_file_and_a_bounded_read_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # what a sandboxed session can put where its conversation is written: a link (to another conversation; to
    # /dev/zero it read the executor out of memory, not tried here) or a FIFO; each is read as nothing
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps(_entry("user", "another conversation")) + "\n")
    path = tmp_path / "c.jsonl"
    path.symlink_to(other)
    assert Follower(path, uuid.uuid4(), uuid.uuid4(), 0).read() == (0, [])
    path.unlink()
    os.mkfifo(path)
    assert Follower(path, uuid.uuid4(), uuid.uuid4(), 0).read() == (0, [])  # returns: no reader waits on a writer
    path.unlink()
    # a line longer than a read is passed over; the lines after it are read at the next looks
    monkeypatch.setattr(follow, "READ_MAX", 1000)
    path.write_text('{"x": "' + "y" * 2500 + '"}\n' + json.dumps(_entry("user", "after it")) + "\n")
    f = Follower(path, uuid.uuid4(), uuid.uuid4(), 0)
    seen = []
    for _ in range(5):
        f.offset, events = f.read()
        seen += [e.payload.get("text") for e in events]
    assert seen == ["after it"] and f.offset == path.stat().st_size


def test_how_a_session_names_its_conversation(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "CLAUDE_CONFIG_DIR": str(tmp_path / "cfg")}
    fresh = launch.plan(["--model", "x"], "/w", env)
    assert not isinstance(fresh, str) and fresh.args == ["--model", "x", "--session-id", fresh.session_id]
    given = str(uuid.uuid4())
    resumed = launch.plan(["--resume", given], "/w", env)
    assert not isinstance(resumed, str) and resumed.session_id == given and resumed.args == ["--resume", given]
    assert "not a conversation id" in str(launch.plan(["-r", "nope"], "/w", env))
    assert "-p runs without a terminal" in str(launch.plan(["-p", "hi"], "/w", env))
    assert "no conversation to continue" in str(launch.plan(["-c"], "/w", env))
    latest = conversation_file(tmp_path / "cfg", "/w", given)
    latest.parent.mkdir(parents=True)
    latest.write_text("{}\n")
    cont = launch.plan(["-c"], "/w", env)
    assert not isinstance(cont, str) and cont.args == ["--resume", given]
    cmd = launch.command("claude", cont, tmp_path / "mcp.json", "hook")
    settings = json.loads(cmd[cmd.index("--settings") + 1])
    assert settings["hooks"]["PermissionRequest"][0]["hooks"][0]["command"] == "hook"
    assert cmd[-1] == f"--mcp-config={tmp_path / 'mcp.json'}"
    assert launch.environment({"A": "1"}, tmp_path / "s", uuid.UUID(int=1), "tok")["DISABLE_AUTOUPDATER"] == "1"


def test_a_page_message_is_typed_as_a_prompt_never_as_a_shell_command_or_a_cli_command() -> None:
    from executor.terminals.held import as_prompt
    assert as_prompt("hello") == "hello"
    assert [as_prompt(t) for t in ("!rm -rf x", "/permissions", "# remember", "&bg", "  !x")] == [
        " !rm -rf x", " /permissions", " # remember", " &bg", "   !x"]
    assert as_prompt("a\x1b[2Jb") == "a[2Jb"  # no escape sequence reaches the terminal


def test_the_self_contained_hook_speaks_the_wire_s_frames() -> None:
    from shared import terminal_hook
    assert (terminal_hook.HELLO, terminal_hook.ANSWER) == (wire.HELLO, wire.ANSWER)
    assert terminal_hook._HEAD.pack(wire.DATA, 4) + b"keys" == wire.frame(wire.DATA, b"keys")


def test_frames_come_whole_across_reads_and_a_broken_peer_is_refused() -> None:
    data = wire.frame(wire.HELLO, {"op": "attach"}) + wire.frame(wire.DATA, b"keys")
    frames = wire.Frames()
    assert frames.feed(data[:3]) == []
    assert frames.feed(data[3:]) == [(wire.HELLO, b'{"op": "attach"}'), (wire.DATA, b"keys")]
    with pytest.raises(ValueError):
        wire.Frames().feed(b"Z\x00\x00\x00\x01x")
    assert wire.pointer({"XDG_STATE_HOME": "/s"}) == Path("/s/petal-dispatch/terminals.sock")


@pytest.mark.parametrize(("reads", "sent", "detached"), [
    ([b"\x1c", b"d"], b"", True),  # the two keys in two reads
    ([b"\x1cd"], b"", True),  # in one read (typed fast, a loaded machine)
    ([b"ls\x1c", b"d"], b"ls", True),  # what came before them still goes to the session
    ([b"\x1c", b"x"], b"\x1cx", False),  # Ctrl-\ then another key: both go on
    ([b"\x1c\x1c", b"q"], b"\x1c\x1cq", False),
    ([b"d"], b"d", False),
])
def test_ctrl_backslash_then_d_detaches_in_one_read_or_two_and_other_keys_go_on(
        reads: list[bytes], sent: bytes, detached: bool) -> None:
    out, held, detach = b"", False, False
    for data in reads:
        part, detach, held = wire.detach_keys(data, held)
        out += part
        if detach:
            break
    assert (out, detach, held) == (sent, detached, False)


class _Writer:
    """What the serving code uses of a connection's writer."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


async def test_a_sandboxed_sessions_hook_socket_serves_a_few_connections_at_once_and_closes_more_as_they_come() -> None:
    # a process in the sandbox can connect to the hook socket as often as it likes: each held connection is a
    # descriptor of the executor's
    release, serving = asyncio.Event(), []

    async def serve(reader: Any, writer: Any) -> None:
        serving.append(writer)
        await release.wait()

    served = boxed.limited(serve, most=4)
    writers = [_Writer() for _ in range(10)]
    held = [asyncio.ensure_future(served(cast(Any, None), cast(Any, w))) for w in writers]
    await until(lambda: len(serving) == 4 and sum(w.closed for w in writers) == 6, "four served, six closed", 5)
    release.set()
    await asyncio.gather(*held)
    late = _Writer()
    await served(cast(Any, None), cast(Any, late))  # room again once they ended
    assert not late.closed and len(serving) == 5


async def test_a_connection_that_says_nothing_is_given_up_on() -> None:
    silent = asyncio.StreamReader()  # never fed: a connection held open without a word
    assert await server.hello_frames(silent, wire.Frames(), timeout_s=0.05) == []
    said = asyncio.StreamReader()
    said.feed_data(wire.frame(wire.HELLO, b'{"op": "permission"}'))
    assert [kind for kind, _ in await server.hello_frames(said, wire.Frames(), timeout_s=5)] == [wire.HELLO]


def test_a_flood_of_whole_screen_repaints_is_fed_a_tick_at_a_time_and_ends_where_feeding_it_whole_ends() -> None:
    # DECALN fills the screen: milliseconds each at 50×200, and a process in a sandboxed session writes what it likes
    flood = b"\x1b#8" * 300 + "\x1b[H● done\r\n".encode()
    s = Screen(24, 80)
    started = time.monotonic()
    assert s.feed(flood) is False and s.pending > 0  # not all in: the loop goes on to other work
    assert time.monotonic() - started < 0.5
    looks = 1
    while not s.drain():
        looks += 1
    assert looks > 10 and s.pending == 0
    whole = Screen(24, 80)
    whole.stream.feed(flood)  # the same bytes at once, as before: the same screen
    assert s.lines() == [line.rstrip() for line in whole.screen.display] and s.lines()[0].startswith("● done")
