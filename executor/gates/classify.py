"""Hard gates: which worker tool calls a human must approve (or, in an autonomous thread, are refused).

`classify(tool_name, tool_input, workdir, home)` → a `Verdict`: `allowed` or one of the seed's gate
categories. It is pure (no I/O besides resolving paths: `..`, `~` and symlinks) and table-driven: the
tables in executor/gates/tables.py are the rules. Shell commands are parsed with bashlex and every simple
command is looked at wherever it sits (`&&`, `;`, `|`, subshells, `$(…)`, backticks, functions, loops,
heredocs fed to a shell) and through wrappers (`sudo`, `env`, `nohup`, `time`, `timeout`, `xargs`,
`bash -c`, `eval`, `find -exec` …). What cannot be read — a parse failure, a command name or a write
target computed at run time — is gated as `opaque`. Scripts run by an interpreter (`python x.py`,
`./build.sh`, `make`) are not read: the gate covers the calls the model makes, not the programs those
calls start.
README.md ("Gates") states these choices; tests/data/gate_corpus.tsv holds the examples.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import bashlex

# the categories are re-exported: callers name them as gates.SECRETS, gates.CATEGORIES …
from executor.gates.tables import (  # noqa: F401
    AGENT_CONFIG_DIR,
    ALLOWED,
    ANY_COMMAND,
    CATEGORIES,
    COMMANDS,
    CROSS_SERVICE,
    DEPENDENCY,
    DESTRUCTIVE,
    DEVICES,
    FREE_TOOL_PREFIXES,
    GIT_BEYOND_BRANCH,
    GIT_COMMAND_KEYS,
    GIT_DIR,
    GIT_RULES,
    HARMLESS_WRITES,
    IN_PLACE,
    INTERPRETERS,
    LABELS,
    NETWORK_CONFIG,
    NOT_SECRET_NAMES,
    OPAQUE,
    OPTION_VALUES,
    OUTPUT_OPTIONS,
    OUTSIDE_TREE,
    PATH_KEYS,
    PRIVILEGE,
    RUNS_COMMANDS,
    SECRET_DIRS,
    SECRET_NAMES,
    SECRET_PATHS,
    SECRET_VARIABLE,
    SECRETS,
    SEVERITY,
    SHELL_STRING_OPTION,
    SHELLS,
    TOOLS,
    WRAPPER_SKIP_FIRST,
    WRAPPERS,
    WRAPPERS_GATE,
    WRITERS,
    CommandRule,
)

MAX_DEPTH = 8  # nested bash -c / eval / $(…) levels read before the rest counts as opaque


# ---- verdicts ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Finding:
    category: str
    reason: str  # what tripped it, e.g. "sudo", "writes /etc/motd"


@dataclass(frozen=True)
class Verdict:
    category: str  # ALLOWED or the most severe finding's category
    findings: tuple[Finding, ...] = ()

    @property
    def gated(self) -> bool:
        return self.category != ALLOWED

    @property
    def label(self) -> str:
        return LABELS.get(self.category, self.category)

    @property
    def reason(self) -> str:
        return "; ".join(f.reason for f in self.findings if f.category == self.category)


def _verdict(findings: list[Finding]) -> Verdict:
    if not findings:
        return Verdict(ALLOWED)
    seen: dict[tuple[str, str], Finding] = {}
    for f in findings:
        seen.setdefault((f.category, f.reason), f)
    ordered = sorted(seen.values(), key=lambda f: SEVERITY.index(f.category))
    return Verdict(ordered[0].category, tuple(ordered))


def classify(tool_name: str, tool_input: dict[str, Any] | None, workdir: str | os.PathLike[str],
             home: str | os.PathLike[str]) -> Verdict:
    """The gate a tool call falls in, or `allowed`. `workdir` is the task's tree; `home` expands `~`."""
    tool_input = tool_input if isinstance(tool_input, dict) else {}
    paths = _Paths(os.path.realpath(workdir), os.path.realpath(home))
    kind = TOOLS.get(tool_name) or ("free" if tool_name.startswith(FREE_TOOL_PREFIXES) else None)
    if kind is None:
        return _verdict([Finding(OPAQUE, f"the tool {tool_name} is not known to the gate")])
    if kind == "free":
        return Verdict(ALLOWED)
    if kind == "shell":
        command = tool_input.get("command")
        if not isinstance(command, str) or "\x00" in command:  # a NUL cuts the string where bash reads it
            return _verdict([Finding(OPAQUE, "a Bash call without a readable command string")])
        return classify_command(command, workdir, home)
    findings: list[Finding] = []
    if kind == "edit" and not any(isinstance(tool_input.get(k), str) and tool_input.get(k) for k in PATH_KEYS):
        findings.append(Finding(OPAQUE, f"{tool_name} without a path"))
    for key in PATH_KEYS:
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            resolved = paths.resolve(value, paths.root)
            if paths.secret(resolved):
                findings.append(Finding(SECRETS, f"{tool_name} {value}"))
            elif kind == "edit":
                findings += paths.write_findings(value, resolved, tool_name)
    return _verdict(findings)


def classify_command(command: str, workdir: str | os.PathLike[str], home: str | os.PathLike[str]) -> Verdict:
    """The gate a shell command falls in, or `allowed`."""
    shell = _Shell(_Paths(os.path.realpath(workdir), os.path.realpath(home)))
    shell.script(command, 0)
    return _verdict(shell.findings)


# ---- paths ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Paths:
    root: str
    home: str

    def expand_tilde(self, path: str) -> str:
        if path == "~" or path.startswith("~/"):
            return self.home + path[1:]
        if path.startswith("~"):  # ~user: another account's home, outside the tree either way
            user, _, rest = path[1:].partition("/")
            return os.path.join("/root" if user == "root" else f"/home/{user}", rest)
        return path

    def resolve(self, path: str, cwd: str) -> str:
        # realpath follows the symlinks that exist and folds "..": a link inside the tree that points out
        # of it resolves outside.
        return os.path.realpath(os.path.join(cwd, self.expand_tilde(path)))

    def inside(self, resolved: str) -> bool:
        return resolved == self.root or resolved.startswith(self.root.rstrip("/") + "/")

    @staticmethod
    def secret(resolved: str) -> bool:
        name = os.path.basename(resolved)
        if any(fnmatch.fnmatchcase(name, p) for p in NOT_SECRET_NAMES):
            return False
        if any(fnmatch.fnmatchcase(name, p) for p in SECRET_NAMES):
            return True
        parts = resolved.split("/")
        return any(d in parts for d in SECRET_DIRS) or any(fnmatch.fnmatchcase(resolved, p) for p in SECRET_PATHS)

    def write_findings(self, shown: str, resolved: str, what: str) -> list[Finding]:
        if any(fnmatch.fnmatchcase(resolved, p) for p in HARMLESS_WRITES):
            return []
        if any(fnmatch.fnmatchcase(resolved, p) for p in DEVICES):
            return [Finding(DESTRUCTIVE, f"{what} writes the device {shown}")]
        if not self.inside(resolved):
            return [Finding(OUTSIDE_TREE, f"{what} writes {shown}")]
        relative = os.path.relpath(resolved, self.root)
        if GIT_DIR in relative.split("/")[:-1]:
            return [Finding(GIT_BEYOND_BRANCH, f"{what} writes {relative}")]
        if AGENT_CONFIG_DIR in relative.split("/")[:-1]:
            return [Finding(PRIVILEGE, f"{what} writes {relative} (the CLI's own permissions and hooks)")]
        return []


# ---- the shell walker -------------------------------------------------------------------------------------
_PARAM = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])")
_PATHLIKE = re.compile(r"^(/|~|\.\.?(/|$))|/")
_TIME_KEYWORD = re.compile(r"(^|[;&|({!]\s*|\n\s*)time(?=\s)")
_UNREADABLE = "\x00unreadable"  # stdin text (a here-string) known only at run time
_EXPANDS = re.compile(r"[*?]|\[[^\]]+\]|\{[^}]*,[^}]*\}")
UNKNOWN = None  # a word whose value is only known at run time


@dataclass
class _Shell:
    paths: _Paths
    findings: list[Finding] = field(default_factory=list)
    cwd: str | None = None  # None: changed to a place known only at run time
    env: dict[str, str | None] = field(default_factory=dict)
    ifs_changed: bool = False

    def __post_init__(self) -> None:
        self.cwd = self.paths.root
        self.env = {"HOME": self.paths.home, "PWD": self.paths.root}

    def add(self, category: str, reason: str) -> None:
        self.findings.append(Finding(category, reason))

    def script(self, text: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            self.add(OPAQUE, "commands nested too deep to read")
            return
        if not text.strip():
            return
        try:
            trees = bashlex.parse(text)
        except NotImplementedError as exc:
            if "time command" not in str(exc):
                self.add(OPAQUE, f"the shell parser cannot read it ({type(exc).__name__})")
                return
            # bashlex lacks the `time` keyword; `\time` is the same command as a plain word, which it reads
            rewritten = _TIME_KEYWORD.sub(r"\1\\time", text)
            if rewritten == text:
                self.add(OPAQUE, "the shell parser cannot read a `time` here")
            else:
                self.script(rewritten, depth)
            return
        except Exception as exc:  # bashlex raises ParsingError, NotImplementedError (case, $((…)), [[ …]]) …
            self.add(OPAQUE, f"the shell parser cannot read it ({type(exc).__name__})")
            return
        for tree in trees:
            self.node(tree, depth)

    # -- nodes
    def node(self, n: Any, depth: int, stdin_from: list[str] | None = None) -> None:
        kind = n.kind
        if kind == "command":
            self.command(n, depth, stdin_from)
        elif kind == "pipeline":
            upstream: list[str] = []
            for part in n.parts:
                if part.kind in ("pipe", "reservedword"):
                    continue
                self.node(part, depth, upstream)
                first = [w.word for w in part.parts if w.kind == "word"][:1] if part.kind == "command" else []
                upstream = upstream + (first or ["(compound)"])
        elif kind == "list":
            for part in n.parts:
                if part.kind != "operator":
                    self.node(part, depth)
        elif kind == "compound":
            subshell = bool(n.list) and getattr(n.list[0], "word", None) == "("
            saved = (self.cwd, dict(self.env))
            for part in n.list:
                self.node(part, depth)
            if subshell:
                self.cwd, self.env = saved[0], saved[1]
            for r in getattr(n, "redirects", []) or []:
                self.redirect(r, depth)
        elif kind == "for":
            self.for_loop(n, depth)
        elif kind in ("if", "while", "until", "function"):
            for part in n.parts:
                if part.kind not in ("reservedword", "word"):
                    self.node(part, depth)
                elif part.kind == "word" and kind != "function":
                    self.word(part, depth)
        elif kind in ("reservedword", "operator", "pipe"):
            return
        else:
            self.add(OPAQUE, f"an unexpected shell construct ({kind})")

    def for_loop(self, n: Any, depth: int) -> None:
        parts = list(n.parts)
        var = parts[1].word if len(parts) > 1 and parts[1].kind == "word" else None
        items: list[str | None] = []
        body = [p for p in parts if p.kind not in ("reservedword", "word")]
        if len(parts) > 2 and getattr(parts[2], "word", None) == "in":
            for p in parts[3:]:
                if p.kind == "word":
                    items.append(self.word(p, depth))
                elif getattr(p, "word", None) in (";", "do", "\n"):
                    break
        for value in (items[:16] or [UNKNOWN]):  # bind the variable to each item in turn
            if var:
                self.env[var] = value
            for b in body:
                self.node(b, depth)

    def word(self, w: Any, depth: int) -> str | None:
        """A word's value with the variables we know substituted; walks its $(…) / `…` / <(…) commands."""
        value: str | None = w.word
        has_param = False
        for part in getattr(w, "parts", []) or []:
            if part.kind in ("commandsubstitution", "processsubstitution"):
                saved = (self.cwd, dict(self.env))
                self.node(part.command, depth + 1)
                self.cwd, self.env = saved
                value = UNKNOWN
            elif part.kind == "parameter":
                has_param = True
                name = re.match(r"[A-Za-z_][A-Za-z0-9_]*", part.value or "")
                if name and SECRET_VARIABLE.search(name.group(0)):
                    self.add(SECRETS, f"reads ${name.group(0)}")
        if value is not UNKNOWN and has_param:
            value = None if self.ifs_changed else self.substitute(value)
        if value is not UNKNOWN and value.startswith("~"):
            value = self.paths.expand_tilde(value)
        return value

    def substitute(self, text: str) -> str | None:
        unknown = False

        def one(m: re.Match[str]) -> str:
            nonlocal unknown
            name, rest = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), "")
            value = self.cwd if name == "PWD" else self.env.get(name)
            if rest and not rest.startswith((":-", "-")):  # ${X/a/b}, ${X#p}, ${X:=v} …: not followed
                unknown = True
                return ""
            if value is None and rest:
                return rest.split("-", 1)[1]
            if value is None:
                unknown = True
                return ""
            return value
        result = _PARAM.sub(one, text)
        return None if unknown else result

    def redirect(self, r: Any, depth: int) -> None:
        target = r.output if not isinstance(r.output, int) else None
        heredoc = getattr(r, "heredoc", None)
        if target is None or r.type in (">&", "<&") and target.word.isdigit():
            return
        if r.type in ("<<", "<<-", "<<<") or heredoc is not None:  # data, not a file (a here-string's
            self.word(target, depth)                                 # $(…) still runs)
            return
        self.path(self.word(target, depth), target.word, depth, write=r.type != "<", what="redirect")

    def path(self, value: str | None, shown: str, depth: int, *, write: bool, what: str) -> None:
        if value is UNKNOWN or (self.cwd is None and not value.startswith("/")):
            if write:
                self.add(OPAQUE, f"{what} writes a path known only at run time ({shown})")
            return
        if "://" in value:
            return
        resolved = self.paths.resolve(value, self.cwd or "/")
        if self.paths.secret(resolved):
            self.add(SECRETS, f"{what} touches {shown}")
        elif write:
            self.findings.extend(self.paths.write_findings(shown, resolved, what))

    # -- simple commands
    def command(self, n: Any, depth: int, upstream: list[str] | None) -> None:
        words: list[str | None] = []
        shown: list[str] = []
        heredoc: str | None = None
        for part in n.parts:
            if part.kind == "word":
                value = self.word(part, depth)
                if value is not None and any(p.kind == "parameter" for p in getattr(part, "parts", []) or []):
                    # an unquoted expansion is split into words: C="sudo ls"; $C runs sudo
                    split = value.split() or [""]
                    words += split
                    shown += [part.word] * len(split)
                else:
                    words.append(value)
                    shown.append(part.word)
            elif part.kind == "assignment":
                name = part.word.partition("=")[0]
                val = self.word(part, depth)
                if not any(p.kind == "word" for p in n.parts):  # X=… alone sets the shell's variable
                    self.env[name] = None if val is None else val.partition("=")[2]
                    if name == "IFS":  # word splitting is no longer what we assume: expansions are unknown
                        self.ifs_changed = True
            elif part.kind == "redirect":
                self.redirect(part, depth)
                if getattr(part, "heredoc", None) is not None:
                    heredoc = part.heredoc.value.rsplit("\n", 1)[0] if "\n" in part.heredoc.value else ""
                elif part.type == "<<<" and not isinstance(part.output, int):
                    heredoc = self.word(part.output, depth)
                    heredoc = _UNREADABLE if heredoc is UNKNOWN else heredoc
        if words:
            self.argv(words, shown, depth, upstream or [], heredoc)

    def argv(self, words: list[str | None], shown: list[str], depth: int, upstream: list[str],
             heredoc: str | None = None) -> None:
        if not words:
            return
        first = words[0]
        if first is UNKNOWN:
            self.add(OPAQUE, f"the command name is computed at run time ({shown[0]})")
            return
        if _EXPANDS.search(first):  # {sudo,ls} or /usr/bin/su?o: the name the shell runs is not this word
            self.add(OPAQUE, f"the command name is expanded at run time ({shown[0]})")
            return
        name = _name(first)
        args = words[1:]
        args_shown = shown[1:]
        joined = " ".join(a if a is not None else "$?" for a in args)
        reason = " ".join(shown)[:120]

        for rule in (*COMMANDS.get(name, ()), *ANY_COMMAND):
            if _matches(rule, name, args, joined):
                self.add(rule.category, reason)
        if name in WRAPPERS:
            self.wrapper(name, args, args_shown, depth, upstream, reason)
            return
        if name in SHELLS:
            self.shell(name, args, depth, upstream, heredoc, reason)
            return
        if name in INTERPRETERS and heredoc is not None and (heredoc == _UNREADABLE
                                                            or re.search(RUNS_COMMANDS, heredoc)):
            self.add(OPAQUE, f"{name} code that starts programs ({reason})")
        if name in ("source", ".") and args and args[0] is UNKNOWN:
            self.add(OPAQUE, f"runs code known only at run time ({reason})")
        if name == "eval":
            if any(a is UNKNOWN for a in args):
                self.add(OPAQUE, f"eval of a value known only at run time ({reason})")
            else:
                self.script(" ".join(a for a in args if a is not None), depth + 1)
            return
        if name == "git":
            self.git(args, args_shown, depth, reason)
            return
        option = SHELL_STRING_OPTION.get(name, "trap" if name == "trap" else None)
        at = -1 if name == "trap" else (args.index(option) if option in args else None)
        if option is not None and at is not None and at + 1 < len(args):
            code = args[at + 1]
            if code is UNKNOWN:
                self.add(OPAQUE, f"runs a shell string known only at run time ({reason})")
            else:
                self.script(code, depth + 1)
        if name in ("cd", "pushd", "popd"):
            self.cd(name, args, depth)
            return
        if name == "alias":  # the snapshot shell may expand aliases: read what each one would run
            for a in args:
                if a is not None and "=" in a:
                    self.script(a.partition("=")[2], depth + 1)
            return
        if name in ("read", "mapfile", "readarray", "getopts"):  # they set variables to what they read
            for a in args:
                if a is not None and not a.startswith("-") and re.fullmatch(r"[A-Za-z_]\w*", a):
                    self.env[a] = UNKNOWN
        if name == "printf" and "-v" in args and args.index("-v") + 1 < len(args):
            target = args[args.index("-v") + 1]
            if target is not None:
                self.env[target] = UNKNOWN
        if name in ("export", "declare", "typeset", "local", "readonly"):
            for a in args:
                if a is not None and "=" in a and not a.startswith("-"):
                    key, _, val = a.partition("=")
                    self.env[key] = val
                    self.ifs_changed = self.ifs_changed or key == "IFS"
            if name != "export":
                return
        if name == "find":
            self.find(args, args_shown, depth)
        if name == "env" and not any(a is not None and not a.startswith("-") and "=" not in a for a in args):
            self.add(SECRETS, "env prints the environment")
        self.arguments(name, args, args_shown, depth)

    def arguments(self, name: str, args: list[str | None], shown: list[str], depth: int) -> None:
        mode = WRITERS.get(name)
        in_place = IN_PLACE.get(name)
        if in_place and any(a is not None and a.startswith(in_place) for a in args):
            mode = "all"
        positional = [(a, s) for a, s in zip(args, shown) if a is None or not a.startswith("-")]
        written: set[int] = set()
        if mode == "all":
            written = set(range(len(positional)))
        elif mode == "last" and positional:
            written = {len(positional) - 1}
        for i, (a, s) in enumerate(positional):
            if i in written:
                self.path(a, s, depth, write=True, what=name)
            elif a is not None and (_PATHLIKE.search(a) or _Paths.secret(a)):
                self.path(a, s, depth, write=False, what=name)
        # option values: -t DIR for cp-likes, -o FILE, --output=FILE, -C DIR for tar …
        for i, a in enumerate(args):
            if a is None:
                continue
            opt, eq, val = a.partition("=")
            if eq and opt.startswith("-"):
                self.path(val, shown[i], depth, write=opt in OUTPUT_OPTIONS | {"--target-directory", "of"}, what=name)
            elif a.startswith("of=") and name == "dd":
                self.path(a[3:], shown[i], depth, write=True, what=name)
            elif (a in OUTPUT_OPTIONS or (a == "-t" and mode)) and i + 1 < len(args):
                self.path(args[i + 1], shown[i + 1], depth, write=True, what=name)

    def wrapper(self, name: str, args: list[str | None], shown: list[str], depth: int, upstream: list[str],
                reason: str) -> None:
        if name in WRAPPERS_GATE:
            self.add(WRAPPERS_GATE[name], reason)
        takes_value = WRAPPERS[name]
        i = 0
        skipped_first = name not in WRAPPER_SKIP_FIRST
        while i < len(args):
            a = args[i]
            if a is None:
                break
            if a == "--":
                i += 1
                break
            if name == "env" and "=" in a and not a.startswith("-"):
                i += 1
                continue
            if name == "env" and a.startswith(("-S", "--split-string")):
                split_string = (a[2:] if a.startswith("-S") and len(a) > 2
                                else args[i + 1] if i + 1 < len(args) else "")
                if split_string is UNKNOWN:
                    self.add(OPAQUE, f"env -S of a value known only at run time ({reason})")
                else:
                    self.script(split_string, depth + 1)
                return
            if name == "env" and a in ("-C", "--chdir") and i + 1 < len(args):
                self.cd("cd", args[i + 1:i + 2], depth)
            if a.startswith("-") and a != "-":
                i += 2 if a in takes_value else 1
                continue
            if not skipped_first:
                skipped_first = True
                i += 1
                continue
            break
        rest, rest_shown = args[i:], shown[i:]
        if name in ("xargs", "parallel") and rest:  # the arguments it adds come from stdin
            rest, rest_shown = [*rest, UNKNOWN], [*rest_shown, "(from stdin)"]
        if name == "watch" and rest:
            if any(r is UNKNOWN for r in rest):
                self.add(OPAQUE, f"watch of a command known only at run time ({reason})")
            else:
                self.script(" ".join(r for r in rest if r is not None), depth + 1)
            return
        if name == "command" and args and args[0] in ("-v", "-V"):
            return
        if rest:
            self.argv(rest, rest_shown, depth, upstream)
        elif name == "env":
            self.add(SECRETS, "env prints the environment")

    def shell(self, name: str, args: list[str | None], depth: int, upstream: list[str], heredoc: str | None,
              reason: str) -> None:
        skip_next = False
        for i, a in enumerate(args):
            if a is None:
                self.add(OPAQUE, f"a shell runs something known only at run time ({reason})")
                return
            if a in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
                skip_next = True
                continue
            if skip_next:
                skip_next = False
                continue
            if a.startswith("-") and not a.startswith("--") and "c" in a[1:]:
                code = args[i + 1] if i + 1 < len(args) else UNKNOWN
                if code is UNKNOWN:
                    self.add(OPAQUE, f"a shell runs something known only at run time ({reason})")
                else:
                    self.script(code, depth + 1)
                return
            if not a.startswith("-"):
                self.path(a, a, depth, write=False, what=name)  # a script file: not read, only its path
                return
        if heredoc == _UNREADABLE:
            self.add(OPAQUE, f"a shell runs a here-string known only at run time ({reason})")
        elif heredoc is not None:
            self.script(heredoc, depth + 1)
        elif any(_name(u) in ("curl", "wget", "fetch") for u in upstream):
            self.add(DEPENDENCY, f"runs downloaded code ({reason})")
        elif upstream:
            self.add(OPAQUE, f"a shell runs what a pipe feeds it ({reason})")

    def git(self, args: list[str | None], shown: list[str], depth: int, reason: str) -> None:
        i = 0
        while i < len(args):  # global options before the subcommand
            a = args[i]
            if a in ("-C", "--git-dir", "--work-tree") and i + 1 < len(args):
                self.path(args[i + 1], shown[i + 1], depth, write=True, what="git")
                i += 2
            elif a == "-c" and i + 1 < len(args):
                self.git_config(args[i + 1], depth, reason)
                i += 2
            elif a is not None and a.startswith(("--git-dir=", "--work-tree=")):
                self.path(a.partition("=")[2], shown[i], depth, write=True, what="git")
                i += 1
            elif a is not None and a.startswith("-"):
                i += 1
            else:
                break
        if i >= len(args):
            return
        sub, rest = args[i], args[i + 1:]
        if sub is UNKNOWN:
            self.add(OPAQUE, f"a git subcommand known only at run time ({reason})")
            return
        flags = {a for a in rest if a is not None and a.startswith("-")}
        positional = [a for a in rest if a is None or not a.startswith("-")]
        category = GIT_RULES.get(sub)
        if callable(category):
            category = category(flags, positional)
        if category:
            self.add(category, reason)
        if sub == "config" and len(positional) >= 2 and positional[0] is not None:
            self.git_config(f"{positional[0]}={positional[1]}", depth, reason, stored=True)
        if sub == "clone" and len(positional) >= 2:
            self.path(positional[1], positional[1] or "?", depth, write=True, what="git clone")
        elif sub == "config" and flags & {"--global", "--system"}:
            self.add(OUTSIDE_TREE, reason)
        else:
            for a, s in zip(rest, shown[i + 1:]):
                if a is not None and not a.startswith("-") and _PATHLIKE.search(a) and ":" not in a:
                    self.path(a, s, depth, write=False, what="git")

    def git_config(self, setting: str | None, depth: int, reason: str, *, stored: bool = False) -> None:
        """`git -c key=value` (this call) / `git config key value` (stored): some keys make git run commands."""
        if setting is UNKNOWN:
            self.add(OPAQUE, f"a git setting known only at run time ({reason})")
            return
        key, _, value = setting.partition("=")
        if key.lower().startswith("alias.") and value.startswith("!"):
            self.script(value[1:], depth + 1)
        if GIT_COMMAND_KEYS.match(key):
            self.add(GIT_BEYOND_BRANCH if stored else OPAQUE, f"git setting {key} ({reason})")

    def cd(self, name: str, args: list[str | None], depth: int) -> None:
        targets = [a for a in args if a is None or not a.startswith("-")]
        if name == "popd" or (targets and targets[0] in ("-",)):
            self.cwd = None
            return
        target = targets[0] if targets else self.paths.home
        if target is UNKNOWN:
            self.cwd = None
            return
        if self.cwd is None and not target.startswith("/"):
            return
        self.cwd = self.paths.resolve(target, self.cwd or "/")
        self.env["PWD"] = self.cwd

    def find(self, args: list[str | None], shown: list[str], depth: int) -> None:
        # {} stands for a file found under the first start path, so `find / -exec rm {} ;` writes outside
        start = next((a for a in args if a is None or not a.startswith(("-", "(", "!"))), ".")
        found = UNKNOWN if start is UNKNOWN else os.path.join(start, "found")
        i = 0
        while i < len(args):
            if args[i] in ("-exec", "-execdir", "-ok", "-okdir"):
                end = next((j for j in range(i + 1, len(args)) if args[j] in (";", "+", "\\;")), len(args))
                inner = [a if a != "{}" else found for a in args[i + 1:end]]
                self.argv(inner, [s for s in shown[i + 1:end]], depth + 1, [])
                i = end + 1
            else:
                i += 1


def _name(word: str) -> str:
    """A command's name as the table knows it: /usr/bin/sudo → sudo, python3.11 → python, mkfs.ext4 → mkfs."""
    name = word.rsplit("/", 1)[-1].lstrip("\\")
    if name in COMMANDS or name in WRAPPERS or name in SHELLS or name in WRITERS:
        return name
    base = re.sub(r"[\d.]+$", "", name)
    if base and base in COMMANDS:
        return base
    head = name.split(".", 1)[0]
    return head if head in COMMANDS else name


def _positional(name: str, args: list[str | None]) -> list[str | None]:
    """The arguments that are not options nor an option's value (`kubectl -n prod get` → [get])."""
    takes_value = OPTION_VALUES.get(name, frozenset())
    positional: list[str | None] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a is not None and a.startswith("-"):
            skip = a in takes_value
        else:
            positional.append(a)
    return positional


def _matches(rule: CommandRule, name: str, args: list[str | None], joined: str) -> bool:
    positional = _positional(name, args)
    if rule.subcommands is not None and not any(p in rule.subcommands for p in positional[:3]):
        return False
    if rule.except_subcommands and positional and positional[0] in rule.except_subcommands:
        return False
    if rule.except_subcommands and not positional and not args:
        return False
    if rule.flags is not None and not any(_has_flag(a, rule.flags) for a in args if a is not None):
        return False
    if rule.args_pattern is not None and not rule.args_pattern.search(joined):
        return False
    return True


def _has_flag(arg: str, flags: frozenset[str]) -> bool:
    if arg in flags or arg.partition("=")[0] in flags:
        return True
    if arg.startswith("-") and not arg.startswith("--") and len(arg) > 2:  # a cluster: -rf
        return any(f"-{c}" in flags for c in arg[1:])
    return False


# ---- decisions --------------------------------------------------------------------------------------------
Mode = Literal["interactive", "autonomous"]
Decision = Literal["allow", "deny", "ask"]


def decide(verdict: Verdict, mode: Mode, *, standing_rule: bool = False) -> Decision:
    """What the permission path does with a classified call: allowed calls and calls a standing rule covers
    run; a gated call is asked about in an interactive thread and refused in an autonomous one."""
    if not verdict.gated or standing_rule:
        return "allow"
    return "ask" if mode == "interactive" else "deny"


def deny_message(verdict: Verdict, *, why: str | None = None) -> str:
    """The text the model reads when a gated call is refused."""
    detail = f" ({verdict.reason})" if verdict.reason else ""
    reason = why or "this thread runs autonomously, and such calls need a person's approval"
    return (f"Refused at the hard gate '{verdict.label}'{detail}: {reason}. Stay within the task's scope: do "
            "not retry this call or work around it; finish what you can and say in your report what needs "
            "approval.")


def rule_covers(pattern: str, rule_tool: str, tool_name: str, tool_input: dict[str, Any] | None) -> bool:
    """Whether a standing rule (gate_rules row) covers a call. A Bash rule is the exact command, or a prefix
    ending in ':*' that covers only one simple command starting with those words — so `npm test:*` never
    covers `npm test && sudo …` or `npm test $(…)`. Other tools' rules are the exact path."""
    if rule_tool != tool_name or not isinstance(tool_input, dict):
        return False
    if tool_name != "Bash":
        return any(tool_input.get(k) == pattern for k in PATH_KEYS)
    command = tool_input.get("command")
    if not isinstance(command, str):
        return False
    if not pattern.endswith(":*"):
        return command.strip() == pattern.strip()
    words = _simple_words(command)
    prefix = _simple_words(pattern[:-2])
    return words is not None and bool(prefix) and words[:len(prefix or [])] == prefix


def _simple_words(command: str) -> list[str] | None:
    """The words of a single simple command with nothing expanded or redirected, else None."""
    try:
        trees = bashlex.parse(command)
    except Exception:
        return None
    if len(trees) != 1 or trees[0].kind != "command":
        return None
    parts = trees[0].parts
    if any(p.kind != "word" or getattr(p, "parts", None) for p in parts):
        return None
    return [p.word for p in parts]


# ---- the permission prompt tool's answer (docs/claude-cli.md: one text block holding this JSON) ----------
def summary(tool_name: str, tool_input: dict[str, Any] | None, limit: int = 300) -> str:
    """What an approval card and the journal show of a call: the command, or the path, else the input."""
    tool_input = tool_input if isinstance(tool_input, dict) else {}
    if isinstance(tool_input.get("command"), str):
        text = tool_input["command"]
    else:
        text = next((v for k in PATH_KEYS if isinstance(v := tool_input.get(k), str)), None) or json.dumps(
            tool_input, ensure_ascii=False, sort_keys=True)
    return f"{tool_name}: {text}"[:limit]


def permission_result(decision: Literal["allow", "deny"], tool_input: dict[str, Any], message: str = "") -> str:
    """The text the permission prompt tool returns. Allow passes the input back unchanged (the CLI runs
    `updatedInput`); deny's message is exactly what the model reads."""
    if decision == "allow":
        return json.dumps({"behavior": "allow", "updatedInput": tool_input})
    return json.dumps({"behavior": "deny", "message": message or "Refused at a hard gate."})
