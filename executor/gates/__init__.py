"""Hard gates: which worker tool calls a human must approve (or, in an autonomous thread, are refused).

This package's door: the rest of the executor imports the gates from here. `classify(tool_name, tool_input,
workdir, home)` → a `Verdict`: `allowed` or one of the seed's gate categories. It is pure (no I/O besides
resolving paths: `..`, `~` and symlinks; a file's content is never read) and table-driven: the tables in
tables.py are the rules. Shell commands are parsed with bashlex and every simple command is looked at
wherever it sits and through wrappers (shell.py). What cannot be read — a parse failure, a command name or a
write target computed at run time — is gated as `opaque`. Scripts run by an interpreter (`python x.py`,
`./build.sh`, `make`) are not read: the gate covers the calls the model makes, not the programs those calls
start. docs/gates.md states these choices; tests/data/gate_corpus.tsv holds the examples.

The room: verdict.py (Finding, Verdict), paths.py (path resolution), matching.py (a command against the
tables), walker.py (the shell walker's grammar: constructs, words, redirects), git.py (what git runs and writes:
GitWalker), shell.py (what each command does, built on GitWalker), classify.py (a tool call → its verdict),
decide.py (allow/ask/deny, a standing rule's reach, the permission prompt tool's answer), tables.py (the rules, as
data), rules.py (the standing-rules queue), store.py (its rows and the permission path's reads:
executor/sql/gates.sql).
"""

from executor.gates.classify import classify, classify_command
from executor.gates.decide import (
    Decision,
    Mode,
    decide,
    deny_message,
    permission_result,
    rule_covers,
    standing_pattern,
    summary,
)
from executor.gates.tables import (
    ALLOWED,
    CATEGORIES,
    CROSS_SERVICE,
    DEPENDENCY,
    DESTRUCTIVE,
    GIT_BEYOND_BRANCH,
    NETWORK_CONFIG,
    OPAQUE,
    OUTSIDE_TREE,
    PATH_KEYS,
    PRIVILEGE,
    SECRET_DIRS,
    SECRET_NAMES,
    SECRET_PATHS,
    SECRETS,
)
from executor.gates.verdict import Finding, Verdict
from executor.gates.store import GateRule, GateStore, GateWorkdir, NewRule
from executor.gates.rules import CARD_PREFIX, run_rule_queue  # last: the standing-rules queue sits on the journal, not on the above

__all__ = [
    # a call's verdict
    "classify", "classify_command", "Verdict", "Finding",
    # what happens to it
    "Mode", "Decision", "decide", "deny_message", "rule_covers", "standing_pattern", "summary", "permission_result", "CARD_PREFIX",
    # standing rules asked for from the page: the executor's loop over their queue; the rules' and the
    # permission path's rows (gates.sql)
    "run_rule_queue", "GateStore", "GateRule", "GateWorkdir", "NewRule",
    # the categories (a verdict's label names its category as people read it), most severe first
    "ALLOWED", "CATEGORIES", "PRIVILEGE", "SECRETS", "DESTRUCTIVE", "GIT_BEYOND_BRANCH",
    "CROSS_SERVICE", "NETWORK_CONFIG", "DEPENDENCY", "OUTSIDE_TREE", "OPAQUE",
    # the paths the tables name: the tools' path keys; the secret paths (the sandbox hides them too)
    "PATH_KEYS", "SECRET_NAMES", "SECRET_DIRS", "SECRET_PATHS",
]
