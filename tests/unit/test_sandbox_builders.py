"""The sandbox's pure builders (executor/sandbox/): the bubblewrap command line for a spawn's box, the git parts a
worktree's spawn may write, the proxy's allowlist and the addresses the CLI itself needs. Nothing is started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from executor.sandbox import bwrap, cliconfig, git_view, http1
from executor.sandbox.bwrap import Mount, SandboxPolicy, SpawnBox, wrap
from executor.sandbox.gateway import Allow, parse_allowlist
from executor.sandbox.limits import SpawnLimits

pytestmark = pytest.mark.unit

POLICY = SandboxPolicy(bwrap="/usr/bin/bwrap", socat="/usr/bin/socat", bash="/bin/bash",
                       limits=SpawnLimits(tmp_size=None))


def _after_double_dash(args: list[str]) -> list[str]:
    return args[args.index("--") + 1:]


def _mount_pairs(args: list[str], kind: str) -> list[tuple[str, ...]]:
    found = []
    for i, a in enumerate(args):
        if a == kind:
            found.append(tuple(args[i + 1:i + (2 if kind == "--tmpfs" else 3)]))
    return found


# ---- the command line ------------------------------------------------------------------------------------

def test_a_mount_binds_its_source_where_it_appears_and_a_tmpfs_takes_only_a_place() -> None:
    assert Mount("--tmpfs", Path("/h")).args() == ["--tmpfs", "/h"]
    assert Mount("--bind", Path("/w")).args() == ["--bind", "/w", "/w"]
    assert Mount("--bind", Path("/in"), Path("/out")).args() == ["--bind", "/out", "/in"]


def test_the_box_drops_every_privilege_and_namespace_before_anything_of_its_own() -> None:
    args = wrap(POLICY, SpawnBox(workdir=Path("/w")), ["claude", "-p"])
    head = args[:args.index("--ro-bind")]
    assert head[0] == "/usr/bin/bwrap" and "--die-with-parent" in head
    for flag in ("--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-net", "--unshare-ipc"):
        assert flag in head
    assert head[head.index("--cap-drop") + 1] == "ALL"
    assert args[args.index("--chdir") + 1] == "/w"
    assert args[-2:] == ["claude", "-p"]  # the command itself last, after the launcher's "--"


def test_a_parent_is_mounted_before_what_lies_inside_it_whatever_the_order_given(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    policy = SandboxPolicy(bwrap="b", socat="s", bash="/bin/bash", hidden=(data,), limits=SpawnLimits(tmp_size=None))
    tree = data / "worktrees" / "t1"  # a worktree inside the hidden data directory stays visible
    args = wrap(policy, SpawnBox(workdir=tree, hidden=(tree / "secret",)), [])
    order = [a for a in args if a in (str(data), str(tree), str(tree / "secret"))]
    assert order.index(str(data)) < order.index(str(tree)) < order.index(str(tree / "secret"))


def test_a_hidden_directory_that_is_a_link_or_missing_gets_no_tmpfs(tmp_path: Path) -> None:
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    policy = SandboxPolicy(bwrap="b", socat="s", bash="/bin/bash", hidden=(real, link, tmp_path / "none"),
                           limits=SpawnLimits(tmp_size=None))
    tmpfs = _mount_pairs(wrap(policy, SpawnBox(workdir=Path("/w")), []), "--tmpfs")
    assert (str(real),) in tmpfs and (str(link),) not in tmpfs and (str(tmp_path / "none"),) not in tmpfs


def test_ports_are_forwarded_in_and_the_proxy_only_with_a_gateway() -> None:
    box = SpawnBox(workdir=Path("/w"), ports=(8002, 9000), sockets_dir=Path("/run/gw"))
    args = wrap(POLICY, box, ["claude"])
    launcher = args[args.index("petal-sandbox") + 1:]
    assert launcher == ["8002=8002.sock", "9000=9000.sock", f"{bwrap.PROXY_PORT}=proxy.sock", "--", "claude"]
    assert ("/run/gw", bwrap.SOCKETS_INSIDE) in _mount_pairs(args, "--ro-bind")  # connected to, never written
    bare = wrap(POLICY, SpawnBox(workdir=Path("/w"), ports=(8002,)), ["claude"])
    assert bare[bare.index("petal-sandbox") + 1:] == ["8002=8002.sock", "--", "claude"]


def test_a_sandbox_started_ahead_reads_its_command_later_and_is_never_given_one_too() -> None:
    args = wrap(POLICY, SpawnBox(workdir=Path("/w")), [], argv_fd=5)
    at = args.index("ARGV_FD")
    assert args[at - 1:at + 2] == ["--setenv", "ARGV_FD", "5"] and args[-1] == "--"
    assert "ARGV_FD" not in wrap(POLICY, SpawnBox(workdir=Path("/w")), ["claude"])
    with pytest.raises(ValueError, match="not both"):
        wrap(POLICY, SpawnBox(workdir=Path("/w")), ["claude"], argv_fd=5)


def test_what_a_spawn_may_write_read_or_not_see_is_mounted_as_such() -> None:
    box = SpawnBox(workdir=Path("/w"), writable=(Path("/cfg"),), readonly=(Path("/cfg/settings.json"),),
                   hidden=(Path("/cfg/projects"),), bound=((Path("/cfg/projects/-w"), Path("/cfg/.spawns/k")),))
    args = wrap(POLICY, box, [])
    assert ("/cfg", "/cfg") in _mount_pairs(args, "--bind")
    assert ("/cfg/.spawns/k", "/cfg/projects/-w") in _mount_pairs(args, "--bind")
    assert ("/cfg/settings.json", "/cfg/settings.json") in _mount_pairs(args, "--ro-bind")
    assert ("/cfg/projects",) in _mount_pairs(args, "--tmpfs")
    # the kernel's knobs stay read-only, and the spawn has a /tmp of its own
    assert ("/proc/sys", "/proc/sys") in _mount_pairs(args, "--ro-bind") and ("/tmp",) in _mount_pairs(args, "--tmpfs")


# ---- a worktree's git parts (the executor's layout only) ------------------------------------------------

def _layout(tmp_path: Path, head: str = "ref: refs/heads/petal/t1\n") -> tuple[Path, Path, Path]:
    """The layout executor/projects/worktrees.py makes: `<tree>.git` beside the tree, the worktree's directory
    under its worktrees/, the tree's .git file naming it. Made by hand: no git is run."""
    tree, store = tmp_path / "wt", tmp_path / "wt.git"
    gitdir = store / "worktrees" / "wt"
    for d in (tree, gitdir, store / "objects", store / "logs", store / "refs" / "heads"):
        d.mkdir(parents=True, exist_ok=True)
    (tree / ".git").write_text(f"gitdir: {gitdir}\n")
    (gitdir / "commondir").write_text("../..\n")
    (gitdir / "gitdir").write_text(f"{tree}/.git\n")
    (gitdir / "HEAD").write_text(head)
    return tree, store, gitdir


def test_the_executors_layout_gets_its_objects_logs_and_branch_writable_and_its_config_read_only(
        tmp_path: Path) -> None:
    tree, store, gitdir = _layout(tmp_path)
    writable, readonly = git_view.git_parts(tree)
    assert writable == [gitdir, store / "objects", store / "logs", store / "refs" / "heads" / "petal"]
    assert store in readonly and tree / ".git" in readonly and gitdir / "HEAD" in readonly
    assert store / "objects" / "info" in readonly  # alternates are the executor's, never a worker's


def test_a_dot_git_file_naming_another_repository_mounts_nothing(tmp_path: Path) -> None:
    tree, _, _ = _layout(tmp_path)
    elsewhere = tmp_path / "other.git" / "worktrees" / "wt"
    elsewhere.mkdir(parents=True)
    (elsewhere / "commondir").write_text("../..\n")
    (tree / ".git").write_text(f"gitdir: {elsewhere}\n")
    assert git_view.git_parts(tree) == ([], [])


def test_no_dot_git_file_a_directory_or_a_link_in_its_place_mounts_nothing(tmp_path: Path) -> None:
    tree, _, gitdir = _layout(tmp_path)
    (tree / ".git").unlink()
    assert git_view.git_parts(tree) == ([], [])
    (tree / ".git").symlink_to(gitdir / "gitdir")
    assert git_view.git_parts(tree) == ([], [])
    (tree / ".git").unlink()
    (tree / ".git").write_text("not a gitdir line\n")
    assert git_view.git_parts(tree) == ([], [])


def test_a_branch_named_with_dot_dot_leaves_the_branch_out_but_keeps_the_rest(tmp_path: Path) -> None:
    tree, store, gitdir = _layout(tmp_path, head="ref: refs/heads/../../../../outside\n")
    writable, _ = git_view.git_parts(tree)
    assert writable == [gitdir, store / "objects", store / "logs"]
    assert not (tmp_path / "outside").exists()
    tree2, store2, gitdir2 = _layout(tmp_path / "detached", head="0123456789abcdef0123456789abcdef01234567\n")
    assert git_view.git_parts(tree2)[0] == [gitdir2, store2 / "objects", store2 / "logs"]  # a detached HEAD: no branch


def test_the_object_stores_a_repository_borrows_are_read_only(tmp_path: Path) -> None:
    tree, store, _ = _layout(tmp_path)
    project = tmp_path / "project" / ".git" / "objects"
    project.mkdir(parents=True)
    (store / "objects" / "info").mkdir(parents=True)
    (store / "objects" / "info" / "alternates").write_text(f"# the project's\n{project}\n{tmp_path}/gone\n")
    _, readonly = git_view.git_parts(tree)
    assert project in readonly and tmp_path / "gone" not in readonly


# ---- the allowlist and the CLI's own addresses ----------------------------------------------------------

@pytest.mark.parametrize(("entry", "host", "port"), [
    ("Example.COM", "example.com", None), ("example.com:8443", "example.com", 8443), ("*.pypi.org", "*.pypi.org", None),
    ("[::1]:8000", "::1", 8000), ("[2001:db8::1]", "2001:db8::1", None), ("10.0.0.5", "10.0.0.5", None),
    ("  spaced.org  ", "spaced.org", None),
])
def test_an_allowlist_entry_is_a_host_with_or_without_a_port(entry: str, host: str, port: int | None) -> None:
    assert Allow.parse(entry) == Allow(host, port)


@pytest.mark.parametrize("entry", ["", "   ", "host:port", "example.com:"])
def test_an_allowlist_entry_that_says_no_host_or_port_is_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        Allow.parse(entry)


def test_an_entry_covers_its_host_on_its_port_and_a_wildcard_only_subdomains() -> None:
    assert Allow("example.com", None).covers("example.com", 443) and Allow("example.com", None).covers("example.com", 80)
    assert not Allow("example.com", None).covers("api.example.com", 443)
    assert not Allow("example.com", 443).covers("example.com", 80)
    wildcard = Allow("*.pypi.org", None)
    assert wildcard.covers("files.pypi.org", 443) and wildcard.covers("a.b.pypi.org", 443)
    assert not wildcard.covers("pypi.org", 443) and not wildcard.covers("evilpypi.org", 443)


def test_blank_entries_are_skipped_and_an_address_entry_knows_it_is_one() -> None:
    allow = parse_allowlist(["a.org", " ", "", "127.0.0.2:80"])
    assert [a.host for a in allow] == ["a.org", "127.0.0.2"]
    assert allow[1].is_address and not allow[0].is_address and Allow("::1", None).is_address


@pytest.mark.parametrize(("url", "found"), [
    ("http://127.0.0.1:8002/harness-mcp/", (8002, ("127.0.0.1", 8002))), ("http://localhost/x", (80, ("127.0.0.1", 80))),
    ("https://localhost", (443, ("127.0.0.1", 443))), ("http://[::1]:9/", (9, ("::1", 9))),
    ("https://api.anthropic.com", (None, None)), (None, (None, None)), ("", (None, None)),
])
def test_a_loopback_url_the_cli_needs_is_forwarded_in_and_another_is_not(
        url: str | None, found: tuple[int | None, tuple[str, int] | None]) -> None:
    assert bwrap.loopback_port(url) == found


def test_the_cli_reaches_its_model_api_and_its_login_refresh_through_the_proxy() -> None:
    assert bwrap.cli_hosts({}) == [*bwrap.CLI_AUTH_HOSTS, "api.anthropic.com:443"]
    assert bwrap.cli_hosts({"ANTHROPIC_BASE_URL": "http://gateway.corp:8080/v1"})[-1] == "gateway.corp:8080"
    # a model server on loopback is forwarded as a port, not allowed through the proxy
    assert bwrap.cli_hosts({"ANTHROPIC_BASE_URL": "http://127.0.0.1:9999"}) == list(bwrap.CLI_AUTH_HOSTS)


def test_inside_the_sandbox_everything_not_on_loopback_goes_through_the_proxy() -> None:
    env = bwrap.proxy_env()
    assert {env[k] for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY")} == {
        f"http://127.0.0.1:{bwrap.PROXY_PORT}"}
    assert set(env["NO_PROXY"].split(",")) == {"127.0.0.1", "localhost", "::1"} and env["no_proxy"] == env["NO_PROXY"]


def test_a_path_is_visible_unless_a_hidden_directory_holds_it(tmp_path: Path) -> None:
    policy = SandboxPolicy(bwrap="b", socat="s", bash="/bin/bash", hidden=(tmp_path / "data",))
    assert not bwrap.visible(tmp_path / "data", policy) and not bwrap.visible(tmp_path / "data" / "x", policy)
    assert bwrap.visible(tmp_path / "data2", policy) and bwrap.visible(tmp_path, policy)


def test_the_clis_install_root_is_its_npm_prefix_or_its_directory(tmp_path: Path) -> None:
    npm = tmp_path / "cache" / "node_modules" / "@anthropic-ai" / "claude-code"
    npm.mkdir(parents=True)
    (npm / "cli.js").write_text("#!/bin/sh\n")
    (npm / "cli.js").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "claude").symlink_to(npm / "cli.js")
    assert bwrap.install_root("claude", str(bin_dir)) == tmp_path / "cache"
    (tmp_path / "native").mkdir()
    (tmp_path / "native" / "claude").write_text("#!/bin/sh\n")
    (tmp_path / "native" / "claude").chmod(0o755)
    assert bwrap.install_root("claude", str(tmp_path / "native")) == tmp_path / "native"
    assert bwrap.install_root("claude", str(tmp_path / "empty")) is None


def test_a_spawns_state_copy_holds_only_the_login_keys_and_replaces_a_planted_link(tmp_path: Path) -> None:
    user = tmp_path / "user.json"
    user.write_text('{"userID": "u", "primaryApiKey": "k", "mcpServers": {"x": {}}, "projects": {}}')
    victim = tmp_path / "victim"
    victim.write_text("keep")
    copy = tmp_path / "copy.json"
    copy.symlink_to(victim)  # whatever was there is replaced, never written through
    cliconfig.private_state(user, copy)
    assert not copy.is_symlink() and victim.read_text() == "keep"
    assert copy.read_text() == '{"userID": "u", "primaryApiKey": "k"}'
    assert os.stat(copy).st_mode & 0o777 == 0o600
    cliconfig.private_state(tmp_path / "missing.json", copy)
    assert copy.read_text() == "{}"


# ---- the proxy's authorities ----------------------------------------------------------------------------

@pytest.mark.parametrize(("authority", "found"), [
    ("example.com", ("example.com", 80)), ("example.com:8080", ("example.com", 8080)), ("[::1]:443", ("::1", 443)),
    ("[::1]", ("::1", 80)), ("example.com:http", ("example.com:http", 80)),
])
def test_an_authority_splits_into_host_and_port_with_the_default_port(authority: str, found: tuple[str, int]) -> None:
    assert http1.split_host_port(authority, 80) == found


def test_a_header_is_found_whatever_its_case_and_one_that_may_appear_once_is_refused_twice() -> None:
    head = http1.Head("GET", "/", "HTTP/1.1", (("Accept", "a"), ("ACCEPT", "b"), ("Host", "x")))
    assert head.values("accept") == ["a", "b"] and head.one("host") == "x" and head.one("missing") is None
    with pytest.raises(http1.BadRequest, match="2 accept headers"):
        head.one("accept")
