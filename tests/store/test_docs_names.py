"""Every systemd unit, `PETAL_*` variable and `petal-dispatch` command the docs name exists.

The names are taken from the text (README.md, docs/*.md, and the env examples for variables) by the same
regular expressions a reader's eye would follow, and compared with what is there: the unit files in
systemd/, the fields of `Settings` (and their aliases), and the subcommands `build_parser` knows.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import AliasChoices

from executor.run import substrate
from petal_dispatch.cli import build_parser
from petal_dispatch.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ENV_EXAMPLES = sorted((ROOT / "systemd" / "env").glob("*.example"))

# Variables the docs may name that are not settings, each with why it exists (and where: checked below).
NOT_SETTINGS = {
    "PETAL_TEST_DSN": ("tests: the server the suite creates its databases on", "tests/pg.py"),
    "PETAL_TEST_PG_IMAGE": ("tests: a PostgreSQL container image to run the suite against", "tests/pg.py"),
    "PETAL_CHROMIUM": ("tests: the Chromium the browser tests drive", "tests/web/test_web_client.py"),
    "PETAL_CLAUDE_VERSION": ("install-claude and the tests: which CLI to install (read by the command itself)",
                             "petal_dispatch/commands/claude.py"),
    substrate.TASK_ENV_VAR: ("set by the executor on every spawn (its task id), never read as a setting",
                             "executor/run/substrate.py"),
}

VARIABLE = re.compile(r"\b(?:PETAL_[A-Z0-9_]*[A-Z0-9]|DATABASE_URL|OPEN_MODE)\b")
UNIT_FILE = re.compile(r"(?<![\w*-])([A-Za-z0-9@_-]+)\.service\b")
# a unit of this project named without its suffix (`systemctl restart petal-dispatch-ingress`)
UNIT_STEM = re.compile(r"(?<![\w/.-])(petal-dispatch-[a-z]+)\b(?![.\w-])")
COMMAND = re.compile(r"(?<![\w-])petal-dispatch[ \t]+([a-z][a-z-]*)(?:[ \t]+([a-z][a-z-]*))?")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")


@dataclass(frozen=True)
class Known:
    units: frozenset[str]
    variables: frozenset[str]
    commands: dict[str, frozenset[str]]  # a command, and its own subcommands (empty: it has none)


def known() -> Known:
    units = frozenset(p.stem for p in (ROOT / "systemd").glob("*.service"))
    variables = set(NOT_SETTINGS)
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            variables.update(str(choice) for choice in alias.choices)
        else:
            variables.add(f"PETAL_{name.upper()}")
    return Known(units, frozenset(variables), _commands(build_parser()))


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _commands(parser: argparse.ArgumentParser) -> dict[str, frozenset[str]]:
    return {name: frozenset(_subcommands(sub)) for name, sub in _subcommands(parser).items()}


def code_of(markdown: str) -> str:
    """The text of fenced blocks and inline code spans: where a doc names a command to type."""
    blocks = FENCE.findall(markdown)
    rest = FENCE.sub("", markdown)
    return "\n".join([*blocks, *SPAN.findall(rest)])


def unknown_names(markdown: str, have: Known, *, variables_only: bool = False) -> list[str]:
    """What the text names that does not exist, each as `kind name`."""
    wrong = [f"variable {v}" for v in sorted(set(VARIABLE.findall(markdown)) - have.variables)]
    if variables_only:
        return wrong
    units = set(UNIT_FILE.findall(markdown)) | set(UNIT_STEM.findall(markdown))
    wrong += [f"unit {u}.service" for u in sorted(units - have.units)]
    for first, second in sorted(set(COMMAND.findall(code_of(markdown)))):
        if first not in have.commands:
            wrong.append(f"command petal-dispatch {first}")
        elif second and have.commands[first] and second not in have.commands[first]:
            wrong.append(f"command petal-dispatch {first} {second}")
    return wrong


def test_every_unit_variable_and_command_the_docs_name_exists() -> None:
    have = known()
    wrong = {str(p.relative_to(ROOT)): unknown_names(p.read_text(encoding="utf-8"), have) for p in DOCS}
    wrong.update({str(p.relative_to(ROOT)): unknown_names(p.read_text(encoding="utf-8"), have, variables_only=True)
                  for p in ENV_EXAMPLES})
    assert {doc: names for doc, names in wrong.items() if names} == {}


def test_the_check_reads_what_the_docs_name() -> None:
    """The extraction finds names at all (a regex that matched nothing would pass every doc)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in DOCS)
    assert {"PETAL_DATA_DIR", "OPEN_MODE", "DATABASE_URL"} <= set(VARIABLE.findall(text))
    assert "petal-dispatch-executor" in set(UNIT_FILE.findall(text)) | set(UNIT_STEM.findall(text))
    assert {("up", ""), ("db", "status"), ("project", "create")} <= set(COMMAND.findall(code_of(text)))


def test_a_doc_naming_a_unit_variable_or_command_that_does_not_exist_is_reported() -> None:
    have = known()
    made_up = (
        "Start `petal-dispatch-scheduler.service`, or `systemctl restart petal-dispatch-indexer`, then\n"
        "`journalctl -u petal-executor.service`.\n"
        "Set `PETAL_NO_SUCH_KNOB=1`.\n"
        "```sh\n.venv/bin/petal-dispatch frobnicate --now\npetal-dispatch db vacuum\n```\n"
        "Deploying petal-dispatch on a host (prose: not a command).\n"
    )
    assert unknown_names(made_up, have) == [
        "variable PETAL_NO_SUCH_KNOB",
        "unit petal-dispatch-indexer.service", "unit petal-dispatch-scheduler.service", "unit petal-executor.service",
        "command petal-dispatch db vacuum", "command petal-dispatch frobnicate",
    ]
    assert unknown_names("Set `PETAL_ALSO_MADE_UP=1`", have, variables_only=True) == [
        "variable PETAL_ALSO_MADE_UP"]
    # and what exists passes: the same shapes, real names
    real = ("`petal-dispatch-executor.service`, `systemctl restart petal-dispatch-ingress`, `PETAL_DATA_DIR`,\n"
            "`OPEN_MODE=1`, `DATABASE_URL`, `.venv/bin/petal-dispatch db status --data-dir var`,\n"
            "`petal-dispatch contract add FIELD`, `petal-dispatch up --demo`")
    assert unknown_names(real, have) == []


def test_every_variable_allowed_without_a_setting_is_used_where_its_reason_says() -> None:
    for name, (reason, where) in NOT_SETTINGS.items():
        assert reason and name in (ROOT / where).read_text(encoding="utf-8"), (name, where)
