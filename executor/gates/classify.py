"""Which gate a tool call falls in: `classify(tool_name, tool_input, workdir, home)` → a `Verdict`.

A tool's kind comes from the TOOLS table: free tools pass, path tools are checked by their path (paths.py),
Bash calls by the shell walker (shell.py)."""

from __future__ import annotations

import os
from typing import Any

from executor.gates.paths import Paths
from executor.gates.shell import Shell
from executor.gates.tables import ALLOWED, FREE_TOOL_PREFIXES, OPAQUE, PATH_KEYS, SECRETS, TOOLS
from executor.gates.verdict import Finding, Verdict, verdict_of


def classify(tool_name: str, tool_input: dict[str, Any] | None, workdir: str | os.PathLike[str],
             home: str | os.PathLike[str]) -> Verdict:
    """The gate a tool call falls in, or `allowed`. `workdir` is the task's tree; `home` expands `~`."""
    tool_input = tool_input if isinstance(tool_input, dict) else {}
    kind = TOOLS.get(tool_name) or ("free" if tool_name.startswith(FREE_TOOL_PREFIXES) else None)
    if kind is None:
        return verdict_of([Finding(OPAQUE, f"the tool {tool_name} is not known to the gate")])
    if kind == "free":
        return Verdict(ALLOWED)
    if kind == "shell":
        command = tool_input.get("command")
        if not isinstance(command, str) or "\x00" in command:  # a NUL cuts the string where bash reads it
            return verdict_of([Finding(OPAQUE, "a Bash call without a readable command string")])
        return classify_command(command, workdir, home)
    return verdict_of(_path_findings(tool_name, kind, tool_input, _paths(workdir, home)))


def classify_command(command: str, workdir: str | os.PathLike[str], home: str | os.PathLike[str]) -> Verdict:
    """The gate a shell command falls in, or `allowed`."""
    shell = Shell(_paths(workdir, home))
    shell.script(command, 0)
    return verdict_of(shell.findings)


def _paths(workdir: str | os.PathLike[str], home: str | os.PathLike[str]) -> Paths:
    return Paths(os.path.realpath(workdir), os.path.realpath(home))


def _path_findings(tool_name: str, kind: str, tool_input: dict[str, Any], paths: Paths) -> list[Finding]:
    """A read tool's secret paths; an edit tool's too, and where it writes."""
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
    return findings
