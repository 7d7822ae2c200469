"""Path resolution for the gates: `~`, `..` and symlinks folded the way the kernel would, then checked against
the task's tree, the secret-path tables and the places a write must not reach (.git, .claude, devices).
Only names are read: a file's content never is."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

from executor.gates.tables import (
    AGENT_CONFIG_DIR,
    DESTRUCTIVE,
    DEVICES,
    GIT_BEYOND_BRANCH,
    GIT_DIR,
    HARMLESS_WRITES,
    NOT_SECRET_NAMES,
    OUTSIDE_TREE,
    PRIVILEGE,
    SECRET_DIRS,
    SECRET_NAMES,
    SECRET_PATHS,
)
from executor.gates.verdict import Finding


@dataclass(frozen=True)
class Paths:
    root: str  # the task's tree, resolved
    home: str  # what `~` stands for, resolved

    def expand_tilde(self, path: str) -> str:
        if path == "~" or path.startswith("~/"):
            return self.home + path[1:]
        if path.startswith("~"):  # ~user: another account's home, outside the tree either way
            user, _, rest = path[1:].partition("/")
            return os.path.join("/root" if user == "root" else f"/home/{user}", rest)
        return path

    def resolve(self, path: str, cwd: str) -> str:
        # realpath follows the symlinks that exist and folds "..": a link inside the tree that points out
        # of it resolves outside.
        return os.path.realpath(os.path.join(cwd, self.expand_tilde(path)))

    def inside(self, resolved: str) -> bool:
        return resolved == self.root or resolved.startswith(self.root.rstrip("/") + "/")

    @staticmethod
    def secret(resolved: str) -> bool:
        name = os.path.basename(resolved)
        if any(fnmatch.fnmatchcase(name, p) for p in NOT_SECRET_NAMES):
            return False
        if any(fnmatch.fnmatchcase(name, p) for p in SECRET_NAMES):
            return True
        parts = resolved.split("/")
        return any(d in parts for d in SECRET_DIRS) or any(fnmatch.fnmatchcase(resolved, p) for p in SECRET_PATHS)

    def write_findings(self, shown: str, resolved: str, what: str) -> list[Finding]:
        if any(fnmatch.fnmatchcase(resolved, p) for p in HARMLESS_WRITES):
            return []
        if any(fnmatch.fnmatchcase(resolved, p) for p in DEVICES):
            return [Finding(DESTRUCTIVE, f"{what} writes the device {shown}")]
        if not self.inside(resolved):
            return [Finding(OUTSIDE_TREE, f"{what} writes {shown}")]
        relative = os.path.relpath(resolved, self.root)
        if GIT_DIR in relative.split("/")[:-1]:
            return [Finding(GIT_BEYOND_BRANCH, f"{what} writes {relative}")]
        if AGENT_CONFIG_DIR in relative.split("/")[:-1]:
            return [Finding(PRIVILEGE, f"{what} writes {relative} (the CLI's own permissions and hooks)")]
        return []
