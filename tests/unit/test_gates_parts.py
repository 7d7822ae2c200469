"""The gate's parts one by one (executor/gates/): a verdict from findings, a command's name and arguments as the tables
see them, paths as the kernel would resolve them, the tools the gate knows, and what the permission path answers.
The corpus (test_gates_corpus.py) checks the whole; these say which part does what."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executor import gates
from executor.gates.matching import command_name, has_flag, positional
from executor.gates.paths import Paths
from executor.gates.tables import LABELS
from executor.gates.verdict import Finding, Verdict, verdict_of

pytestmark = pytest.mark.unit

WORKDIR, HOME = "/srv/app", "/home/dev"
PATHS = Paths(WORKDIR, HOME)


# ---- a verdict ---------------------------------------------------------------------------------------------

def test_no_finding_is_allowed_and_not_gated() -> None:
    verdict = verdict_of([])
    assert verdict == Verdict(gates.ALLOWED) and not verdict.gated and verdict.reason == ""


def test_repeated_findings_are_kept_once_most_severe_first_in_the_order_found() -> None:
    found = [Finding(gates.OUTSIDE_TREE, "writes /a"), Finding(gates.DESTRUCTIVE, "rm -rf x"),
             Finding(gates.OUTSIDE_TREE, "writes /b"), Finding(gates.DESTRUCTIVE, "rm -rf x"),
             Finding(gates.PRIVILEGE, "sudo")]
    verdict = verdict_of(found)
    assert verdict.category == gates.PRIVILEGE
    assert [f.reason for f in verdict.findings] == ["sudo", "rm -rf x", "writes /a", "writes /b"]


def test_a_verdicts_reason_names_only_the_findings_of_its_own_category() -> None:
    verdict = verdict_of([Finding(gates.OUTSIDE_TREE, "writes /a"), Finding(gates.OUTSIDE_TREE, "writes /b"),
                          Finding(gates.OPAQUE, "a computed name")])
    assert verdict.reason == "writes /a; writes /b" and verdict.label == "outside the project tree"


def test_every_category_has_a_label_people_read_and_an_unknown_one_shows_as_itself() -> None:
    assert set(LABELS) == gates.CATEGORIES and len(set(LABELS.values())) == len(LABELS)
    assert Verdict(gates.GIT_BEYOND_BRANCH).label == "git beyond the branch"
    assert Verdict("something_new").label == "something_new"


# ---- a command as the tables see it ------------------------------------------------------------------------

@pytest.mark.parametrize(("word", "name"), [
    ("/usr/bin/sudo", "sudo"), ("python3.11", "python"), ("python3", "python"), ("mkfs.ext4", "mkfs"),
    ("\\rm", "rm"), ("./build.sh", "build.sh"), ("my-tool", "my-tool"), ("bash", "bash"),
])
def test_a_command_name_is_reduced_to_the_one_the_tables_know(word: str, name: str) -> None:
    assert command_name(word) == name


def test_positional_arguments_skip_options_and_the_values_options_take() -> None:
    assert positional("kubectl", ["-n", "prod", "get", "pods", "--context=x", "-o", "yaml"]) == ["get", "pods"]
    # an option the table does not list as taking a value leaves the next word positional
    assert positional("kubectl", ["--all-namespaces", "delete", "pod"]) == ["delete", "pod"]
    assert positional("unknown-tool", ["-n", "prod"]) == ["prod"]
    assert positional("git", [None, "push"]) == [None, "push"]  # a computed word stays in its place


@pytest.mark.parametrize(("arg", "flags", "has"), [
    ("-rf", {"-r", "-f"}, True),  # a cluster of short flags
    ("-fv", {"-r"}, False),
    ("--force", {"--force"}, True),
    ("--force=yes", {"--force"}, True),
    ("--recursive-ish", {"-r"}, False),  # a long option is no cluster of letters
    ("-r", {"-r"}, True),
    ("r", {"-r"}, False),
])
def test_a_flag_is_found_alone_in_a_cluster_or_with_a_value(arg: str, flags: set[str], has: bool) -> None:
    assert has_flag(arg, frozenset(flags)) is has


# ---- paths --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("given", "expanded"), [
    ("~", HOME), ("~/x/y", f"{HOME}/x/y"), ("~root/.bashrc", "/root/.bashrc"), ("~bob/notes", "/home/bob/notes"),
    ("src/~x", "src/~x"), ("/abs", "/abs"),
])
def test_a_tilde_stands_for_this_home_or_another_accounts(given: str, expanded: str) -> None:
    assert PATHS.expand_tilde(given) == expanded


def test_inside_the_tree_is_the_tree_and_below_it_never_a_sibling_that_shares_its_prefix() -> None:
    assert PATHS.inside("/srv/app") and PATHS.inside("/srv/app/src/a.py")
    assert not PATHS.inside("/srv/application") and not PATHS.inside("/srv")


def test_dot_dot_is_folded_before_the_tree_is_asked(tmp_path: Path) -> None:
    paths = Paths(str(tmp_path), HOME)
    assert paths.resolve("src/../../x", str(tmp_path)) == str(tmp_path.parent / "x")
    assert not paths.inside(paths.resolve("src/../../x", str(tmp_path)))
    assert paths.inside(paths.resolve("src/../x", str(tmp_path)))


@pytest.mark.parametrize(("path", "secret"), [
    ("/srv/app/.env", True), ("/srv/app/.env.local", True), ("/srv/app/prod.env", True),
    ("/srv/app/.env.example", False), ("/home/dev/.ssh/id_ed25519.pub", False),  # a public key is no secret
    ("/home/dev/.ssh/config", True),  # anything under .ssh
    ("/home/dev/.aws/credentials", True), ("/srv/app/certs/server.pem", True), ("/srv/app/main.py", False),
    ("/home/dev/.bash_history", True), ("/proc/1/environ", True), ("/home/dev/.config/gh/hosts.yml", True),
    ("/etc/ssl/private/key", True), ("/srv/app/docs/secrets.md", True), ("/srv/app/secret_santa.py", False),
])
def test_a_secret_is_known_by_its_name_a_directory_on_its_way_or_its_whole_path(path: str, secret: bool) -> None:
    assert Paths.secret(path) is secret


@pytest.mark.parametrize(("path", "category"), [
    ("/dev/null", None), ("/dev/fd/3", None), ("/dev/sda", gates.DESTRUCTIVE), ("/dev/nvme0n1", gates.DESTRUCTIVE),
    ("/etc/motd", gates.OUTSIDE_TREE), ("/srv/app/.git/config", gates.GIT_BEYOND_BRANCH),
    ("/srv/app/sub/.git/hooks/pre-commit", gates.GIT_BEYOND_BRANCH), ("/srv/app/.claude/settings.json", gates.PRIVILEGE),
    ("/srv/app/.gitignore", None), ("/srv/app/.git", None),  # the .git file of a worktree is the tree's own
    ("/srv/app/src/a.py", None),
])
def test_where_a_write_lands_decides_its_gate(path: str, category: str | None) -> None:
    found = PATHS.write_findings(path, path, "Write")
    assert [f.category for f in found] == ([category] if category else [])


# ---- a tool call --------------------------------------------------------------------------------------------

def test_a_tool_the_gate_does_not_know_is_opaque_and_the_harnesss_own_tools_pass() -> None:
    unknown = gates.classify("mcp__other__delete_everything", {}, WORKDIR, HOME)
    assert unknown.category == gates.OPAQUE and "not known to the gate" in unknown.reason
    assert gates.classify("mcp__harness__dispatch_worker", {"brief": "rm -rf /"}, WORKDIR, HOME).category == \
        gates.ALLOWED
    assert gates.classify("WebFetch", {"url": "http://169.254.169.254/"}, WORKDIR, HOME).category == gates.ALLOWED


@pytest.mark.parametrize("tool_input", [{}, {"command": 3}, {"command": "ls\x00; sudo reboot"}, None])
def test_a_bash_call_without_a_readable_command_is_opaque(tool_input: dict[str, object] | None) -> None:
    assert gates.classify("Bash", tool_input, WORKDIR, HOME).category == gates.OPAQUE


def test_an_edit_without_a_path_is_opaque_and_a_read_without_one_is_allowed() -> None:
    assert gates.classify("Write", {"content": "x"}, WORKDIR, HOME).category == gates.OPAQUE
    assert gates.classify("Edit", {"file_path": ""}, WORKDIR, HOME).category == gates.OPAQUE
    assert gates.classify("Glob", {"pattern": "**/*.py"}, WORKDIR, HOME).category == gates.ALLOWED


def test_reading_a_secret_is_gated_anywhere_and_reading_outside_the_tree_is_not() -> None:
    assert gates.classify("Read", {"file_path": "~/.ssh/id_rsa"}, WORKDIR, HOME).category == gates.SECRETS
    assert gates.classify("Grep", {"path": "/srv/app/.env", "pattern": "KEY"}, WORKDIR, HOME).category == gates.SECRETS
    assert gates.classify("Read", {"file_path": "/etc/hostname"}, WORKDIR, HOME).category == gates.ALLOWED
    # writing a secret is a secrets gate, not merely a write outside the tree
    assert gates.classify("Write", {"file_path": "/etc/ssl/private/k"}, WORKDIR, HOME).category == gates.SECRETS


def test_a_relative_path_of_a_tool_is_taken_from_the_tree() -> None:
    assert gates.classify("Write", {"file_path": "src/a.py"}, WORKDIR, HOME).category == gates.ALLOWED
    assert gates.classify("Write", {"file_path": "../other/a.py"}, WORKDIR, HOME).category == gates.OUTSIDE_TREE


# ---- what the permission path does --------------------------------------------------------------------------

def test_a_gated_call_is_asked_about_or_refused_and_an_allowed_one_always_runs() -> None:
    allowed, gated = Verdict(gates.ALLOWED), Verdict(gates.DESTRUCTIVE, (Finding(gates.DESTRUCTIVE, "rm -rf x"),))
    for mode in ("interactive", "autonomous"):
        assert gates.decide(allowed, mode) == "allow"
        assert gates.decide(gated, mode, standing_rule=True) == "allow"
    assert (gates.decide(gated, "interactive"), gates.decide(gated, "autonomous")) == ("ask", "deny")


def test_the_refusal_the_model_reads_names_the_gate_the_reason_and_what_to_do() -> None:
    verdict = Verdict(gates.DESTRUCTIVE, (Finding(gates.DESTRUCTIVE, "rm -rf data"),))
    message = gates.deny_message(verdict, why="the user denied it")
    assert message.startswith("Refused at the hard gate 'destructive data op' (rm -rf data): the user denied it.")
    assert "do not retry" in message
    assert "()" not in gates.deny_message(Verdict(gates.OPAQUE))  # no reason: no empty brackets


def test_a_summary_shows_the_command_or_the_path_else_the_input_and_is_cut_to_its_limit() -> None:
    assert gates.summary("NotebookEdit", {"notebook_path": "n.ipynb"}) == "NotebookEdit: n.ipynb"
    assert gates.summary("mcp__x__y", {"b": 1, "a": "é"}) == 'mcp__x__y: {"a": "é", "b": 1}'
    assert gates.summary("Bash", None) == "Bash: {}"
    assert len(gates.summary("Bash", {"command": "x" * 1000}, limit=50)) == 50


def test_a_standing_rule_is_of_one_tool_and_a_prefix_rule_needs_words() -> None:
    assert not gates.rule_covers("ls:*", "Bash", "Bash", None)
    assert not gates.rule_covers(":*", "Bash", "Bash", {"command": "anything"})  # an empty prefix covers nothing
    assert not gates.rule_covers("src/a.py", "Write", "Edit", {"file_path": "src/a.py"})
    assert gates.rule_covers("n.ipynb", "NotebookEdit", "NotebookEdit", {"notebook_path": "n.ipynb"})
    assert not gates.rule_covers("ls", "Bash", "Bash", {"command": ["ls"]})
    assert gates.rule_covers("make test", "Bash", "Bash", {"command": "  make test  "})  # spaces around it


def test_a_refusal_without_a_message_still_tells_the_model_why() -> None:
    assert json.loads(gates.permission_result("deny", {"command": "x"})) == {
        "behavior": "deny", "message": "Refused at a hard gate."}
