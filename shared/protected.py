"""Paths no worker may write, and how a tree a worker writes meets them.

A free thread's working directory, a project's repository and a project root are where spawns write. None of
them may contain the service's own code, its venv, its data directory or the CLI's install, nor lie inside one
(issue: nothing a spawn writes is run or trusted outside its sandbox): a worker writing there would plant what
the service, or the user's own terminal, runs next. Both the application (at start, `doctor`) and the executor
(a project's repository, an adopted conversation's directory) ask the same question here.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def overlap(path: Path, protected: Iterable[tuple[str, Path]], *, home: Path | None = None) -> str | None:
    """How `path` meets a protected one ("contains …" / "is inside …"), or None; with `home`, containing
    that home counts too (its dotfiles are run by every shell)."""
    for what, p in protected:
        if path == p or p.is_relative_to(path):
            return f"contains {what} ({p})"
        if path.is_relative_to(p):
            return f"is inside {what} ({p})"
    if home is not None and home.is_relative_to(path):
        return f"contains this user's home ({home}), its dotfiles included"
    return None
