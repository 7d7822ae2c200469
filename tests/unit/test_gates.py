"""The gate classifier: tool calls, path resolution, and the property that a benign prefix hides nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from executor import gates
from tests.unit.test_gates_corpus import CASES, HOME, WORKDIR

TOOL_CORPUS = Path(__file__).parent.parent / "data" / "gate_corpus_tools.jsonl"


def test_each_tool_call_in_the_corpus_gets_its_category() -> None:
    calls = [json.loads(line) for line in TOOL_CORPUS.read_text().splitlines() if line.strip()]
    wrong = [(c["tool"], c["input"], gates.classify(c["tool"], c["input"], WORKDIR, HOME).category, c["expect"])
             for c in calls]
    assert [w for w in wrong if w[2] != w[3]] == []


def test_a_symlink_inside_the_tree_that_points_out_of_it_is_outside(tmp_path: Path) -> None:
    tree, elsewhere = tmp_path / "tree", tmp_path / "elsewhere"
    tree.mkdir()
    elsewhere.mkdir()
    (tree / "out").symlink_to(elsewhere)
    (tree / "sub").mkdir()
    assert gates.classify("Write", {"file_path": str(tree / "out" / "x")}, tree, tmp_path).category == "outside_tree"
    assert gates.classify("Bash", {"command": "echo hi > out/x"}, tree, tmp_path).category == "outside_tree"
    assert gates.classify("Bash", {"command": "cd sub && echo > ../out/x"}, tree, tmp_path).category == "outside_tree"
    assert gates.classify("Bash", {"command": "echo hi > sub/x"}, tree, tmp_path).category == "allowed"


def test_a_workdir_reached_through_a_symlink_is_still_the_tree(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert gates.classify("Write", {"file_path": str(real / "a.py")}, tmp_path / "link", tmp_path).category == "allowed"
    assert gates.classify("Bash", {"command": f"touch {real}/b"}, tmp_path / "link", tmp_path).category == "allowed"


def test_a_home_inside_the_tree_keeps_tilde_paths_inside(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    assert gates.classify("Bash", {"command": "touch ~/x"}, tree, tmp_path / "home").category == "outside_tree"
    assert gates.classify("Bash", {"command": "touch ~/x"}, tree, tree / "home").category == "allowed"


def test_a_verdict_names_every_gate_it_tripped_most_severe_first() -> None:
    verdict = gates.classify("Bash", {"command": "git push && sudo rm -rf /srv/other"}, WORKDIR, HOME)
    assert verdict.category == "privilege_escalation" and verdict.gated
    assert [f.category for f in verdict.findings] == ["privilege_escalation", "destructive", "git_beyond_branch",
                                                      "outside_tree"]
    assert verdict.label == "privilege escalation"


def test_decisions_follow_the_thread_mode_and_standing_rules() -> None:
    allowed = gates.classify("Bash", {"command": "pytest"}, WORKDIR, HOME)
    gated = gates.classify("Bash", {"command": "pip install requests"}, WORKDIR, HOME)
    assert gates.decide(allowed, "autonomous") == "allow"
    assert gates.decide(gated, "autonomous") == "deny"
    assert gates.decide(gated, "interactive") == "ask"
    assert gates.decide(gated, "autonomous", standing_rule=True) == "allow"
    message = gates.deny_message(gated)
    assert "new dependency" in message and "pip install requests" in message


def test_the_classifier_reads_nothing_but_paths(tmp_path: Path) -> None:
    # a tree that does not exist is classified the same way: the verdict never depends on file contents
    missing = tmp_path / "missing"
    assert gates.classify("Bash", {"command": "cat ./x && rm -rf build"}, missing, tmp_path).category == "destructive"
    assert not os.path.exists(missing)


# ---- a benign prefix never hides a gated command ----------------------------------------------------------
GATED = [command for expected, command in CASES if expected != gates.ALLOWED]
BENIGN = ["true", "ls", "echo hi", "cd src", "cd .", "pwd", "LC_ALL=C", "git status", "pytest -q", ":"]
JOINERS = [" && ", "; ", " || ", "\n", " & "]


@settings(max_examples=400, deadline=None)
@given(command=st.sampled_from(GATED), prefix=st.sampled_from(BENIGN), joiner=st.sampled_from(JOINERS))
def test_a_benign_command_before_a_gated_one_never_makes_it_allowed(command: str, prefix: str, joiner: str) -> None:
    # `cd src && mv a ../a` really stays in the tree: a cd changes what a relative `..` means, not what hides
    assume(not (prefix.startswith("cd ") and ".." in command))
    assert gates.classify_command(prefix + joiner + command, WORKDIR, HOME).gated


@settings(max_examples=200, deadline=None)
@given(command=st.sampled_from(GATED), producer=st.sampled_from(["echo hi", "cat list.txt", "ls", "printf x"]))
def test_a_gated_command_at_the_end_of_a_pipe_stays_gated(command: str, producer: str) -> None:
    assert gates.classify_command(f"{producer} | {command}", WORKDIR, HOME).gated


@settings(max_examples=200, deadline=None)
@given(command=st.sampled_from(GATED), wrap=st.sampled_from(["( {} )", "{{ {}; }}", "if true; then {}; fi",
                                                            "for i in 1; do {}; done", "f() {{ {}; }}; f"]))
def test_a_gated_command_inside_a_compound_stays_gated(command: str, wrap: str) -> None:
    assert gates.classify_command(wrap.format(command), WORKDIR, HOME).gated


def test_a_standing_rule_covers_only_what_it_names() -> None:
    def covers(pattern: str, command: str) -> bool:
        return gates.rule_covers(pattern, "Bash", "Bash", {"command": command})

    assert covers("npm test", "npm test") and not covers("npm test", "npm test --watch")
    assert covers("npm test:*", "npm test --watch") and covers("npm test:*", "npm  test")
    assert not covers("npm test:*", "npm testing")
    assert not covers("npm test:*", "npm test && sudo ls")
    assert not covers("npm test:*", "npm test $(sudo ls)")
    assert not covers("npm test:*", "npm test > /etc/motd")
    assert not covers("npm test:*", "npm test; rm -rf /")
    assert not gates.rule_covers("npm test", "Bash", "Write", {"file_path": "npm test"})
    assert gates.rule_covers("/etc/motd", "Write", "Write", {"file_path": "/etc/motd", "content": "x"})


def test_the_permission_prompt_answer_has_the_shape_the_cli_accepts() -> None:
    call = {"command": "pip install requests"}
    assert json.loads(gates.permission_result("allow", call)) == {"behavior": "allow", "updatedInput": call}
    verdict = gates.classify("Bash", call, WORKDIR, HOME)
    denied = json.loads(gates.permission_result("deny", call, gates.deny_message(verdict)))
    assert denied["behavior"] == "deny" and "new dependency" in denied["message"]
    assert gates.summary("Bash", call) == "Bash: pip install requests"
    assert gates.summary("Write", {"file_path": "/etc/motd", "content": "x"}) == "Write: /etc/motd"


def _obfuscations(word: str) -> list[str]:
    """Ways to write the same command name that the shell reduces to the word itself."""
    forms = [f'"{word}"', f"'{word}'", "\\" + word, f"{word[0]}''{word[1:]}", f'{word[:1]}""{word[1:]}']
    if len(word) > 2:
        forms.append(f"{word[:2]}\\{word[2:]}")
    return forms


KEYWORDS = {"for", "if", "while", "until", "case", "function", "select", "time"}  # quoted, they are not keywords
PLAIN_GATED = [(expected, command) for expected, command in CASES
               if expected not in (gates.ALLOWED, gates.OPAQUE) and command.split(" ", 1)[0].isalpha()
               and command.split(" ", 1)[0] not in KEYWORDS]


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(PLAIN_GATED), form=st.integers(min_value=0, max_value=5),
       directory=st.sampled_from(["", "/usr/bin/", "/bin/", "/usr/local/bin/../bin/"]))
def test_quoting_or_a_path_on_the_command_name_does_not_change_its_gate(case: tuple[str, str], form: int,
                                                                      directory: str) -> None:
    expected, command = case
    name, _, rest = command.partition(" ")
    forms = _obfuscations(name)
    disguised = f"{directory}{forms[form % len(forms)]} {rest}".rstrip()
    assert gates.classify_command(disguised, WORKDIR, HOME).category == expected, disguised


LOOPBACK = ("http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000", "localhost:8000")


def test_a_state_changing_call_to_loopback_is_gated_like_any_host_and_a_read_is_not() -> None:
    """The ingress listens on loopback: a POST there can answer the user's questions, so it is a
    cross-service change like a POST anywhere; a GET stays allowed (issue 29)."""
    writes = ["curl -X POST {u}/api/asks/x/answer -d '{{}}'", "curl -XPOST {u}/api/chat", "curl -sd @a.json {u}/x",
              "curl --json '{{}}' {u}/api/chat", "curl -F a=@f {u}/x", "curl -T f {u}/x",
              "wget --post-data 'a=b' {u}/x", "wget --method=PUT {u}/x", "http POST {u}/api/chat text=hi",
              "http {u}/api/chat text=hi", "xh delete {u}/api/asks/x"]
    reads = ["curl -s {u}/api/asks", "curl -fsSL {u}/api/info", "wget -qO- {u}/api/threads",
             "http GET {u}/api/asks status==pending"]
    for url in LOOPBACK:
        for example in ("https://api.example.com", url):
            got = {c.format(u=example): gates.classify("Bash", {"command": c.format(u=example)}, WORKDIR, HOME).category
                   for c in writes}
            assert set(got.values()) == {"cross_service"}, got
        got = {c.format(u=url): gates.classify("Bash", {"command": c.format(u=url)}, WORKDIR, HOME).category
               for c in reads}
        assert set(got.values()) == {"allowed"}, got
