"""The pinned Claude Code CLI: where it is installed and how to install it (npm, into a local prefix)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from shared import errors

# The version whose behaviour the supervisor is tested against (docs/claude-cli.md).
CLAUDE_CODE_VERSION = "2.1.328"
PACKAGE = "@anthropic-ai/claude-code"


_EXACT = re.compile(r"^\d+\.\d+\.\d+$")


def resolve(version: str) -> str:
    """An exact version for a tag such as "latest" (asked of the npm registry), so installs stay keyed by
    the version that actually ran; an exact version is returned as is."""
    if _EXACT.match(version):
        return version
    npm = shutil.which("npm")
    if npm is None:
        raise errors.ConfigError(f"npm is needed to resolve the Claude Code version {version!r}")
    out = subprocess.run([npm, "view", f"{PACKAGE}@{version}", "version"], check=False, capture_output=True,
                         text=True, timeout=120)
    # a tag npm does not know prints nothing and exits 0; a range may print several "pkg@x 'x'" lines
    found = out.stdout.strip().splitlines()
    if out.returncode != 0 or not found:
        raise errors.ConfigError(f"no Claude Code version {version!r} on the registry: {out.stderr.strip()[:300]}")
    last = found[-1].strip().split()[-1].strip("'\"")
    if not _EXACT.match(last):
        raise errors.ConfigError(f"npm answered {last!r} for Claude Code version {version!r}")
    return last


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


INSTALL_HINT = ("install it with `petal-dispatch install-claude` (the pinned version, needs npm) or "
                "`npm install -g @anthropic-ai/claude-code`")


def find(configured: str | None, path: str | None, *, install_missing: bool = False) -> Path:
    """The CLI to run, as an absolute path: PETAL_CLAUDE_BIN when set (a path, or a name on PATH) and refused
    when it names nothing; else `claude` on PATH, else the pinned install — installed first when
    `install_missing` (`up` does; the services and `doctor` only look)."""
    if configured:
        found = shutil.which(configured, path=path) if "/" not in configured else configured
        if found is None or not os.access(found, os.X_OK) or not Path(found).is_file():
            raise errors.ConfigError(f"PETAL_CLAUDE_BIN={configured} is not an executable file (nor a command on "
                                     f"PATH): point it at the CLI, or unset it to use `claude` on PATH or the "
                                     f"pinned install ({INSTALL_HINT})")
        return Path(found).absolute()
    on_path = shutil.which("claude", path=path)
    if on_path is not None:
        return Path(on_path).absolute()
    pinned = installed_bin()
    if pinned is not None:
        return pinned
    if install_missing:
        return install()
    raise errors.ConfigError(f"the Claude Code CLI is not installed (no `claude` on PATH, no pinned install in "
                             f"{default_prefix()}): {INSTALL_HINT}")


def version_of(binary: Path) -> str:
    """What `claude --version` prints (e.g. "2.1.328 (Claude Code)"); raises ConfigError when it cannot run."""
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise errors.ConfigError(f"the Claude Code CLI {binary} does not run: {exc}") from None
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        raise errors.ConfigError(f"the Claude Code CLI {binary} does not run: {why}")
    return out.stdout.strip()
