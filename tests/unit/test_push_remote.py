"""A project's push remote (shared/remotes.py) and what a push is made of (executor/projects/push.py): what the
user may give, where a path remote may not lie, and the command that pushes exactly the reviewed commit with
nothing of a repository's config or hooks in play."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from executor.projects import push
from shared import remotes

pytestmark = pytest.mark.unit


def test_a_remote_is_an_https_or_http_url_or_an_absolute_path() -> None:
    assert str(remotes.parse(" /srv/git/app.git ").path) == "/srv/git/app.git"
    url = remotes.parse("https://git.example.org/me/app.git")
    assert (url.scheme, url.host, url.port, url.allow_entry) == ("https", "git.example.org", 443, "git.example.org:443")
    assert remotes.parse("http://[::1]:8080/app.git").allow_entry == "[::1]:8080"


@pytest.mark.parametrize(("raw", "why"), [
    ("git@github.com:me/app.git", "ssh and git:// remotes are not supported"),
    ("ssh://git@host/app.git", "ssh and git:// remotes are not supported"),
    ("git://host/app.git", "ssh and git:// remotes are not supported"),
    ("https://me:token@host/app.git", "may not carry credentials"),
    ("https://host/app.git?x=1", "query or a fragment"),
    ("https://host", "names no repository"),
    ("https://host:99999/app.git", "invalid port"),
    ("file:///srv/app.git", "not a file:// URL"),
    ("app.git", "must be an https:// or http:// URL or the absolute path"),
    ("/srv/../etc/app.git", "may not contain '..'"),
    ("/srv/app.git\n", ""),  # stripped: a trailing newline is whitespace
    ("/srv/a\x00b", "control character"),
    ("-uhttps://x/y", "must be an https:// or http:// URL"),
    ("", "empty"),
])
def test_what_is_no_push_remote_is_refused_with_the_reason(raw: str, why: str) -> None:
    if not why:
        assert remotes.parse(raw).url == raw.strip()
        return
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace("?", r"\?")):
        remotes.parse(raw)


def test_a_path_remote_must_be_a_repository_outside_the_project_and_what_the_service_protects(tmp_path: Path) -> None:
    project = tmp_path / "repo"
    (project / ".git").mkdir(parents=True)
    bare = tmp_path / "remote.git"
    (bare / "objects").mkdir(parents=True)  # a bare repository's layout, as check_target reads it
    (bare / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "link.git").symlink_to(bare)
    assert push.check_target(remotes.parse(str(tmp_path / "link.git")), project) == bare.resolve()
    assert push.check_target(remotes.parse("https://h/app.git"), project) is None
    with pytest.raises(ValueError, match="not a git repository"):
        push.check_target(remotes.parse(str(tmp_path)), tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="the project's repository"):
        push.check_target(remotes.parse(str(project)), project)
    with pytest.raises(ValueError, match="inside the data directory"):
        push.check_target(remotes.parse(str(bare)), project, [("the data directory", tmp_path)])


def test_the_push_names_the_reviewed_commit_and_the_remotes_receive_pack_runs_no_hook(tmp_path: Path) -> None:
    commit = "c" * 40
    argv = push._push_argv(tmp_path / "push.git", remotes.parse("/srv/r.git"), Path("/srv/r.git"), commit, "petal/1")
    assert argv[-2:] == ["/srv/r.git", f"{commit}:refs/heads/petal/1"] and "--no-verify" in argv
    receive = shlex.split(next(a for a in argv if a.startswith("--receive-pack=")).split("=", 1)[1])
    assert receive[-1] == "receive-pack" and "core.hooksPath=/dev/null" in receive
    assert "receive.fsckObjects=true" in receive
    network = push._push_argv(tmp_path / "push.git", remotes.parse("https://h/a.git"), None, commit, "petal/1")
    assert network[-2] == "https://h/a.git" and not any(a.startswith("--receive-pack") for a in network)


async def test_only_a_commit_id_and_a_branch_name_are_pushed(tmp_path: Path) -> None:
    remote = remotes.parse(str(tmp_path))
    for commit, branch in (("HEAD", "petal/1"), ("c" * 40, "petal/../main"), ("c" * 40, "--force")):
        with pytest.raises(ValueError, match="not a commit and branch to push"):
            await push.push(None, tmp_path, remote, tmp_path, commit, branch)
