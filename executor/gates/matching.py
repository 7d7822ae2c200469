"""How a simple command meets the command tables: its name as the tables know it, its positional arguments,
and whether a `CommandRule` matches it."""

from __future__ import annotations

import re

from executor.gates.tables import COMMANDS, OPTION_VALUES, SHELLS, WRAPPERS, WRITERS, CommandRule


def command_name(word: str) -> str:
    """A command's name as the table knows it: /usr/bin/sudo → sudo, python3.11 → python, mkfs.ext4 → mkfs."""
    name = word.rsplit("/", 1)[-1].lstrip("\\")
    if name in COMMANDS or name in WRAPPERS or name in SHELLS or name in WRITERS:
        return name
    base = re.sub(r"[\d.]+$", "", name)
    if base and base in COMMANDS:
        return base
    head = name.split(".", 1)[0]
    return head if head in COMMANDS else name


def positional(name: str, args: list[str | None]) -> list[str | None]:
    """The arguments that are not options nor an option's value (`kubectl -n prod get` → [get])."""
    takes_value = OPTION_VALUES.get(name, frozenset())
    found: list[str | None] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a is not None and a.startswith("-"):
            skip = a in takes_value
        else:
            found.append(a)
    return found


def matches(rule: CommandRule, name: str, args: list[str | None], joined: str) -> bool:
    found = positional(name, args)
    if rule.subcommands is not None and not any(p in rule.subcommands for p in found[:3]):
        return False
    if rule.except_subcommands and found and found[0] in rule.except_subcommands:
        return False
    if rule.except_subcommands and not found and not args:
        return False
    if rule.flags is not None and not any(has_flag(a, rule.flags) for a in args if a is not None):
        return False
    if rule.args_pattern is not None and not rule.args_pattern.search(joined):
        return False
    return True


def has_flag(arg: str, flags: frozenset[str]) -> bool:
    if arg in flags or arg.partition("=")[0] in flags:
        return True
    if arg.startswith("-") and not arg.startswith("--") and len(arg) > 2:  # a cluster: -rf
        return any(f"-{c}" in flags for c in arg[1:])
    return False
