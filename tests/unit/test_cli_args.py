"""The `petal-dispatch` command's arguments and its exit codes (petal_dispatch/cli.py), and ids given as a prefix
(petal_dispatch/commands/ids.py) over the fake query layer. No command's work runs: its handler is a stand-in."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from petal_dispatch import cli
from petal_dispatch.commands import Command, ids, views
from petal_dispatch.config import Settings
from shared import errors, lifeline, logs
from shared.sql import queries as shared_sql
from tests.fake_queries import FakeWork

pytestmark = pytest.mark.unit


def _parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(list(argv))


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every leaf command by its words (`contract add`, `db status`, …)."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its subcommands only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                found.update(_commands(sub, f"{prefix}{name} "))
    return found or {prefix.strip(): parser}


def test_up_takes_its_bind_ports_data_directory_and_the_demo() -> None:
    args = _parse("up", "--host", "0.0.0.0", "--port", "9000", "--mcp-port", "9002", "--data-dir", "d", "--demo")
    assert (args.host, args.port, args.mcp_port, args.data_dir, args.demo) == ("0.0.0.0", 9000, 9002, Path("d"), True)
    assert args.handler == Command("services", "up") and args.scenario is None


def test_a_command_is_required_and_an_unknown_one_or_a_bad_value_is_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["launch"], ["up", "--port", "eighty"], ["contract"], ["routine", "add", "--name", "n"]):
        with pytest.raises(SystemExit) as exited:
            _parse(*argv)
        assert exited.value.code == 2, argv
    assert "usage: petal-dispatch" in capsys.readouterr().err


def test_a_contract_field_needs_its_shape_and_meaning_and_is_read_by_both_by_default() -> None:
    args = _parse("contract", "add", "risk", "--shape", '{"type": "string"}', "--semantics", "what could break")
    assert (args.field, args.required, args.read_by, args.supersede) == ("risk", False, "harness,human", False)
    with pytest.raises(SystemExit):
        _parse("contract", "add", "risk", "--semantics", "no shape")


def test_a_routine_is_added_with_the_documented_defaults_and_only_known_policies() -> None:
    args = _parse("routine", "add", "--name", "nightly", "--prompt", "run {{ event.x }}", "--cron", "0 3 * * *")
    assert (args.mode, args.tz, args.missed, args.overlap, args.webhook) == ("autonomous", "UTC", "skip", "skip", False)
    for bad in (["--mode", "yolo"], ["--missed", "all"], ["--overlap", "stack"]):
        with pytest.raises(SystemExit):
            _parse("routine", "add", "--name", "n", "--prompt", "p", *bad)


def test_every_command_that_reads_the_data_directory_takes_data_dir() -> None:
    commands = _commands(cli.build_parser())
    without = sorted(name for name, p in commands.items()
                     if not any("--data-dir" in a.option_strings for a in p._actions))  # noqa: SLF001
    # the services find their data through the settings, and the CLI's install needs none; `claude` takes the CLI's
    # own arguments whole (it finds the executor by PETAL_DATA_DIR or the link the executor leaves)
    assert without == ["claude", "executor", "ingress", "install-claude"]
    assert {"up", "journal", "status", "db status", "routine add", "attachments purge"} <= set(commands)


def test_every_command_names_a_handler_its_module_has_and_no_command_module_is_imported_to_parse() -> None:
    """The commands' modules are imported when one runs (a fifth of a start was importing all of them): parsing
    imports none but the parsers' own, and every command's handler is found where it says."""
    probe = subprocess.run([sys.executable, "-c", "import sys; from petal_dispatch import cli; cli.build_parser(); "
                            "print(sorted(m for m in sys.modules if m.startswith('petal_dispatch.commands.')))"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["['petal_dispatch.commands.routine_args',", "'petal_dispatch.commands.terminal']"]
    for name, p in _commands(cli.build_parser()).items():
        handler = p.get_default("handler")
        if isinstance(handler, Command):
            module = importlib.import_module(f"petal_dispatch.commands.{handler.module}")
            assert callable(getattr(module, handler.name, None)), name
        else:
            assert callable(handler), name


def test_the_journal_and_purge_options_read_as_documented() -> None:
    args = _parse("journal", "-f", "--thread", "ab12cd34")
    assert (args.follow, args.thread, args.task) == (True, "ab12cd34", None)
    assert _parse("attachments", "purge").older_than == "30d"
    assert _parse("import-transcript", "run.jsonl").role == "worker"


def _keeping(seen: list[Settings], code: int) -> Any:
    """A stand-in handler: keeps the settings it was given, returns `code`."""
    def handler(args: argparse.Namespace, settings: Settings) -> int:
        seen.append(settings)
        return code
    return handler


def _main(monkeypatch: pytest.MonkeyPatch, argv: list[str], handler: Any) -> int:
    """cli.main with `status`'s handler replaced, and nothing of the process changed (its dumpable flag, logging)."""
    monkeypatch.setattr(lifeline, "keep_private", lambda: None)
    monkeypatch.setattr(logs, "configure", lambda *a: None)
    monkeypatch.setattr(views, "status", handler)
    return cli.main(argv)


def test_a_wrong_setting_exits_2_in_one_line_before_the_command_runs(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PETAL_LOG_LEVEL", "loud")
    ran: list[Settings] = []
    assert _main(monkeypatch, ["status"], _keeping(ran, 0)) == 2
    err = capsys.readouterr().err
    assert ran == [] and err.startswith("petal-dispatch: invalid settings: PETAL_LOG_LEVEL") and err.count("\n") == 1


def test_data_dir_wins_over_the_setting_and_is_made_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PETAL_DATA_DIR", str(tmp_path / "from-env"))
    monkeypatch.chdir(tmp_path)
    seen: list[Settings] = []
    assert _main(monkeypatch, ["status", "--data-dir", "given"], _keeping(seen, 7)) == 7
    assert seen[0].data_dir == tmp_path / "given"
    assert _main(monkeypatch, ["status"], _keeping(seen, 0)) == 0
    assert seen[1].data_dir == tmp_path / "from-env"


@pytest.mark.parametrize(("raised", "code", "says"), [
    (errors.DatabaseUnavailable("connection\n   refused"), 2, "petal-dispatch: cannot reach the database: connection refused"),
    (errors.ConfigError("no task 1234"), 2, "petal-dispatch: no task 1234"),
    (KeyboardInterrupt(), 130, ""),
])
def test_a_commands_failure_is_an_exit_code_and_one_line(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str], raised: BaseException,
                                                         code: int, says: str) -> None:
    def handler(args: argparse.Namespace, settings: Settings) -> int:
        raise raised

    assert _main(monkeypatch, ["status"], handler) == code
    assert capsys.readouterr().err.strip() == says


def test_a_bug_in_a_command_is_not_hidden_as_an_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(args: argparse.Namespace, settings: Settings) -> int:
        raise ZeroDivisionError("a bug")

    with pytest.raises(ZeroDivisionError):
        _main(monkeypatch, ["status"], handler)


# ---- ids as the commands take them ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["3fa8", " 3FA85F64 ", "3fa85f64-5717-4562-b3fc-2c963f66afa6"])
def test_a_prefix_of_hex_and_dashes_is_looked_up_in_lower_case(text: str) -> None:
    assert ids._prefix("task", text) == text.strip().lower()  # noqa: SLF001


@pytest.mark.parametrize("text", ["", "3fa8%", "3fa_", "xyz", "3fa85f64-5717-4562-b3fc-2c963f66afa6-0"])
def test_anything_else_is_refused_before_a_query_and_names_the_kind(text: str) -> None:
    with pytest.raises(errors.ConfigError, match=r"is not a thread id \(a UUID, or the start of one"):
        ids._prefix("thread", text)  # noqa: SLF001


async def test_a_unique_prefix_resolves_to_its_id_in_its_kinds_table() -> None:
    found = uuid.uuid4()
    unit = FakeWork({"list_routine_ids_like": [{"id": found}]}, registry=shared_sql)
    assert await ids.resolve(unit, "routine", str(found)[:8].upper()) == found
    assert unit.params("list_routine_ids_like") == {"prefix": str(found)[:8]}


async def test_an_unknown_or_ambiguous_prefix_is_one_line_naming_it() -> None:
    with pytest.raises(errors.ConfigError, match="^no project ab12$"):
        await ids.resolve(FakeWork({"list_project_ids_like": []}, registry=shared_sql), "project", "ab12")
    a, b = uuid.UUID(int=1), uuid.UUID(int=2)
    with pytest.raises(errors.ConfigError) as ambiguous:
        await ids.resolve(FakeWork({"list_task_ids_like": [{"id": a}, {"id": b}]}, registry=shared_sql), "task", "0000")
    assert str(ambiguous.value) == (f"task id 0000 is ambiguous: it starts more than one task's id ({a}, {b}, …); "
                                    "give more of it")


async def test_a_malformed_id_runs_no_query() -> None:
    unit = FakeWork({"list_task_ids_like": []}, registry=shared_sql)
    with pytest.raises(errors.ConfigError):
        await ids.resolve(unit, "task", "%")
    assert unit.calls == []
