"""A project worker's git worktree as its sandbox mounts it (bwrap.py): what a commit writes in the repository
read-write, and what git obeys (config, hooks, the worktree's links, HEAD, alternates) read-only, so nothing a worker
writes runs later outside its sandbox. Only the layout the executor makes counts (executor/projects/worktrees.py)."""

from __future__ import annotations

from pathlib import Path


def git_parts(workdir: Path) -> tuple[list[Path], list[Path]]:
    """For a git worktree: (what a commit writes in the repository, what git obeys and must stay read-only).

    A worktree's `.git` is a file naming its directory under the repository's `.git/worktrees/`; a commit there
    writes objects, its branch ref and reflogs in the repository. The repository's config and hooks, and the
    worktree's links to it (`.git`, `commondir`, `gitdir`), stay read-only: a worker that could change them
    would choose the config (an fsmonitor command, a hook) of the next git command the executor runs there."""
    dot_git = workdir / ".git"
    if not dot_git.is_file() or dot_git.is_symlink():
        return [], []
    try:
        text = dot_git.read_text()
    except OSError:
        return [], []
    if not text.startswith("gitdir:"):
        return [], []
    gitdir = (workdir / text.removeprefix("gitdir:").strip()).resolve()
    common_file = gitdir / "commondir"
    try:
        common = (gitdir / common_file.read_text().strip()).resolve() if common_file.is_file() else gitdir
    except OSError:
        return [], []
    # Only the layout the executor makes for a project worker (executor/projects/worktrees.py `store_of`): its
    # private repository `<tree>.git` beside the tree, the worktree's directory under its `worktrees/`. A `.git`
    # file is something any spawn can write in its tree (a shared working directory's next turn would obey it):
    # never let it choose what the next sandbox mounts.
    store = workdir.with_name(f"{workdir.name}.git")
    if store.is_symlink() or not store.is_dir() or common != store.resolve() or gitdir.parent != common / "worktrees":
        return [], []
    writable = [gitdir, common / "objects", common / "logs"]
    branch = _branch_dir(gitdir, common)
    if branch is not None:
        writable.append(branch)
    # alternates would lend the repository objects from wherever a worker points them
    (common / "objects" / "info").mkdir(parents=True, exist_ok=True)
    # HEAD too: pointed at the base branch, the executor's commit of uncommitted work would land there
    readonly = [common, dot_git, gitdir / "commondir", gitdir / "gitdir", gitdir / "config.worktree",
                gitdir / "hooks", gitdir / "HEAD", common / "objects" / "info", *_alternates(common / "objects")]
    return [p for p in writable if p.exists()], [p for p in readonly if p.exists()]


def _alternates(objects: Path, depth: int = 0) -> list[Path]:
    """The object stores a worker's private repository borrows (executor/projects/worktrees.py: the project's),
    read-only: seen, so the base commit's objects are there, but never written. The alternates file is the
    executor's, read-only in every spawn; git follows alternates five deep, and so does this."""
    try:
        lines = (objects / "info" / "alternates").read_text().splitlines()
    except OSError:
        return []
    found = [(objects / line.strip()).resolve() for line in lines if line.strip() and not line.startswith("#")]
    found = [p for p in found if p.is_dir()]
    return found + [q for p in found if depth < 4 for q in _alternates(p, depth + 1)]


def _branch_dir(gitdir: Path, common: Path) -> Path | None:
    """The directory of the worktree's branch ref (a commit writes `<ref>.lock` beside it)."""
    try:
        head = (gitdir / "HEAD").read_text().strip()
    except OSError:
        return None
    if not head.startswith("ref: refs/heads/"):
        return None
    ref = common / head.removeprefix("ref: ")
    heads = common / "refs" / "heads"
    # a name with `..` (or a link on the way) would bind a directory outside the repository read-write
    if ".." in Path(head.removeprefix("ref: ")).parts or not ref.parent.resolve().is_relative_to(heads.resolve()):
        return None
    ref.parent.mkdir(parents=True, exist_ok=True)
    return ref.parent
