"""The CLI conversation file parser: facts for the index, messages for the journal, read in pieces."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from executor.sessions import parse
from shared import threads

pytestmark = pytest.mark.unit

SID = "58c3ea21-5768-4492-b01b-2e8c1659fe1f"


def _line(kind: str, content: object, at: str, **extra: object) -> bytes:
    return json.dumps({"type": kind, "message": {"role": kind, "content": content}, "timestamp": at,
                       "uuid": f"u-{at}", "cwd": "/w/app", "gitBranch": "main", "sessionId": SID,
                       "isSidechain": False, **extra}).encode() + b"\n"


# the shapes observed on CLI 2.1.328 (docs/claude-cli.md "Stored conversations"), the noise between included
FILE = b"".join([
    b'{"type":"queue-operation","operation":"enqueue","timestamp":"2026-12-01T18:48:21.859Z","content":"x"}\n',
    _line("user", "<command-name>/clear</command-name>", "2026-12-01T18:48:21.900Z"),
    _line("user", "Fix the login\r\nbug   please", "2026-12-01T18:48:21.939Z"),
    b'{"type":"attachment","attachment":{"type":"environment"},"cwd":"/w/app","timestamp":"2026-12-01T18:48:21.938Z"}\n',
    _line("assistant", [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "Looking."}],
          "2026-12-01T18:48:22.125Z"),
    _line("assistant", [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}], "2026-12-01T18:48:22.200Z"),
    _line("user", [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}], "2026-12-01T18:48:22.300Z"),
    _line("user", "a note", "2026-12-01T18:48:22.400Z", isMeta=True),
    _line("user", "side", "2026-12-01T18:48:22.500Z", isSidechain=True),
    _line("assistant", "Done.", "2026-12-01T18:48:23.438Z", gitBranch="fix-login"),
    b'{"type":"cost-state","totalCostUSD":0}\n',
])


def test_a_file_gives_its_title_directory_branch_activity_and_words_only() -> None:
    scan, messages = parse.read(FILE, SID)
    assert scan.unreadable is None
    assert scan.title == "Fix the login bug please"  # whitespace folded; a command line is no title
    assert (scan.cwd, scan.git_branch) == ("/w/app", "fix-login")
    assert scan.last_activity == datetime(2026, 12, 1, 18, 48, 23, 438000, tzinfo=UTC)
    # tool calls, tool results, the CLI's notes and a sub-agent's lines are not messages
    assert [(m.role, m.text) for m in messages] == [
        ("user", "<command-name>/clear</command-name>"), ("user", "Fix the login\r\nbug   please"),
        ("assistant", "Looking."), ("assistant", "Done.")]
    assert scan.message_count == 4 and scan.parsed_to == len(FILE)
    assert messages[-1].end == FILE.index(b'{"type":"cost-state"')


def test_fed_in_pieces_it_waits_for_a_line_to_be_complete() -> None:
    whole, expected = parse.read(FILE, SID)
    scan, got = parse.Scan(SID), []
    cut = FILE.index(b"Looking") + 3  # inside a line the CLI is still writing
    got += scan.feed(FILE[:cut], 0)
    assert scan.parsed_to < cut and scan.message_count == 2
    got += scan.feed(FILE[scan.parsed_to:], scan.parsed_to)
    assert got == expected and (scan.title, scan.message_count, scan.parsed_to) == (whole.title, 4, len(FILE))


@pytest.mark.parametrize(("data", "reason"), [
    (FILE + b"{not json\n", "line 12 is not JSON"),
    (b'["a list"]\n' + FILE, "line 1 is not a JSON object"),
])
def test_a_line_that_does_not_parse_makes_the_file_unreadable_and_yields_nothing(data: bytes, reason: str) -> None:
    scan, messages = parse.read(data, SID)
    assert scan.unreadable is not None and scan.unreadable.startswith(reason), scan.unreadable
    assert messages == [] and scan.feed(FILE, 0) == []  # it stays so: never imported in part


def test_an_older_summary_line_titles_a_conversation_with_no_prompt_yet() -> None:
    scan, _ = parse.read(b'{"type":"summary","summary":"Login refactor","leafUuid":"x"}\n', SID)
    assert (scan.title, scan.summary, scan.message_count) == (None, "Login refactor", 0)


def test_messages_inside_the_threads_own_turns_are_not_imported_again() -> None:
    t0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    def msg(seconds: float) -> parse.Message:
        return parse.Message("user", str(seconds), None, t0 + timedelta(seconds=seconds), 0)
    messages = [msg(-30), msg(-0.2), msg(5), msg(10), msg(10.3), msg(40), parse.Message("user", "undated", None, None, 0)]
    windows = [(t0, t0 + timedelta(seconds=10)), (t0 + timedelta(seconds=35), None)]  # the last still runs
    # a line a fraction before the claim is the turn's (a clock step); one just after its end is a terminal's
    assert [m.text for m in parse.outside_turns(messages, windows)] == ["-30", "10.3", "undated"]


def test_the_command_that_continues_a_conversation_quotes_its_directory() -> None:
    flags = """--setting-sources user --strict-mcp-config '--mcp-config={"mcpServers":{}}' --permission-mode manual"""
    assert threads.resume_command("/w/my app", None, SID) == f"cd '/w/my app' && claude --resume {SID} {flags}"
    assert threads.resume_command(str(Path("/w/a")), "/srv/claude cfg", SID) == (
        f"cd /w/a && CLAUDE_CONFIG_DIR='/srv/claude cfg' claude --resume {SID} {flags}")


def test_a_registered_process_counts_only_while_that_very_process_lives(tmp_path: Path) -> None:
    from executor.sessions import live

    me = os.getpid()
    ticks = Path(f"/proc/{me}/stat").read_text().rsplit(")", 1)[1].split()[19]
    (tmp_path / "sessions").mkdir()
    for pid, session, start in ((me, "held", ticks), (me, "reused-pid", str(int(ticks) + 1)),
                                (2**22 + 7, "gone", "1")):
        (tmp_path / "sessions" / f"{pid}-{session}.json").write_text(
            json.dumps({"pid": pid, "sessionId": session, "procStart": start}))
    (tmp_path / "sessions" / "junk.json").write_text("{")
    assert live.registered(tmp_path) == {"held": me}


def test_the_index_reads_only_what_a_file_gained_and_rereads_a_replaced_one(tmp_path: Path) -> None:
    from executor.sessions.index import Index

    conv = tmp_path / "cfg" / "projects" / "-w-app" / f"{SID}.jsonl"
    conv.parent.mkdir(parents=True)
    conv.write_bytes(FILE)
    index = Index(None, "exec", (tmp_path / "cfg",), (Path("/w"),), tmp_path / "home" / ".claude")  # type: ignore[arg-type]  # no store here
    read: list[int] = []
    plain = index._read

    def counted(f: Any, size: int) -> None:
        read.append(size - f.scan.parsed_to)
        plain(f, size)
    index._read = counted  # type: ignore[method-assign]  # counting what each pass reads
    changed, gone = index._look()
    assert [f.scan.session_id for f in changed] == [SID] and not gone and read == [len(FILE)]
    assert index.grown == {SID} and index.row(changed[0])["message_count"] == 4
    index.grown.clear()
    assert index._look() == ([], []) and read == [len(FILE)]  # unchanged: a stat, nothing read
    more = _line("user", "one more thing", "2026-12-01T19:00:00.000Z")
    with conv.open("ab") as fh:
        fh.write(more)
    changed, _ = index._look()
    assert read[-1] == len(more) and index.grown == {SID}  # only the appended line
    assert changed[0].scan.message_count == 5 and changed[0].scan.last_activity == datetime(2026, 12, 1, 19, tzinfo=UTC)
    # replaced by a shorter file (a rewrite): read again from the start, not appended to
    conv.write_bytes(FILE[:FILE.index(b'{"type":"attachment"')])
    changed, _ = index._look()
    assert changed[0].scan.message_count == 2 and read[-1] == conv.stat().st_size
    conv.unlink()
    assert index._look()[1] and index.by_session(SID) is None


def test_the_hand_back_names_the_cli_a_terminal_would_not_find_by_its_path(tmp_path: Path) -> None:
    """Pasted in a terminal, the command runs the executor's CLI: `claude` when that is the one on PATH, else
    the executor's own by its path (the pinned install, with no `claude` on PATH)."""
    from executor.run import substrate

    bin_dir, pinned = tmp_path / "bin", tmp_path / "cache" / "claude"
    bin_dir.mkdir()
    pinned.parent.mkdir()
    pinned.write_text("#!/bin/sh\n")
    pinned.chmod(0o755)
    config = substrate.SubstrateConfig(claude_bin=str(pinned), base_env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    assert substrate.handback_cli(config) == str(pinned)
    assert f"&& {pinned} --resume {SID} " in substrate.resume_command(config, tmp_path, SID)
    (bin_dir / "claude").symlink_to(pinned)  # the same CLI on PATH: a terminal finds it by name
    assert substrate.handback_cli(config) == "claude"
    other = tmp_path / "other"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    (bin_dir / "claude").unlink()
    (bin_dir / "claude").symlink_to(other)  # another `claude` on PATH: the executor's own, by its path
    assert substrate.handback_cli(config) == str(pinned)
