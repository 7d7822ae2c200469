"""Which stored conversations a live process (a terminal) is using now.

Observed on CLI 2.1.328 (docs/claude-cli.md "Stored conversations"): while it runs, every `claude` process
keeps `<config>/sessions/<pid>.json` naming its `sessionId`, `cwd` and `procStart` (its start time in clock
ticks, field 22 of /proc/<pid>/stat), and removes it on a clean exit. A process killed outright leaves its
file behind: it counts only while that pid lives with that start time (a reused pid does not). Older CLIs
keep no such file; a process whose command line names the conversation (`--resume <id>`, `--session-id
<id>`) counts too. The harness's own spawns (their command line carries the role marker) are not terminals.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_OWN_SPAWN = b"[petal-role: "  # substrate.ROLE_MARKER, in every command line the harness builds
_NAMING_FLAGS = (b"--resume", b"-r", b"--session-id")


def _start_ticks(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ")"
    fields = stat[stat.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else None


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def registered(config_dir: Path) -> dict[str, int]:
    """session id → pid, from the CLI's registry of running processes in one config directory."""
    found: dict[str, int] = {}
    try:
        entries = list(os.scandir(config_dir / "sessions"))
    except OSError:
        return found
    for entry in entries:
        if not entry.name.endswith(".json"):
            continue
        try:
            info = json.loads(Path(entry.path).read_bytes())
            pid, session = int(info["pid"]), str(info["sessionId"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        ticks = _start_ticks(pid)
        if ticks is None or (info.get("procStart") is not None and str(info["procStart"]) != ticks):
            continue  # gone, or its pid now belongs to another process
        if _OWN_SPAWN in b" ".join(_cmdline(pid)):
            continue
        found[session] = pid
    return found


def named_on_command_lines() -> dict[str, int]:
    """session id → pid, for processes whose command line names a conversation (older CLIs, or a process
    in another config directory's registry we do not scan)."""
    found: dict[str, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        args = _cmdline(int(name))
        if len(args) < 2 or _OWN_SPAWN in b" ".join(args):
            continue
        for flag, value in zip(args, args[1:], strict=False):
            if flag in _NAMING_FLAGS and _UUID.fullmatch(value):
                found[value.decode()] = int(name)
    return found


def live_sessions(config_dirs: tuple[Path, ...]) -> dict[str, int]:
    """Every conversation some live process is using, with one such pid."""
    found = named_on_command_lines()
    for config_dir in config_dirs:
        found.update(registered(config_dir))
    return found
