"""A spawn's view of the CLI's config: its own copy of the state file, never the user's, and the login read-only;
a fork's source conversation (the user's, live in their terminal) copied in, never linked."""

from __future__ import annotations

import json
import os
from pathlib import Path

from executor.sandbox import cliconfig


def test_a_spawn_gets_a_copy_of_the_login_keys_of_the_state_file_and_the_login_read_only(tmp_path: Path) -> None:
    cfg, work = tmp_path / "cfg", tmp_path / "work"
    cfg.mkdir()
    (cfg / ".credentials.json").write_text("{}")
    (cfg / ".claude.json").write_text(json.dumps({
        "userID": "u", "oauthAccount": {"accountUuid": "a"}, "hasCompletedOnboarding": True, "numStartups": 9,
        "mcpServers": {"mine": {"command": "x"}}, "projects": {str(work): {"mcpServers": {"local": {}}}}}))
    view = cliconfig.config_view(cfg, work, None, "k1")
    copy = cliconfig.spawn_state(cfg, "k1")
    assert (cfg / ".claude.json", copy) in view.bound
    assert json.loads(copy.read_text()) == {"userID": "u", "oauthAccount": {"accountUuid": "a"},
                                            "hasCompletedOnboarding": True}
    assert cfg / ".credentials.json" in view.readonly and view.writable == ()
    # the CLI's state file elsewhere (HOME, without CLAUDE_CONFIG_DIR): the copy is shown there
    home_state = tmp_path / "home" / ".claude.json"
    home_state.parent.mkdir()
    home_state.write_text("not json")
    view = cliconfig.config_view(cfg, work, None, "k2", state_file=home_state)
    assert (home_state, cliconfig.spawn_state(cfg, "k2")) in view.bound
    assert json.loads(cliconfig.spawn_state(cfg, "k2").read_text()) == {}
    # after the spawn nothing of it is left
    cliconfig.keep_session(cfg, work, "no-such", "k1")
    cliconfig.forget_spawn(cfg, "k2")
    assert not copy.exists() and not cliconfig.spawn_state(cfg, "k2").exists()


def test_a_fork_gets_a_copy_of_the_conversation_it_forks_never_a_link_to_the_users_file(tmp_path: Path) -> None:
    cfg, work = tmp_path / "cfg", tmp_path / "work"
    cfg.mkdir()
    live = cliconfig.session_dir(cfg, work)
    live.mkdir(parents=True)
    source = live / "their-live-one.jsonl"
    source.write_text('{"type": "user"}\n')
    cliconfig.config_view(cfg, work, "the-fork", "k1", fork_from="their-live-one")
    seen = cliconfig.spawn_sessions(cfg, "k1") / source.name
    assert seen.read_text() == source.read_text() and seen.stat().st_ino != source.stat().st_ino
    with seen.open("a") as f:  # what a process in the sandbox can do to what it sees
        f.write('{"type": "user", "message": {"content": "injected"}}\n')
    assert source.read_text() == '{"type": "user"}\n'


def test_a_kept_side_directory_holds_only_directories_and_regular_files(tmp_path: Path) -> None:
    """A spawn fills its conversation's side directory (subagents, tool results) as it likes; kept, the user's own
    CLI resumes with it: a link to their key or a FIFO in it is removed, what it wrote as files stays."""
    cfg, work = tmp_path / "cfg", tmp_path / "work"
    side = cliconfig.spawn_sessions(cfg, "k1") / "the-session"
    (side / "tool-results").mkdir(parents=True)
    (side / "subagents").mkdir()
    (side / "tool-results" / "kept.txt").write_text("a tool's output")
    secret = tmp_path / "id_rsa"
    secret.write_text("the user's key")
    (side / "tool-results" / "toolu_1.txt").symlink_to(secret)
    (side / "tool-results" / "dir-link").symlink_to(tmp_path)
    os.mkfifo(side / "subagents" / "agent-1.jsonl")
    cliconfig.session_dir(cfg, work).mkdir(parents=True)  # made with the spawn's view (config_view)
    cliconfig.keep_session(cfg, work, "the-session", "k1")
    kept = cliconfig.session_dir(cfg, work) / "the-session"
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*")) == [
        "subagents", "tool-results", "tool-results/kept.txt"]
    assert secret.read_text() == "the user's key" and not cliconfig.spawn_sessions(cfg, "k1").exists()
    # a later turn of the conversation has the kept directory bound in, writable: what it plants there goes too
    (kept / "subagents" / "agent-2.jsonl").symlink_to(secret)
    cliconfig.keep_session(cfg, work, "the-session", "k2")
    assert sorted(p.name for p in (kept / "subagents").iterdir()) == []


def _mode_line(mode: str, **extra: str) -> bytes:
    return json.dumps({"type": "permission-mode", "permissionMode": mode, "sessionId": "s", **extra}).encode() + b"\n"


def test_after_a_spawn_a_conversation_whose_last_mode_does_not_ask_gets_the_clis_manual_mode_line(
        tmp_path: Path) -> None:
    """`claude --resume` restores the last `permission-mode` line, and a spawn can append one to its own
    conversation: after the spawn, a last mode that does not ask (however it was hidden) is followed by manual's."""
    cfg, work = tmp_path / "cfg", tmp_path / "work"
    real = cliconfig.session_dir(cfg, work)
    real.mkdir(parents=True)
    turn = b'{"type":"user","message":{"role":"user","content":"hi"}}\n'
    manual = b'{"type":"permission-mode","permissionMode":"default","sessionId":"s"}\n'
    cases = {
        "planted last": turn + _mode_line("acceptEdits"),
        "padded after": turn + _mode_line("auto") + turn * 60_000,  # past a read chunk (1 MiB)
        "one long line": turn + _mode_line("acceptEdits", pad="x" * 200_000),
        "across chunks": b"x" * ((1 << 20) - 20) + b"\n" + _mode_line("bypassPermissions"),
        "said in a message": _mode_line("default") + b'{"type":"user","message":{"content":"permission-mode"}}\n',
        "asking already": turn + _mode_line("auto") + _mode_line("default"),
        "plan": turn + _mode_line("plan"),
        "none": turn * 3,
    }
    for case, content in cases.items():
        path = real / "s.jsonl"
        path.write_bytes(content)
        cliconfig.keep_session(cfg, work, "s", "k")
        after = path.read_bytes()
        if case in ("asking already", "plan", "none"):
            assert after == content, case
        else:
            assert after == content + manual, case
