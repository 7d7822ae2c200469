"""The CLI's exit and stream facts → status, as pure functions (the rules of design.md, D-11)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from executor.run import stream, substrate


def _facts(*objs: dict[str, Any]) -> stream.TurnFacts:
    facts = stream.TurnFacts()
    for obj in objs:
        facts.feed(stream.classify(json.dumps(obj).encode()))
    return facts


OK = {"type": "result", "subtype": "success", "is_error": False, "result": "done", "terminal_reason": "completed"}
API_ERR = {"type": "result", "subtype": "success", "is_error": True, "terminal_reason": "api_error",
           "api_error_status": 500}
RETRY_429 = {"type": "system", "subtype": "api_retry", "attempt": 1, "error_status": 429, "error": "rate_limit"}
AUTH = {"type": "system", "subtype": "api_retry", "attempt": 1, "error_status": 401, "error": "authentication_failed"}
ABORTED = {"type": "result", "subtype": "error_during_execution", "is_error": True,
           "terminal_reason": "aborted_streaming", "errors": []}

INTERRUPTED = {"type": "user", "message": {"role": "user", "content": [
    {"type": "text", "text": "[Request interrupted by user for tool use]"}]}}
TOOL_DONE = {"type": "user", "message": {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "t", "content": "one"}]}}


@pytest.mark.parametrize(
    ("rc", "objs", "stop", "expected"),
    [
        (0, [OK], False, "success"),
        (1, [API_ERR], False, "failed"),
        (0, [API_ERR], False, "failed"),  # subtype "success" is not success
        (1, [RETRY_429, API_ERR], False, "rate_limited"),
        (0, [RETRY_429, OK], False, "success"),  # a 429 the CLI retried past is not a failure
        (1, [AUTH, API_ERR], False, "rate_limited"),
        (143, [], False, "cancelled"),
        (130, [], False, "cancelled"),
        (-signal.SIGTERM, [], False, "cancelled"),
        (0, [ABORTED], False, "cancelled"),  # SIGINT: rc 0 with an aborted result
        (137, [], False, "crashed"),
        (-signal.SIGKILL, [], False, "crashed"),
        (-signal.SIGSEGV, [], False, "crashed"),
        (-signal.SIGKILL, [], True, "cancelled"),  # a stop the harness sent, escalated
        (0, [], False, "failed"),  # exit 0 without a result line
        (1, [{"type": "result", "subtype": "error_max_turns", "is_error": False, "errors": []}], False, "failed"),
        (0, [{**OK, "permission_denials": [{"tool_name": "Write", "tool_use_id": "t", "tool_input": {}}]}], False,
         "gated"),
        # an error_ subtype is never success, whatever is_error says (it was false in 2.1.29)
        (0, [{"type": "result", "subtype": "error_during_execution", "is_error": False, "errors": []}], False, "failed"),
        (0, [{"type": "result", "subtype": "error_brand_new", "is_error": False}], False, "failed"),
        (0, [{"type": "result", "subtype": "error_max_budget_usd", "is_error": False, "errors": []}], False, "failed"),
        # a budget stop after a tool call completed: partial
        (0, [TOOL_DONE, {"type": "result", "subtype": "error_max_turns", "is_error": False, "errors": []}], False,
         "partial"),
        (1, [TOOL_DONE, {"type": "result", "subtype": "error_max_budget_usd", "is_error": True,
                         "terminal_reason": "budget_exhausted", "errors": []}], False, "partial"),
        # interrupted: the CLI's marker line, with or without (a race) its result line
        (0, [INTERRUPTED, {"type": "result", "subtype": "error_during_execution", "is_error": False}], False,
         "cancelled"),
        (0, [INTERRUPTED], False, "cancelled"),
        (0, [{**ABORTED, "is_error": False}], False, "cancelled"),
    ],
)
def test_status_follows_the_exit_and_what_the_stream_showed(rc: int, objs: list[dict[str, Any]], stop: bool,
                                                            expected: str) -> None:
    assert stream.derive_status(rc, _facts(*objs), stop_requested=stop).status == expected


def test_an_imported_transcript_without_a_result_line_is_crashed() -> None:
    assert stream.derive_status(None, _facts(), imported=True).status == "crashed"


@pytest.mark.parametrize(
    ("raw", "event_type"),
    [
        (b'{"type":"system","subtype":"init","session_id":"s"}', "stream.system.init"),
        (b'{"is_error":false,"type":"result","subtype":"success"}', "stream.result"),
        (b'{"type":"assistant","message":{}}', "stream.assistant"),
        (b'{"type":"brand_new_kind"}', "stream.brand_new_kind"),
        (b'{"type":"Weird Type!"}', "stream.other"),
        (b'{"type":"control_request","request_id":"r","request":{"subtype":"can_use_tool"}}', "stream.control_request"),
        (b'{"type":"control_response","response":{"subtype":"success","request_id":"r"}}', "stream.control_response"),
        (b'{"no_type": 1}', "stream.other"),
        (b"[1, 2]", "stream.unparsed"),
        (b"[SandboxDebug] hello", "stream.unparsed"),
        (b'{"truncated": ', "stream.unparsed"),
        (b'\xef\xbb\xbf{"type":"user"}', "stream.user"),
        # a type name is a whole name: a trailing newline would make an event type of its own
        (b'{"type":"user\\n"}', "stream.other"),
        (b'{"type":"system","subtype":"init\\n"}', "stream.system"),
    ],
)
def test_lines_are_typed_by_type_and_subtype_and_anything_else_is_kept_unparsed(raw: bytes, event_type: str) -> None:
    assert stream.classify(raw).event_type == event_type


def test_a_type_name_seen_again_is_typed_the_same_and_a_bad_one_stays_other() -> None:
    # the event type of a name is cached after its first line; the cache must not type a bad name later
    for _ in range(2):
        assert stream.classify(b'{"type":"assistant"}').event_type == "stream.assistant"
        assert stream.classify(b'{"type":"Assistant"}').event_type == "stream.other"
        assert stream.classify(b'{"type":"system","subtype":"compact_boundary"}').event_type == (
            "stream.system.compact_boundary")
        assert stream.classify(b'{"type":"system","subtype":7}').event_type == "stream.system"


def test_invalid_utf8_is_replaced_and_flagged_not_dropped() -> None:
    line = stream.classify(b"bad \xff\xfe bytes")
    assert line.event_type == "stream.unparsed"
    assert line.payload == {"line": "bad \ufffd\ufffd bytes", "invalid_utf8": True}


def test_the_command_line_names_the_session_and_never_carries_the_prompt(tmp_path: Path) -> None:
    cfg = substrate.SubstrateConfig(claude_bin="claude")
    spec = substrate.SpawnSpec(role="worker", prompt="--not-a-flag", session_uuid="u-1",
                               allowed_tools=("Bash", "Read"), mcp_config=tmp_path / "m.json")
    cmd = substrate.build_command(cfg, spec)
    assert cmd[:5] == ["claude", "-p", "--output-format", "stream-json", "--verbose"]
    assert cmd[cmd.index("--session-id") + 1] == "u-1"
    assert f"--mcp-config={tmp_path / 'm.json'}" in cmd and "--strict-mcp-config" in cmd
    # the prompt goes on stdin: another process reads argv in /proc/<pid>/cmdline
    assert "--not-a-flag" not in cmd
    assert "[petal-role: worker]" in cmd[cmd.index("--append-system-prompt") + 1]
    resumed = substrate.build_command(cfg, substrate.SpawnSpec(role="orchestrator", prompt="p", session_uuid="u-1",
                                                               resume=True))
    assert resumed[resumed.index("--resume") + 1] == "u-1" and "--session-id" not in resumed


def test_an_operators_extra_flags_come_before_the_gates_so_the_gates_win(tmp_path: Path) -> None:
    # the CLI takes the last of a repeated flag (observed on 2.1.328: `--permission-mode plan --permission-mode
    # default` runs in default), so a flag given before the harness's cannot weaken the gate
    weakening = ("--permission-mode", "bypassPermissions", "--settings", '{"permissions": {"allow": ["Bash"]}}')
    cfg = substrate.SubstrateConfig(claude_bin="claude", extra_args=weakening)
    spec = substrate.SpawnSpec(role="worker", prompt="p", session_uuid="u-1", mcp_config=tmp_path / "m.json",
                               extra_args=("--permission-mode", "acceptEdits"))
    cmd = substrate.build_command(cfg, spec)

    def last(flag: str) -> str:
        return cmd[len(cmd) - 1 - cmd[::-1].index(flag) + 1]

    assert last("--permission-mode") == "default"
    assert last("--settings") == substrate.permission_args(substrate.deny_rules(cfg))[-1]
    assert cmd.index("bypassPermissions") < cmd.index("--permission-prompt-tool")


def test_the_environment_passes_through_but_scrubs_stdout_logging_and_sets_the_knobs() -> None:
    cfg = substrate.SubstrateConfig(base_env={"ANTHROPIC_BASE_URL": "http://127.0.0.1:1", "ANTHROPIC_LOG": "debug"},
                                    max_retries=2, api_timeout_ms=5000)
    env = substrate.build_env(cfg, "task-1")
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:1" and "ANTHROPIC_LOG" not in env
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "2" and env["API_TIMEOUT_MS"] == "5000"
    assert env[substrate.TASK_ENV_VAR] == "task-1"


def test_the_harness_secrets_never_reach_a_child() -> None:
    cfg = substrate.SubstrateConfig(base_env={
        "PETAL_EXECUTOR_DSN": "postgresql://petal_executor@db/petal", "DATABASE_URL": "postgresql://admin@db/petal",
        "PGPASSWORD": "secret", "PETAL_NTFY_TOKEN": "tk", "PETAL_VAPID_PRIVATE_KEY": "key", "HOME": "/home/u",
        "ANTHROPIC_API_KEY": "sk-test"})
    env = substrate.build_env(cfg, "task-1")
    assert not [k for k in env if k.startswith(("PETAL_", "PG")) and k != substrate.TASK_ENV_VAR]
    assert "DATABASE_URL" not in env
    # what the CLI itself needs passes through
    assert env["HOME"] == "/home/u" and env["ANTHROPIC_API_KEY"] == "sk-test"


def test_the_clis_own_tools_are_denied_its_config_directory_and_proc_with_or_without_the_gate(
        tmp_path: Path) -> None:
    cfg = substrate.SubstrateConfig(claude_bin="claude", config_dir=tmp_path / "cfg")
    for mcp in (tmp_path / "m.json", None):
        cmd = substrate.build_command(cfg, substrate.SpawnSpec(role="worker", prompt="p", session_uuid="u",
                                                               mcp_config=mcp))
        settings = json.loads(cmd[len(cmd) - 1 - cmd[::-1].index("--settings") + 1])
        assert f"Read(/{tmp_path / 'cfg'}/**)" in settings["permissions"]["deny"]
        assert "Read(//proc/**)" in settings["permissions"]["deny"]
        assert "Edit(//proc/**)" in settings["permissions"]["deny"]


def test_a_working_directorys_own_settings_are_not_loaded() -> None:
    cmd = substrate.build_command(substrate.SubstrateConfig(claude_bin="claude"),
                                  substrate.SpawnSpec(role="worker", prompt="p", session_uuid="u"))
    assert cmd[cmd.index("--setting-sources") + 1] == "user"


def test_the_conversations_directory_of_a_long_working_directory_is_cut_and_hashed_as_the_cli_does() -> None:
    from executor.sandbox import cliconfig

    # observed: the pinned CLI kept a 264-character path's conversations in this directory
    deep = Path("/tmp/pytest-of-root/pytest-77/test_a_data_directory_with_a_l0/" + "a-long-directory-name-" * 6 + "/"
                + "and-another-one-" * 4 + "/work")
    got = cliconfig.session_dir(Path("/cfg"), deep).name
    assert len(got) == 207 and got.endswith("-ab5c1e") and got.startswith("-tmp-pytest-of-root-pytest-77-")
    assert cliconfig.session_dir(Path("/cfg"), Path("/srv/w")).name == "-srv-w"


def test_a_conversation_is_unchanged_for_a_warm_process_but_for_the_session_metadata_the_cli_appends(
        tmp_path: Path) -> None:
    # A process that resumed a conversation read it whole at its start; the CLI may append the session's own
    # metadata again afterwards (its permission mode, by the resuming process itself): still the same
    # conversation. A message, a replacement, a cut or a half-written line is not.
    cfg = substrate.SubstrateConfig(claude_bin="claude", config_dir=tmp_path / "cfg")
    session = "2cdf1b69-101f-4ae7-b118-c8e5c03f1d80"
    stored = tmp_path / "cfg" / "projects" / "-work" / f"{session}.jsonl"
    stored.parent.mkdir(parents=True)
    stored.write_text('{"type":"user","message":{"role":"user","content":"hi"}}\n')
    at_start = substrate.session_state(cfg, session)
    assert substrate.conversation_unchanged(cfg, session, at_start)
    with stored.open("a") as f:
        f.write(f'{{"type":"mode","mode":"normal","sessionId":"{session}"}}\n')
        f.write(f'{{"type":"atis-latch","atis":"","sessionId":"{session}"}}\n')
    assert substrate.session_state(cfg, session) != at_start
    assert substrate.conversation_unchanged(cfg, session, at_start)
    with stored.open("a") as f:
        f.write('{"type":"mode","mode":"normal"')  # still being written
    assert not substrate.conversation_unchanged(cfg, session, at_start)
    with stored.open("a") as f:
        f.write('}\n{"type":"user","message":{"role":"user","content":"another turn"}}\n')
    assert not substrate.conversation_unchanged(cfg, session, at_start)
    stored.write_text('{"type":"user","message":{"role":"user","content":"hi"}}\n')  # cut back: same size, same inode
    assert substrate.conversation_unchanged(cfg, session, at_start)
    replaced = stored.with_suffix(".new")
    replaced.write_text(stored.read_text())
    replaced.replace(stored)  # the same bytes under a new inode: not the file it read
    assert not substrate.conversation_unchanged(cfg, session, at_start)
    assert substrate.conversation_unchanged(cfg, "no-such-session", None)
    assert not substrate.conversation_unchanged(cfg, session, None)  # one came to be since


def test_a_spares_view_shows_no_conversation_until_one_is_linked_and_never_one_with_a_side_directory(
        tmp_path: Path) -> None:
    from executor.sandbox import cliconfig

    cfg, work = tmp_path / "cfg", tmp_path / "work"
    real = cliconfig.session_dir(cfg, work)
    real.mkdir(parents=True)
    (real / "plain.jsonl").write_text("{}\n")
    (real / "sided.jsonl").write_text("{}\n")
    (real / "sided").mkdir()
    view = cliconfig.config_view(cfg, work, None, "spare1")
    private = cliconfig.spawn_sessions(cfg, "spare1")
    assert view.bound[0] == (real, private) and list(private.iterdir()) == []  # a spare's: no conversation yet
    assert not cliconfig.link_conversation(cfg, work, "sided", "spare1")  # its side directory needs a mount
    assert not cliconfig.link_conversation(cfg, work, "unknown", "spare1")  # nothing stored to go on with
    assert list(private.iterdir()) == []
    assert cliconfig.link_conversation(cfg, work, "plain", "spare1")
    # the same file (a hard link): the CLI inside appends to the stored conversation
    assert [p.name for p in private.iterdir()] == ["plain.jsonl"]
    assert (private / "plain.jsonl").stat().st_ino == (real / "plain.jsonl").stat().st_ino


def test_the_config_state_changes_when_a_mounted_config_file_is_replaced_not_when_it_is_written_in_place(
        tmp_path: Path) -> None:
    import os

    from executor.sandbox import cliconfig

    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / ".credentials.json").write_text("{}")
    before = cliconfig.config_state(cfg)
    (cfg / ".credentials.json").write_text('{"refreshed": 1}')  # in place: a mount shows it
    assert cliconfig.config_state(cfg) == before
    (cfg / "new.json").write_text('{"login": 2}')
    os.replace(cfg / "new.json", cfg / ".credentials.json")  # a new file: a mount made before shows the old one
    assert cliconfig.config_state(cfg) != before
    again = cliconfig.config_state(cfg)
    (cfg / "settings.json").write_text("{}")  # a file every spawn obeys, made since
    assert cliconfig.config_state(cfg) != again
