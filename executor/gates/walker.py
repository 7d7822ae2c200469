"""The shell walker's grammar: bash's constructs as bashlex parses them — lists, pipelines, `{ }` and `( )`,
loops, `if`/`while`, functions — and the words, expansions and redirects of each simple command, with the state a
command line carries from one command to the next (the directory, the variables). What each simple command does
is read by the subclass (shell.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from executor.gates.paths import Paths
from executor.gates.tables import OPAQUE, SECRET_VARIABLE, SECRETS
from executor.gates.verdict import Finding

MAX_DEPTH = 8  # nested bash -c / eval / $(…) levels read before the rest counts as opaque
UNKNOWN = None  # a word whose value is only known at run time
UNREADABLE = "\x00unreadable"  # stdin text (a here-string) known only at run time

_PARAM = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])")
_TIME_KEYWORD = re.compile(r"(^|[;&|({!]\s*|\n\s*)time(?=\s)")


@dataclass
class Walker:
    """Walks a command line's constructs and collects findings; `argv` (shell.py) reads each simple command."""

    paths: Paths
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
        import bashlex  # here: an executor that never reads a shell command does without it (0.09 s of a start)

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

    # ---- constructs
    def node(self, n: Any, depth: int, stdin_from: list[str] | None = None) -> None:
        kind = n.kind
        if kind == "command":
            self.command(n, depth, stdin_from)
        elif kind == "pipeline":
            self.pipeline(n, depth)
        elif kind == "list":
            self.sequence(n, depth)
        elif kind == "compound":
            self.compound(n, depth)
        elif kind == "for":
            self.for_loop(n, depth)
        elif kind in ("if", "while", "until", "function"):
            self.clause(n, depth)
        elif kind not in ("reservedword", "operator", "pipe"):
            self.add(OPAQUE, f"an unexpected shell construct ({kind})")

    def pipeline(self, n: Any, depth: int) -> None:
        """`a | b | c`: each part is told the names of the commands feeding it (a shell fed by curl …)."""
        upstream: list[str] = []
        for part in n.parts:
            if part.kind in ("pipe", "reservedword"):
                continue
            self.node(part, depth, upstream)
            upstream = upstream + [_first_word(part)]

    def sequence(self, n: Any, depth: int) -> None:
        """`a && b; c || d &`: every part runs, or may."""
        for part in n.parts:
            if part.kind != "operator":
                self.node(part, depth)

    def compound(self, n: Any, depth: int) -> None:
        """`{ …; }` or `( … )`; a subshell's cd and variables end with it. Its redirects apply to all of it."""
        subshell = bool(n.list) and getattr(n.list[0], "word", None) == "("
        saved = (self.cwd, dict(self.env))
        for part in n.list:
            self.node(part, depth)
        if subshell:
            self.cwd, self.env = saved
        for r in getattr(n, "redirects", []) or []:
            self.redirect(r, depth)

    def clause(self, n: Any, depth: int) -> None:
        """`if`, `while`, `until` and a function's body: every branch may run (a function's name is no command)."""
        for part in n.parts:
            if part.kind not in ("reservedword", "word"):
                self.node(part, depth)
            elif part.kind == "word" and n.kind != "function":
                self.word(part, depth)

    def for_loop(self, n: Any, depth: int) -> None:
        """`for x in a b; do …; done`: the body is read once per item (the first 16) with the variable bound."""
        parts = list(n.parts)
        var = parts[1].word if len(parts) > 1 and parts[1].kind == "word" else None
        items = self.loop_items(parts, depth)
        body = [p for p in parts if p.kind not in ("reservedword", "word")]
        for value in (items[:16] or [UNKNOWN]):
            if var:
                self.env[var] = value
            for b in body:
                self.node(b, depth)

    def loop_items(self, parts: list[Any], depth: int) -> list[str | None]:
        items: list[str | None] = []
        if len(parts) > 2 and getattr(parts[2], "word", None) == "in":
            for p in parts[3:]:
                if p.kind == "word":
                    items.append(self.word(p, depth))
                elif getattr(p, "word", None) in (";", "do", "\n"):
                    break
        return items

    # ---- words
    def word(self, w: Any, depth: int) -> str | None:
        """A word's value with the variables we know substituted; walks its $(…) / `…` / <(…) commands."""
        runs_commands = has_param = False
        for part in getattr(w, "parts", []) or []:
            if part.kind in ("commandsubstitution", "processsubstitution"):
                self.substitution(part, depth)
                runs_commands = True
            elif part.kind == "parameter":
                self.parameter(part)
                has_param = True
        if runs_commands:
            return UNKNOWN
        value: str | None = w.word
        if has_param:
            value = None if self.ifs_changed else self.substitute(w.word)
        if value is not UNKNOWN and value.startswith("~"):
            value = self.paths.expand_tilde(value)
        return value

    def substitution(self, part: Any, depth: int) -> None:
        """`$(…)`, backticks, `<(…)`: their commands run in a subshell."""
        saved = (self.cwd, dict(self.env))
        self.node(part.command, depth + 1)
        self.cwd, self.env = saved

    def parameter(self, part: Any) -> None:
        name = re.match(r"[A-Za-z_][A-Za-z0-9_]*", part.value or "")
        if name and SECRET_VARIABLE.search(name.group(0)):
            self.add(SECRETS, f"reads ${name.group(0)}")

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

    def fields(self, part: Any, depth: int) -> tuple[list[str | None], list[str]]:
        """A command word's values and how each is shown: an unquoted expansion is split into words
        (C="sudo ls"; $C runs sudo)."""
        value = self.word(part, depth)
        if value is not None and any(p.kind == "parameter" for p in getattr(part, "parts", []) or []):
            split: list[str | None] = [*value.split()] or [""]
            return split, [part.word] * len(split)
        return [value], [part.word]

    # ---- redirects and paths
    def redirect(self, r: Any, depth: int) -> None:
        target = r.output if not isinstance(r.output, int) else None
        heredoc = getattr(r, "heredoc", None)
        if target is None or r.type in (">&", "<&") and target.word.isdigit():
            return
        if r.type in ("<<", "<<-", "<<<") or heredoc is not None:  # data, not a file (a here-string's
            self.word(target, depth)                                 # $(…) still runs)
            return
        self.path(self.word(target, depth), target.word, depth, write=r.type != "<", what="redirect")

    def stdin_text(self, r: Any, depth: int) -> str:
        """The text a heredoc or here-string feeds the command (`UNREADABLE` if known only at run time)."""
        if getattr(r, "heredoc", None) is not None:
            text: str = r.heredoc.value
            return text.rsplit("\n", 1)[0] if "\n" in text else ""
        value = self.word(r.output, depth)  # a here-string
        return UNREADABLE if value is UNKNOWN else value

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

    # ---- simple commands
    def command(self, n: Any, depth: int, upstream: list[str] | None) -> None:
        words: list[str | None] = []
        shown: list[str] = []
        heredoc: str | None = None
        alone = not any(p.kind == "word" for p in n.parts)  # X=… with no command sets the shell's variable
        for part in n.parts:
            if part.kind == "word":
                values, looks = self.fields(part, depth)
                words += values
                shown += looks
            elif part.kind == "assignment":
                self.assignment(part, depth, alone)
            elif part.kind == "redirect":
                self.redirect(part, depth)
                if _feeds_stdin(part):
                    heredoc = self.stdin_text(part, depth)
        if words:
            self.argv(words, shown, depth, upstream or [], heredoc)

    def assignment(self, part: Any, depth: int, alone: bool) -> None:
        name = part.word.partition("=")[0]
        value = self.word(part, depth)
        if alone:
            self.env[name] = None if value is None else value.partition("=")[2]
            if name == "IFS":  # word splitting is no longer what we assume: expansions are unknown
                self.ifs_changed = True

    def argv(self, words: list[str | None], shown: list[str], depth: int, upstream: list[str],
             heredoc: str | None = None) -> None:
        """One simple command's words, the name first, with what a pipe feeds it and its heredoc: shell.py."""
        raise NotImplementedError


def _first_word(part: Any) -> str:
    """What a pipeline's part is called for the parts downstream of it."""
    first = [w.word for w in part.parts if w.kind == "word"][:1] if part.kind == "command" else []
    return first[0] if first else "(compound)"


def _feeds_stdin(r: Any) -> bool:
    """A heredoc or a here-string: text on the command's stdin."""
    return getattr(r, "heredoc", None) is not None or (r.type == "<<<" and not isinstance(r.output, int))
