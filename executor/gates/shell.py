"""The shell walker: reads a Bash command string as bash would run it and records what it would touch.

walker.py reads the constructs (`&&`, `;`, `|`, subshells, `$(…)`, backticks, functions, loops, heredocs) and
hands every simple command here, where it is matched against the tables and read through wrappers (`sudo`,
`env`, `nohup`, `time`, `timeout`, `xargs`, `bash -c`, `eval`, `find -exec` …), one method per command that
runs code, changes the shell's state or writes paths. A word whose value is known only at run time is
`UNKNOWN`, and what it would run or write is gated as `opaque`. Scripts run by an interpreter are not read:
only their paths are.
"""

from __future__ import annotations

import os
import re

from executor.gates.git import PATHLIKE, GitWalker
from executor.gates.matching import command_name, matches
from executor.gates.paths import Paths
from executor.gates.tables import (
    ANY_COMMAND,
    COMMANDS,
    DEPENDENCY,
    IN_PLACE,
    INTERPRETERS,
    OPAQUE,
    OUTPUT_OPTIONS,
    RUNS_COMMANDS,
    SECRETS,
    SHELL_STRING_OPTION,
    SHELLS,
    WRAPPER_SKIP_FIRST,
    WRAPPERS,
    WRAPPERS_GATE,
    WRITERS,
)
from executor.gates.walker import UNKNOWN, UNREADABLE

_EXPANDS = re.compile(r"[*?]|\[[^\]]+\]|\{[^}]*,[^}]*\}")

_CHANGES_DIRECTORY = frozenset({"cd", "pushd", "popd"})
_READS_INTO_VARIABLES = frozenset({"read", "mapfile", "readarray", "getopts"})  # set variables to what they read
_DECLARES = frozenset({"export", "declare", "typeset", "local", "readonly"})
_SHELL_VALUE_OPTIONS = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
_FIND_RUNS = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
_DOWNLOADERS = frozenset({"curl", "wget", "fetch"})


class Shell(GitWalker):
    """The walker that knows what commands do: wrappers, shells, eval, git, cd, writers …"""

    def argv(self, words: list[str | None], shown: list[str], depth: int, upstream: list[str],
             heredoc: str | None = None) -> None:
        """One command's words, the name first: the tables' rules, then what the command itself runs or writes."""
        if not words:
            return
        first = words[0]
        if first is UNKNOWN:
            self.add(OPAQUE, f"the command name is computed at run time ({shown[0]})")
            return
        if _EXPANDS.search(first):  # {sudo,ls} or /usr/bin/su?o: the name the shell runs is not this word
            self.add(OPAQUE, f"the command name is expanded at run time ({shown[0]})")
            return
        name, args, args_shown = command_name(first), words[1:], shown[1:]
        reason = " ".join(shown)[:120]
        self.table_rules(name, args, reason)
        if name in WRAPPERS:
            self.wrapper(name, args, args_shown, depth, upstream, reason)
        elif name in SHELLS:
            self.shell(name, args, depth, upstream, heredoc, reason)
        elif not self.reads_itself(name, args, args_shown, depth, reason):
            self.before_arguments(name, args, args_shown, depth, heredoc, reason)
            self.arguments(name, args, args_shown, depth)

    def table_rules(self, name: str, args: list[str | None], reason: str) -> None:
        joined = " ".join(a if a is not None else "$?" for a in args)
        for rule in (*COMMANDS.get(name, ()), *ANY_COMMAND):
            if matches(rule, name, args, joined):
                self.add(rule.category, reason)

    def reads_itself(self, name: str, args: list[str | None], shown: list[str], depth: int, reason: str) -> bool:
        """The commands whose words are read here in full (True: no argument is left to check as a path)."""
        if name == "eval":
            self.eval(args, depth, reason)
        elif name == "git":
            self.git(args, shown, depth, reason)
        elif name in _CHANGES_DIRECTORY:
            self.cd(name, args)
        elif name == "alias":
            self.alias(args, depth)
        elif name in _DECLARES:
            self.declare(args)
            return name != "export"
        else:
            return False
        return True

    def before_arguments(self, name: str, args: list[str | None], shown: list[str], depth: int,
                         heredoc: str | None, reason: str) -> None:
        """What a command runs or sets besides its path arguments."""
        if name in INTERPRETERS:
            self.interpreter_stdin(name, heredoc, reason)
        elif name in ("source", ".") and args and args[0] is UNKNOWN:
            self.add(OPAQUE, f"runs code known only at run time ({reason})")
        elif name in SHELL_STRING_OPTION or name == "trap":
            self.shell_string(name, args, depth, reason)
        elif name in _READS_INTO_VARIABLES:
            self.reads_into(args)
        elif name == "printf":
            self.printf_into(args)
        elif name == "find":
            self.find(args, shown, depth)

    # ---- commands that run code
    def eval(self, args: list[str | None], depth: int, reason: str) -> None:
        if any(a is UNKNOWN for a in args):
            self.add(OPAQUE, f"eval of a value known only at run time ({reason})")
        else:
            self.script(" ".join(a for a in args if a is not None), depth + 1)

    def alias(self, args: list[str | None], depth: int) -> None:
        """The snapshot shell may expand aliases: read what each one would run."""
        for a in args:
            if a is not None and "=" in a:
                self.script(a.partition("=")[2], depth + 1)

    def interpreter_stdin(self, name: str, heredoc: str | None, reason: str) -> None:
        """`python <<EOF … EOF`: code fed on stdin that starts programs is not read, so it is opaque."""
        if heredoc is not None and (heredoc == UNREADABLE or re.search(RUNS_COMMANDS, heredoc)):
            self.add(OPAQUE, f"{name} code that starts programs ({reason})")

    def shell_string(self, name: str, args: list[str | None], depth: int, reason: str) -> None:
        """`su -c CODE`, `script -c CODE`, `trap CODE SIGNAL` …: the code is a command line of its own."""
        if name == "trap":
            at = 0
        elif (option := SHELL_STRING_OPTION[name]) in args:
            at = args.index(option) + 1
        else:
            return
        if at >= len(args):
            return
        code = args[at]
        if code is UNKNOWN:
            self.add(OPAQUE, f"runs a shell string known only at run time ({reason})")
        else:
            self.script(code, depth + 1)

    def shell(self, name: str, args: list[str | None], depth: int, upstream: list[str], heredoc: str | None,
              reason: str) -> None:
        """`bash -c CODE`, `bash script.sh`, or a shell reading stdin (a heredoc, a pipe)."""
        if not self.shell_arguments(name, args, depth, reason):
            self.shell_stdin(heredoc, depth, upstream, reason)

    def shell_arguments(self, name: str, args: list[str | None], depth: int, reason: str) -> bool:
        """A shell's `-c CODE` or script file (True when it has one: then it does not read stdin)."""
        skip_next = False
        for i, a in enumerate(args):
            if a is None:
                self.add(OPAQUE, f"a shell runs something known only at run time ({reason})")
                return True
            if a in _SHELL_VALUE_OPTIONS:
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
                return True
            if not a.startswith("-"):
                self.path(a, a, depth, write=False, what=name)  # a script file: not read, only its path
                return True
        return False

    def shell_stdin(self, heredoc: str | None, depth: int, upstream: list[str], reason: str) -> None:
        if heredoc == UNREADABLE:
            self.add(OPAQUE, f"a shell runs a here-string known only at run time ({reason})")
        elif heredoc is not None:
            self.script(heredoc, depth + 1)
        elif any(command_name(u) in _DOWNLOADERS for u in upstream):
            self.add(DEPENDENCY, f"runs downloaded code ({reason})")
        elif upstream:
            self.add(OPAQUE, f"a shell runs what a pipe feeds it ({reason})")

    # ---- wrappers: commands that run their arguments as a command
    def wrapper(self, name: str, args: list[str | None], shown: list[str], depth: int, upstream: list[str],
                reason: str) -> None:
        if name in WRAPPERS_GATE:
            self.add(WRAPPERS_GATE[name], reason)
        options, start = _wrapper_words(name, args)
        if name == "env" and self.env_options(args, options, depth, reason):
            return
        rest, rest_shown = args[start:], shown[start:]
        if name in ("xargs", "parallel") and rest:  # the arguments it adds come from stdin
            rest, rest_shown = [*rest, UNKNOWN], [*rest_shown, "(from stdin)"]
        if name == "watch" and rest:
            self.watch(rest, depth, reason)
        elif name == "command" and args and args[0] in ("-v", "-V"):
            return
        elif rest:
            self.argv(rest, rest_shown, depth, upstream)
        elif name == "env":
            self.add(SECRETS, "env prints the environment")

    def env_options(self, args: list[str | None], options: list[int], depth: int, reason: str) -> bool:
        """env's -C DIR changes directory; -S STRING is a command line, read here (True: nothing else runs)."""
        for i in options:
            a = args[i] or ""
            if a.startswith(("-S", "--split-string")):
                split_string = (a[2:] if a.startswith("-S") and len(a) > 2
                                else args[i + 1] if i + 1 < len(args) else "")
                if split_string is UNKNOWN:
                    self.add(OPAQUE, f"env -S of a value known only at run time ({reason})")
                else:
                    self.script(split_string, depth + 1)
                return True
            if a in ("-C", "--chdir") and i + 1 < len(args):
                self.cd("cd", args[i + 1:i + 2])
        return False

    def watch(self, rest: list[str | None], depth: int, reason: str) -> None:
        if any(r is UNKNOWN for r in rest):
            self.add(OPAQUE, f"watch of a command known only at run time ({reason})")
        else:
            self.script(" ".join(r for r in rest if r is not None), depth + 1)

    # ---- commands that change the shell's state
    def cd(self, name: str, args: list[str | None]) -> None:
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

    def declare(self, args: list[str | None]) -> None:
        """`export X=…`, `declare X=…` …: set variables (IFS too, after which expansions are unknown)."""
        for a in args:
            if a is not None and "=" in a and not a.startswith("-"):
                key, _, val = a.partition("=")
                self.env[key] = val
                self.ifs_changed = self.ifs_changed or key == "IFS"

    def reads_into(self, args: list[str | None]) -> None:
        """`read X`, `mapfile X` …: X holds what they read, known only at run time."""
        for a in args:
            if a is not None and not a.startswith("-") and re.fullmatch(r"[A-Za-z_]\w*", a):
                self.env[a] = UNKNOWN

    def printf_into(self, args: list[str | None]) -> None:
        """`printf -v X …` sets X."""
        if "-v" in args and args.index("-v") + 1 < len(args):
            target = args[args.index("-v") + 1]
            if target is not None:
                self.env[target] = UNKNOWN

    # ---- commands that write or read paths
    def find(self, args: list[str | None], shown: list[str], depth: int) -> None:
        """`find … -exec CMD {} ;`: CMD runs on what is found; {} stands for a file found under the first start
        path, so `find / -exec rm {} ;` writes outside."""
        start = next((a for a in args if a is None or not a.startswith(("-", "(", "!"))), ".")
        found = UNKNOWN if start is UNKNOWN else os.path.join(start, "found")
        i = 0
        while i < len(args):
            if args[i] in _FIND_RUNS:
                end = next((j for j in range(i + 1, len(args)) if args[j] in (";", "+", "\\;")), len(args))
                inner = [a if a != "{}" else found for a in args[i + 1:end]]
                self.argv(inner, shown[i + 1:end], depth + 1, [])
                i = end + 1
            else:
                i += 1

    def arguments(self, name: str, args: list[str | None], shown: list[str], depth: int) -> None:
        """A command's path arguments: the ones it writes (per WRITERS), and every path-like one for secrets."""
        mode = _write_mode(name, args)
        self.positional_paths(name, mode, args, shown, depth)
        self.option_paths(name, mode, args, shown, depth)

    def positional_paths(self, name: str, mode: str | None, args: list[str | None], shown: list[str],
                         depth: int) -> None:
        positional = [(a, s) for a, s in zip(args, shown) if a is None or not a.startswith("-")]
        written = _written(mode, len(positional))
        for i, (a, s) in enumerate(positional):
            if i in written:
                self.path(a, s, depth, write=True, what=name)
            elif a is not None and (PATHLIKE.search(a) or Paths.secret(a)):
                self.path(a, s, depth, write=False, what=name)

    def option_paths(self, name: str, mode: str | None, args: list[str | None], shown: list[str],
                     depth: int) -> None:
        """Option values: -t DIR for cp-likes, -o FILE, --output=FILE, -C DIR for tar, dd's of=FILE …"""
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


def _wrapper_words(name: str, args: list[str | None]) -> tuple[list[int], int]:
    """A wrapper's own options (their indices) and where the command it runs starts: past the options and their
    values, env's NAME=value words, and the first word of `timeout 5 …`-like wrappers."""
    takes_value = WRAPPERS[name]
    skip_first = name in WRAPPER_SKIP_FIRST
    options: list[int] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a is None:
            break
        if a == "--":
            return options, i + 1
        if name == "env" and "=" in a and not a.startswith("-"):
            i += 1
        elif a.startswith("-") and a != "-":
            options.append(i)
            i += 2 if a in takes_value else 1
        elif skip_first:
            skip_first = False
            i += 1
        else:
            break
    return options, i


def _write_mode(name: str, args: list[str | None]) -> str | None:
    """Which positional arguments a command writes: "all", "last" (cp-like) or none; `sed -i` writes all."""
    in_place = IN_PLACE.get(name)
    if in_place and any(a is not None and a.startswith(in_place) for a in args):
        return "all"
    return WRITERS.get(name)


def _written(mode: str | None, count: int) -> set[int]:
    if mode == "all":
        return set(range(count))
    if mode == "last" and count:
        return {count - 1}
    return set()
