"""The pinned Claude Code CLI: where it is installed and how to install it (npm, into a local prefix)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from shared import errors

# The version whose behaviour the supervisor is tested against (docs/claude-cli.md).
CLAUDE_CODE_VERSION = "2.1.328"
PACKAGE = "@anthropic-ai/claude-code"


def default_prefix(version: str = CLAUDE_CODE_VERSION) -> Path:
    """Outside any checkout and keyed by version, so every clone and CI run reuses one install."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "petal-dispatch" / "claude-code" / version


def installed_bin(prefix: Path | None = None) -> Path | None:
    path = (prefix or default_prefix()) / "node_modules" / ".bin" / "claude"
    return path if path.exists() else None


def install(prefix: Path | None = None, version: str = CLAUDE_CODE_VERSION) -> Path:
    """Install the pinned CLI when missing; returns the binary's path."""
    prefix = prefix or default_prefix(version)
    found = installed_bin(prefix)
    if found is not None:
        return found
    npm = shutil.which("npm")
    if npm is None:
        raise errors.ConfigError("npm is needed to install the Claude Code CLI (install Node.js 18+)")
    prefix.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error",
         f"{PACKAGE}@{version}"],
        check=True,
    )
    found = installed_bin(prefix)
    if found is None:
        raise errors.ConfigError(f"npm finished but {prefix}/node_modules/.bin/claude is missing")
    return found
