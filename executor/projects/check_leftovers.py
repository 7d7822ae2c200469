"""What a project's check (executor/run/check.py) leaves in a worker's worktree, undone before the worktree's changes
are recorded: a check that writes bytecode or build output into the tree would otherwise have it committed to the
worker's branch as the worker's work (and merged). What the worker itself changed is read before the check runs and
left as it is."""

from __future__ import annotations

import asyncio
from pathlib import Path

from executor.projects.git import Git, GitError
from executor.projects.worktrees import scrub_store, store_of

MAX_LISTED = 100  # of the paths undone, in the check's record


async def changed_paths(worktree: Path) -> dict[str, str]:
    """Each path of the worktree that differs from its HEAD (ignored ones aside), with its two-letter status.

    The worker, and the check after it, could write the worktree's admin files in its repository: a link planted
    as its `index` would have git's lock-and-rename write the index (paths a worker named, a key line among them)
    wherever the link points. So the repository is scrubbed first (no link, or GitError), and `status` takes no
    optional lock (it does not rewrite the index)."""
    if (store := store_of(worktree)).is_dir():
        await asyncio.to_thread(scrub_store, store)  # a walk of what the worker made: off the event loop
    out = (await (await Git.at(worktree))("--no-optional-locks", "status", "--porcelain=v1", "-z",
                                         "--untracked-files=all")).out
    entries, found = out.split("\0"), {}
    i = 0
    while i < len(entries):
        entry = entries[i]
        if len(entry) > 3:
            found[entry[3:]] = entry[:2]
            if entry[0] in "RC":  # a rename or copy: its origin is the next entry
                i += 1
        i += 1
    return found


async def undo_check(worktree: Path, before: dict[str, str]) -> list[str]:
    """What a check left in the worktree, undone, so it is not committed as the worker's work: the files it made
    removed (and the directories they emptied), the files it changed that were as HEAD has them restored. What the
    worker changed (`before`, read before the check ran) stays as the worker left it. The paths undone."""
    root = worktree.resolve()
    undone = []
    # (changed_paths scrubs the repository first: `checkout` below writes the index the check may have linked)
    for path, status in (await changed_paths(worktree)).items():
        if path in before:
            continue
        target = worktree / path
        if status == "??":
            if not target.resolve().is_relative_to(root) and not target.is_symlink():
                continue  # (git names nothing outside its tree; never act past it)
            target.unlink(missing_ok=True)
            for parent in target.parents:  # the directories it made, left empty
                if parent == worktree or not parent.is_relative_to(worktree):
                    break
                try:
                    parent.rmdir()
                except OSError:
                    break
        else:
            await (await Git.at(worktree))("checkout", "HEAD", "--", path)
        undone.append(path)
    return undone


async def undo(worktree: Path, before: dict[str, str]) -> list[str] | str:
    """`undo_check`, its failure said rather than raised (the record carries it, and the changes then show it)."""
    try:
        return (await undo_check(worktree, before))[:MAX_LISTED]
    except (GitError, OSError) as exc:
        return f"not undone: {exc}"
