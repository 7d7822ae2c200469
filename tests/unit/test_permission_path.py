"""The permission path's pure parts: spawn flags, the approval card, the worker's end and gate decisions."""

from __future__ import annotations

import json
from pathlib import Path

from executor import gates
from executor.harness import permission
from executor.run import stream, substrate
from executor.settle import policy


def test_a_spawn_with_the_harness_goes_through_the_gate_and_pre_allows_no_way_around_it(tmp_path: Path) -> None:
    spec = substrate.SpawnSpec(role="worker", prompt="p", session_uuid="u-1", mcp_config=tmp_path / "m.json",
                               allowed_tools=("Bash", "Read", "Write", "Bash(git status:*)", "Edit", "Glob"))
    cmd = substrate.build_command(substrate.SubstrateConfig(claude_bin="claude"), spec)
    assert cmd[cmd.index("--permission-prompt-tool") + 1] == "mcp__harness__permission_prompt"
    assert cmd[cmd.index("--permission-mode") + 1] == "default"
    assert cmd[cmd.index("--allowedTools") + 1] == "Read,Glob"
    settings = json.loads(cmd[cmd.index("--settings") + 1])
    # every call of a gated tool, and reads of the paths the gate calls secret (never Read as a whole)
    asked = settings["permissions"]["ask"]
    assert {"Bash", "Write", "Edit", "MultiEdit", "NotebookEdit"} <= set(asked) and "Read" not in asked
    assert {"Read(//**/.env)", "Read(//**/.ssh/**)", "Read(//**/*.pem)"} <= set(asked)
    assert set(asked) - set(substrate.GATED_TOOLS) == set(substrate.READ_ASK_RULES)
    assert "hooks" not in settings  # no hook to fail open or be switched off by a project's settings
    assert settings["sandbox"]["autoAllowBashIfSandboxed"] is False
    # without the harness there is no tool to ask: the flags would leave the CLI waiting on nothing
    bare = substrate.build_command(substrate.SubstrateConfig(claude_bin="claude"),
                                   substrate.SpawnSpec(role="extractor", prompt="p", session_uuid="u-2"))
    assert "--permission-prompt-tool" not in bare


def test_a_gate_the_harness_recorded_makes_a_clean_run_gated() -> None:
    facts = stream.TurnFacts()
    facts.feed(stream.classify(b'{"type":"result","subtype":"success","is_error":false,"result":"ok"}'))
    assert stream.derive_status(0, facts).status == "success"
    assert stream.derive_status(0, facts, gate_denials=1) == stream.Outcome("gated", "gate_decisions")
    assert stream.derive_status(-9, facts, gate_denials=1).status == "crashed"  # a crash stays a crash


def test_the_card_shows_the_exact_call_names_the_gate_and_offers_the_four_answers() -> None:
    verdict = gates.classify("Bash", {"command": "rm -rf data"}, "/srv/app", "/home/dev")
    card = permission.approval_question("Bash", {"command": "rm -rf data"}, verdict, "worker", True)
    assert "destructive data op" in card["question"] and "rm -rf data" in card["question"]
    assert [o["label"] for o in card["options"]] == ["Allow once", "Allow for this task",
                                                     "Always allow in this thread", "Deny"]
    assert "```sh\nrm -rf data\n```" in card["options"][0]["preview"]
    assert len(card["header"]) <= 12
    alone = permission.approval_question("Bash", {"command": "rm -rf data"}, verdict, "worker", False)
    assert "Always allow in this thread" not in [o["label"] for o in alone["options"]]
    # a command ending in ':*' would be read back as a prefix rule: it is offered once only
    prefixed = permission.approval_question("Bash", {"command": "rm -rf data #:*"}, verdict, "worker", True)
    assert [o["label"] for o in prefixed["options"]] == ["Allow once", "Deny"]


def test_a_standing_allow_made_from_a_call_covers_that_call_and_nothing_more() -> None:
    for command in ("npm install lodash", "git push origin HEAD", "rm -rf data"):
        pattern, _ = gates.standing_pattern("Bash", {"command": command})
        assert pattern is not None and gates.rule_covers(pattern, "Bash", "Bash", {"command": command})
        assert not gates.rule_covers(pattern, "Bash", "Bash", {"command": command + " evil"})
    for command, wider in (("npm install lodash #:*", "npm install lodash evil-pkg"),
                           ("git push origin HEAD:*", "git push origin HEAD --force"),
                           ("sudo env #:*", "sudo env rm -rf /")):
        pattern, why = gates.standing_pattern("Bash", {"command": command})
        assert pattern is None and "prefix" in why
        assert gates.rule_covers(command, "Bash", "Bash", {"command": wider})  # what it would have let through
    # a path rule covers a call only when every path it names is the rule's
    pattern, _ = gates.standing_pattern("Write", {"file_path": "/srv/app/a.txt"})
    assert pattern == "/srv/app/a.txt"
    assert gates.rule_covers(pattern, "Write", "Write", {"file_path": "/srv/app/a.txt"})
    assert not gates.rule_covers(pattern, "Write", "Write", {"file_path": "/srv/app/a.txt", "path": "/etc/passwd"})


def test_an_edit_is_previewed_as_a_diff_and_a_fence_inside_the_content_cannot_close_it() -> None:
    diff = permission.preview("Edit", {"file_path": "/etc/app.conf", "old_string": "a = 1",
                                              "new_string": "a = 2"})
    assert "-a = 1" in diff and "+a = 2" in diff and diff.startswith("`/etc/app.conf`")
    tricky = permission.preview("Write", {"file_path": "x.md", "content": "```\nnot the end\n```"})
    assert tricky.count("````") == 2


def test_gate_decisions_list_every_gate_the_harness_decided_and_the_cli_s_own_denials_once() -> None:
    decided = [{"category": "destructive", "label": "destructive data op", "reason": "rm -rf data", "tool": "Bash",
                "tool_use_id": "t1", "summary": "Bash: rm -rf data", "decision": "deny",
                "decided_by": "autonomous_policy"},
               {"category": "dependency", "label": "new dependency", "reason": "pip install", "tool": "Bash",
                "tool_use_id": "t2", "summary": "Bash: pip install x", "decision": "allow", "decided_by": "user"}]
    denials = [{"tool_name": "Bash", "tool_use_id": "t1", "tool_input": {"command": "rm -rf data"}},
               {"tool_name": "Write", "tool_use_id": "t3", "tool_input": {"file_path": "/etc/motd"}}]
    out = policy.gate_decisions(denials, "/srv/app", decided)
    assert [(g["category"], g["tool"], g["decision"], g["decided_by"]) for g in out] == [
        ("destructive", "Bash", "deny", "autonomous_policy"), ("dependency", "Bash", "allow", "user"),
        ("outside_tree", "Write", "deny", "cli")]
    assert out[0]["chosen"].startswith("stay in scope") and out[1]["chosen"].startswith("run it")
    assert out[2]["gate"] == "outside the project tree"


def test_a_gate_card_is_notified_as_a_question_that_names_a_tool_call() -> None:
    from executor.notify import notes
    from executor.notify.store import Candidate

    verdict = gates.classify("Bash", {"command": "sudo true"}, "/srv/app", "/home/dev")
    card = permission.approval_question("Bash", {"command": "sudo true"}, verdict, "worker", True)
    note = notes.note_for(Candidate(event_type="question.asked", task_id=None, session_id=None, seq=7,
                                    payload={"questions": [card], "asked_by": "harness",
                                             "tool_use_id": "gate-toolu_1", "question_id": "q"}))
    assert note is not None and note.kind == "question" and note.title == "Approve a tool call?"
    assert "sudo true" in note.body
