"""What a spawn writes in git metadata never steers the executor: a `.git` file in a shared working directory does
not choose the next sandbox's mounts, links planted in a worker's repository are not written through by the
executor's commit or by the check's status and undo, and a repository's `protocol.ext.allow` does not turn the
settlement's fetch into a command.
Each with its negative control (the same plant against the layout, the plain git, or the config the fix
overrides)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from executor.projects import git, worktrees
from executor.run import check
from executor.sandbox import git_view
from tests.e2e.test_isolation_git import _git, _recorded, _repo


def _plant_dot_git(tree: Path, head: str) -> Path:
    """What a spawn in `tree` can write: a `.git` file naming a directory of its own, and that directory."""
    fake = tree / "g"
    (fake / "refs" / "heads").mkdir(parents=True)
    (fake / "HEAD").write_text(head)
    (tree / ".git").write_text("gitdir: g\n")
    return fake


def test_a_dot_git_file_a_spawn_wrote_in_a_shared_working_directory_mounts_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home" / "user"
    home.mkdir(parents=True)
    tree = tmp_path / "workdir"
    tree.mkdir()
    # enough `..` from the fake repository's refs/heads to reach the user's home
    climb = "/".join([".."] * len(tree.joinpath("g", "refs", "heads").parts))
    _plant_dot_git(tree, f"ref: refs/heads/{climb}{home}/x\n")
    writable, readonly = git_view.git_parts(tree)
    assert writable == [] and readonly == []
    assert not (home / "x").exists() and not any(home.iterdir())  # and nothing made on the host

    # without the layout check the same plant binds the home read-write (the channel: `_branch_dir` alone)
    assert git_view._branch_dir(tree / "g", tree / "g") is None  # noqa: SLF001 - its own `..` refusal
    raw_head = (tree / "g" / "HEAD").read_text().strip().removeprefix("ref: ")
    assert (tree / "g" / raw_head).parent.resolve() == home


async def test_the_executors_own_layout_still_gets_its_git_parts(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo", {"a.txt": "a\n"})
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    writable, readonly = git_view.git_parts(wt.path)
    store = worktrees.store_of(wt.path).resolve()
    assert store / "objects" in writable and any(p.parent == store / "refs" / "heads" for p in writable)
    assert store in readonly and wt.path / ".git" in readonly


async def test_links_a_worker_planted_in_its_repository_are_not_written_through_by_the_settlement(
        tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo", {"a.txt": "a\n"})
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    admin = Path(_git(wt.path, "rev-parse", "--absolute-git-dir"))
    victim = tmp_path / "credentials.json"
    victim.write_text('{"token": "keep me"}\n')
    (admin / "COMMIT_EDITMSG").symlink_to(victim)
    (wt.path / "left.txt").write_text("left uncommitted\n")
    with pytest.raises(git.GitError, match="symbolic link"):
        await _recorded(repo, wt)
    assert victim.read_text() == '{"token": "keep me"}\n'

    # negative control: the plain commit the settlement made before writes the message through the link
    subprocess.run(["git", "-C", str(wt.path), "add", "--all"], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(wt.path), "-c", "user.name=t", "-c", "user.email=t@example.invalid",
                    "commit", "--quiet", "-m", "clobbered"], check=True, capture_output=True)
    assert victim.read_text().startswith("clobbered")


async def test_the_settlements_reflogs_and_message_are_removed_before_it_commits(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo", {"a.txt": "a\n"})
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    store = worktrees.store_of(wt.path)
    (store / "logs" / "planted").mkdir(parents=True)
    (wt.path / "left.txt").write_text("left uncommitted\n")
    recorded = await _recorded(repo, wt)
    assert recorded["auto_commit"] and not (store / "logs" / "planted").exists()


async def test_a_repositorys_protocol_ext_allow_does_not_turn_the_fetch_into_a_command(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo", {"a.txt": "a\n"})
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    ran = tmp_path / "ext-ran"
    evil = tmp_path / "evil.sh"
    evil.write_text(f"#!/bin/sh\ntouch {ran}\nexit 1\n")
    # what a spawn that could write the project's config would add: ext:: allowed, every store rewritten to it
    _git(repo, "config", "protocol.ext.allow", "always")
    _git(repo, "config", f"url.ext::sh {evil} .insteadOf", f"{tmp_path / 'wt'}/")
    (wt.path / "left.txt").write_text("left uncommitted\n")
    with pytest.raises(git.GitError):
        await _recorded(repo, wt)
    assert not ran.exists()

    # negative control: the executor's environment without GIT_ALLOW_PROTOCOL runs the command
    env = {k: v for k, v in git.base_env().items() if k != "GIT_ALLOW_PROTOCOL"}
    env.update(git.config_env(git.FIXED_OVERRIDES))
    subprocess.run([git.program(), "-C", str(repo), "fetch", "--quiet", str(worktrees.store_of(wt.path)),
                    f"+refs/heads/{wt.branch}:refs/heads/{wt.branch}"], env=env, capture_output=True, check=False)
    assert ran.exists()


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPLANTEDKEYPLANTEDKEYPLANTEDKEYPLANTEDKE attacker"


async def _worker_with_a_key_named_file(tmp_path: Path) -> tuple[worktrees.Worktree, Path]:
    """A worker's commit, as its sandbox lets it: a tracked file that is also ignored, named with a key line (the
    index holds path names); and the victim a link to the index would make (a file in a directory that exists)."""
    repo = _repo(tmp_path / "repo", {"a.txt": "a\n"})
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    name = f"x\n{KEY}\ny"
    (wt.path / name).write_text("z\n")
    (wt.path / ".gitignore").write_text("x*\n")
    _git(wt.path, "add", "--force", "--", name, ".gitignore")
    _git(wt.path, "commit", "--quiet", "-m", "work")
    (tmp_path / "ssh").mkdir()
    return wt, tmp_path / "ssh" / "authorized_keys"


def _link_index(wt: worktrees.Worktree, victim: Path) -> str:
    """The shell that replaces the worktree's index with a link to `victim` (the worker's, or its check's code)."""
    return f'i="$(git rev-parse --absolute-git-dir)/index" && rm "$i" && ln -s {victim} "$i"'


async def test_an_index_link_the_check_plants_is_not_written_through_by_its_undo(tmp_path: Path) -> None:
    wt, victim = await _worker_with_a_key_named_file(tmp_path)
    record = await check.check_worktree(None, None, wt.path, _link_index(wt, victim), 30)
    assert record["passed"] is True  # it ran; what it left is not undone through the link
    assert isinstance(record["undone"], str) and "symbolic link" in record["undone"], record["undone"]
    assert not victim.exists()

    # negative control: the undo's checkout without the scrub writes the index, key line and all, at the victim
    name = f"x\n{KEY}\ny"
    subprocess.run(["git", "-C", str(wt.path), "checkout", "HEAD", "--", name], check=True, capture_output=True)
    assert f"\n{KEY}\n".encode() in victim.read_bytes()


async def test_an_index_link_the_worker_planted_stops_its_check_before_git_touches_it(tmp_path: Path) -> None:
    wt, victim = await _worker_with_a_key_named_file(tmp_path)
    subprocess.run(["bash", "-c", _link_index(wt, victim)], cwd=wt.path, check=True)
    ran = tmp_path / "check-ran"
    record = await check.check_worktree(None, None, wt.path, f"touch {ran}", 30)
    assert record["passed"] is False and record["exit_code"] is None and record["undone"] == []
    assert "not run" in record["tail"][0] and "symbolic link" in record["tail"][0], record["tail"]  # type: ignore[index]
    assert not ran.exists() and not victim.exists()


async def test_a_core_worktree_planted_in_the_checkout_does_not_carry_the_merge_elsewhere(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo", {"README.md": "hi\n"})
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("# the user's own\n")
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    (wt.path / ".bashrc").write_text("echo from-the-branch\n")  # the reviewed change: a project dotfile
    rec = await _recorded(repo, wt)
    # what a spawn whose workdir is the checkout can write in its .git: another work tree, everything ignored
    # there, and the tracked files marked skip-worktree (so the checkout looks clean)
    _git(repo, "config", "core.worktree", str(home))
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("*\n")
    _git(repo, "update-index", "--skip-worktree", "README.md")
    # the plant is live: git finding its layout takes the home for the work tree; named, the checkout
    assert (await (await git.Git.at(repo))("rev-parse", "--show-toplevel")).out.strip() == str(home)
    assert (await (await git.Git.checkout(repo))("rev-parse", "--show-toplevel")).out.strip() == str(repo)

    merged = await worktrees.merge(repo, wt.branch, rec["head_commit"], wt.base_commit, "merge")
    assert merged["fast_forward"]
    assert (home / ".bashrc").read_text() == "# the user's own\n"
    assert (repo / ".bashrc").read_text() == "echo from-the-branch\n"


async def test_a_merge_that_would_overwrite_an_ignored_file_of_the_checkout_is_refused(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo", {"README.md": "hi\n", ".gitignore": "notes.txt\n"})
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    (wt.path / "notes.txt").write_text("from the branch\n")
    _git(wt.path, "add", "--force", "notes.txt")
    _git(wt.path, "commit", "--quiet", "-m", "notes")
    rec = await _recorded(repo, wt)
    (repo / "notes.txt").write_text("the user's own notes\n")  # ignored: `git status` shows nothing
    before = _git(repo, "rev-parse", "HEAD")
    with pytest.raises(git.GitError, match="would overwrite notes.txt"):
        await worktrees.merge(repo, wt.branch, rec["head_commit"], wt.base_commit, "merge")
    assert (repo / "notes.txt").read_text() == "the user's own notes\n"
    assert _git(repo, "rev-parse", "HEAD") == before
    # negative control: git's own merge overwrites an ignored file without a word
    _git(repo, "merge", "--ff-only", "--quiet", rec["head_commit"])
    assert (repo / "notes.txt").read_text() == "from the branch\n"


@pytest.mark.parametrize("swap", ["link", "gitdir file"])
async def test_a_checkout_whose_dot_git_leads_elsewhere_is_still_the_work_tree_merged_into(tmp_path: Path,
                                                                                        swap: str) -> None:
    repo = _repo(tmp_path / "repo", {"README.md": "hi\n"})
    home = tmp_path / "home"
    home.mkdir()
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    (wt.path / "b.txt").write_text("b\n")
    rec = await _recorded(repo, wt)
    moved = (repo / ".git").rename(tmp_path / "elsewhere.git")  # with a work tree of its own named in its config
    _git(tmp_path, f"--git-dir={moved}", "config", "core.worktree", str(home))
    if swap == "link":
        (repo / ".git").symlink_to(moved)
    else:
        (repo / ".git").write_text(f"gitdir: {moved}\n")
    await worktrees.merge(repo, wt.branch, rec["head_commit"], wt.base_commit, "merge")
    assert (repo / "b.txt").read_text() == "b\n" and not any(home.iterdir())


async def test_a_directory_without_its_own_dot_git_is_not_merged_into(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo", {"README.md": "hi\n"})
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    (wt.path / "b.txt").write_text("b\n")
    rec = await _recorded(repo, wt)
    # the checkout's .git gone, a repository above it (a home kept in git) would be found instead
    (repo / ".git").rename(tmp_path / ".git")
    with pytest.raises(git.GitError, match="no .git"):
        await worktrees.merge(repo, wt.branch, rec["head_commit"], wt.base_commit, "merge")
    assert not (repo / "b.txt").exists()


async def test_a_huge_commit_is_diffed_only_as_far_as_the_record_keeps(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo", {"README.md": "hi\n"})
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    (wt.path / "big.txt").write_text("".join(f"line {i} of a file a worker committed\n" for i in range(400_000)))
    async with worktrees.repo_lock(repo):
        rec = await worktrees.changes(repo, wt.path, uuid.uuid4(), wt.branch, wt.base_commit, max_diff_chars=5_000)
    assert rec["diff_truncated"] and len(rec["diff"]) < 5_200 and "more than" in rec["diff"]
    assert rec["files"] == [{"path": "big.txt", "added": 400_000, "deleted": 0}]
    # the read stopped there: the command's output past the limit was never taken (negative control: without one)
    g = await git.Git.at(repo)
    capped = await g("diff", *git.NO_DRIVERS, wt.base_commit, rec["head_commit"], limit=1_000)
    whole = await g("diff", *git.NO_DRIVERS, wt.base_commit, rec["head_commit"])
    assert capped.cut and len(capped.out) == 1_000 and capped.rc == 0
    assert not whole.cut and len(whole.out) > 15_000_000


@pytest.mark.parametrize("bound", ["count", "bytes"])
async def test_a_worker_with_very_many_files_is_recorded_with_a_bounded_list_that_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: str) -> None:
    monkeypatch.setattr(worktrees, "MAX_FILES", 50 if bound == "count" else 10_000)
    monkeypatch.setattr(worktrees, "LIST_BYTES", 1_000_000 if bound == "count" else 2_000)
    repo = _repo(tmp_path / "repo", {"README.md": "hi\n"})
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    for i in range(200):  # a worker's tree can hold any number of files: the record reads a bounded list of them
        (wt.path / f"file-{i:04d}-{'x' * 40}.txt").write_text(f"{i}\n")
    rec = await _recorded(repo, wt)
    assert rec["files_truncated"] and 0 < len(rec["files"]) <= 50
    assert all(f["added"] == 1 and f["path"].endswith(".txt") for f in rec["files"])  # no entry cut mid-way
    assert len(rec["commits"]) == 1 and rec["auto_commit"]
    if bound == "bytes":
        assert rec["diffstat"].endswith("… the rest cut here (see the branch)\n")
