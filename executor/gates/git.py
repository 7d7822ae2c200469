"""What git runs and writes, for the shell walker (shell.py): its global options (-C DIR, -c key=value …), its
subcommands' rules (tables.GIT_RULES) and paths, and the settings that make git run commands (an alias `!cmd`,
core.fsmonitor …), gated as opaque for one call and beyond the branch when stored."""

from __future__ import annotations

import re

from executor.gates.tables import GIT_BEYOND_BRANCH, GIT_COMMAND_KEYS, GIT_RULES, OPAQUE, OUTSIDE_TREE
from executor.gates.walker import UNKNOWN, Walker

# a word that names a path (absolute, ~, ./ or ../, or with a / in it)
PATHLIKE = re.compile(r"^(/|~|\.\.?(/|$))|/")


class GitWalker(Walker):
    """The walker's reading of `git …` (Shell builds on it)."""

    def git(self, args: list[str | None], shown: list[str], depth: int, reason: str) -> None:
        i = self.git_options(args, shown, depth, reason)
        if i >= len(args):
            return
        sub = args[i]
        if sub is UNKNOWN:
            self.add(OPAQUE, f"a git subcommand known only at run time ({reason})")
            return
        self.git_subcommand(sub, args[i + 1:], shown[i + 1:], depth, reason)

    def git_options(self, args: list[str | None], shown: list[str], depth: int, reason: str) -> int:
        """git's global options before the subcommand (-C DIR, -c key=value …); where the subcommand is."""
        i = 0
        while i < len(args):
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
        return i

    def git_subcommand(self, sub: str, rest: list[str | None], shown: list[str], depth: int, reason: str) -> None:
        flags = {a for a in rest if a is not None and a.startswith("-")}
        positional = [a for a in rest if a is None or not a.startswith("-")]
        category = GIT_RULES.get(sub)
        if callable(category):
            category = category(flags, positional)
        if category:
            self.add(category, reason)
        if sub == "config":
            self.git_config_command(rest, shown, flags, positional, depth, reason)
        elif sub == "clone" and len(positional) >= 2:
            self.path(positional[1], positional[1] or "?", depth, write=True, what="git clone")
        else:
            self.git_paths(rest, shown, depth)

    def git_config_command(self, rest: list[str | None], shown: list[str], flags: set[str],
                           positional: list[str | None], depth: int, reason: str) -> None:
        """`git config key value` stores a setting; --global and --system store it outside the tree."""
        if len(positional) >= 2 and positional[0] is not None:
            self.git_config(f"{positional[0]}={positional[1]}", depth, reason, stored=True)
        if flags & {"--global", "--system"}:
            self.add(OUTSIDE_TREE, reason)
        else:
            self.git_paths(rest, shown, depth)

    def git_paths(self, rest: list[str | None], shown: list[str], depth: int) -> None:
        for a, s in zip(rest, shown):
            if a is not None and not a.startswith("-") and PATHLIKE.search(a) and ":" not in a:
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
