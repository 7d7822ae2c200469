"""Each spawn's limits (executor/sandbox/limits.py): the settings, how a hit is read from a cgroup's counters, where
the cgroups go, the rlimits left where none can be made, and the sandbox's sized /tmp."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from executor.run import stream
from executor.run.outcome import end_outcome
from executor.sandbox import limits
from executor.sandbox.bwrap import SandboxPolicy, SpawnBox, wrap
from executor.sandbox.limits import CgroupTree, SpawnLimits
from petal_dispatch.config import Settings

GiB, MiB = 1 << 30, 1 << 20


@pytest.mark.parametrize(("text", "size"), [
    ("2G", 2 * GiB), ("512M", 512 * MiB), ("64k", 64 << 10), ("2GiB", 2 * GiB), ("1.5G", 3 * GiB // 2),
    ("4096", 4096), ("max", None), ("infinity", None), ("", None)])
def test_sizes_read_as_systemd_reads_them(text: str, size: int | None) -> None:
    assert limits.parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "-1", "0", "G"])
def test_a_size_that_is_none_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        limits.parse_size(text)


def test_the_settings_and_their_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings()
    assert (s.spawn_pids_max, s.spawn_memory_max, s.spawn_tmp_size) == (1024, 4 * GiB, GiB)
    monkeypatch.setenv("PETAL_SPAWN_PIDS_MAX", "256")
    monkeypatch.setenv("PETAL_SPAWN_MEMORY_MAX", "2G")
    monkeypatch.setenv("PETAL_SPAWN_TMP_SIZE", "max")
    s = Settings()
    assert (s.spawn_pids_max, s.spawn_memory_max, s.spawn_tmp_size) == (256, 2 * GiB, None)
    monkeypatch.setenv("PETAL_SPAWN_PIDS_MAX", "4")  # the CLI alone runs a dozen threads
    with pytest.raises(ValueError):
        Settings()


def test_a_hit_is_an_oom_kill_or_a_refused_fork_not_a_limit_merely_reached() -> None:
    v2_reached = "low 0\nhigh 0\nmax 812\noom 0\noom_kill 0\noom_group_kill 0\n"
    assert limits.limit_hit({"memory.events": v2_reached, "pids.events": "max 0\n"}) is None
    assert limits.limit_hit({"memory.events": v2_reached.replace("oom_kill 0", "oom_kill 1")}) == limits.MEMORY_LIMIT
    assert limits.limit_hit({"memory.events": v2_reached.replace("oom_group_kill 0", "oom_group_kill 3")}
                            ) == limits.MEMORY_LIMIT
    assert limits.limit_hit({"pids.events": "max 17\n"}) == limits.PIDS_LIMIT
    v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
    assert limits.limit_hit({"memory.oom_control": v1, "pids.events": "max 2\n"}) == limits.MEMORY_LIMIT


MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_the_cgroups_of_this_process_are_found_in_either_version() -> None:
    hybrid = "8:pids:/\n4:memory:/machine/abc\n0::/\n"
    assert limits.v1_bases(hybrid, MOUNTINFO) == {"pids": Path("/sys/fs/cgroup/pids"),
                                                  "memory": Path("/sys/fs/cgroup/memory/machine/abc")}
    unified = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    service = "0::/system.slice/petal-executor.service\n"
    assert limits.v2_base(service, unified) == Path("/sys/fs/cgroup/system.slice/petal-executor.service")
    # once moved into its leaf, the executor still makes its spawns' cgroups beside the leaf
    moved = "0::/system.slice/petal.service/petal-executor\n"
    assert limits.v2_base(moved, unified) == Path("/sys/fs/cgroup/system.slice/petal.service")
    assert limits.v1_bases(service, unified) == {}


def test_a_spawn_cgroup_gets_its_limits_written(tmp_path: Path) -> None:
    tree = CgroupTree(2, {"pids": tmp_path, "memory": tmp_path})
    cgroup = tree.make("k1", SpawnLimits(pids_max=64, memory_max=GiB))
    d = tmp_path / "petal-spawn-k1"
    assert cgroup.dirs == (d,) and cgroup.procs == (d / "cgroup.procs",)
    assert (d / "pids.max").read_text() == "64" and (d / "memory.max").read_text() == str(GiB)
    assert (d / "memory.oom.group").read_text() == "1"  # an OOM kill ends the whole spawn
    v1 = CgroupTree(1, {"pids": tmp_path / "pids", "memory": tmp_path / "memory"})
    for base in v1.bases.values():
        base.mkdir()
    cgroup = v1.make("k2", SpawnLimits(pids_max=64, memory_max=GiB))
    assert len(cgroup.dirs) == 2 and cgroup.kill_file is None
    assert (tmp_path / "memory" / "petal-spawn-k2" / "memory.limit_in_bytes").read_text() == str(GiB)


def test_a_cgroup_that_refuses_its_removal_a_while_is_asked_again_until_the_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    busy = {"memory": 3}  # a v1 memory cgroup: EBUSY a few times after its last process left
    real = Path.rmdir

    def rmdir(self: Path) -> None:
        if busy.get(self.name, 0) > 0:
            busy[self.name] -= 1
            raise OSError(16, "Device or resource busy")
        real(self)

    monkeypatch.setattr(Path, "rmdir", rmdir)
    dirs = (tmp_path / "pids", tmp_path / "memory")
    for d in dirs:
        d.mkdir()
    assert limits.SpawnCgroup(dirs).remove(timeout_s=5) and not any(d.exists() for d in dirs)
    # one that stays busy is said left at the deadline
    (tmp_path / "memory").mkdir()
    busy["memory"] = 10_000
    assert not limits.SpawnCgroup((tmp_path / "memory",)).remove(timeout_s=0.2)


def test_what_no_cgroup_limits_is_left_to_rlimits() -> None:
    lim = SpawnLimits(pids_max=300, memory_max=2 * GiB)
    assert limits.rlimits_for(lim, None) == (300, 2 * GiB)
    assert limits.rlimits_for(lim, CgroupTree(1, {"pids": Path("/x")})) == (None, 2 * GiB)
    assert limits.rlimits_for(lim, CgroupTree(2, {"pids": Path("/x"), "memory": Path("/x")})) == (None, None)
    # the CLI aborts under less writable memory than it maps at its start
    assert limits.rlimits_for(SpawnLimits(memory_max=256 * MiB), None)[1] == limits.RLIMIT_DATA_FLOOR


def test_the_entry_joins_the_cgroups_and_sets_the_rlimits_before_the_command(tmp_path: Path) -> None:
    assert limits.enter_argv("/bin/bash", (), ["bwrap", "x"]) == ["bwrap", "x"]
    procs = tmp_path / "cgroup.procs"
    argv = limits.enter_argv("/bin/bash", [procs], ["/bin/bash", "-c", "echo $$; ulimit -u; ulimit -d"],
                             nproc=300, data=2 * GiB)
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=20).stdout.split()
    assert out[0] == procs.read_text().strip()  # the command is the process that joined (exec)
    assert out[1:] == ["300", str(2 * GiB // 1024)]
    unwritable = tmp_path / "missing" / "cgroup.procs"
    res = subprocess.run(limits.enter_argv("/bin/bash", [unwritable], ["/bin/true"]), capture_output=True,
                         check=False, timeout=20)
    assert res.returncode == 125  # no spawn runs outside its cgroup


def test_the_sandboxs_tmp_is_sized() -> None:
    policy = SandboxPolicy(bwrap="/usr/bin/bwrap", socat="/usr/bin/socat", bash="/bin/bash",
                           limits=SpawnLimits(tmp_size=16 * MiB))
    args = wrap(policy, SpawnBox(workdir=Path("/w")), ["claude"])
    at = args.index("/tmp")
    assert args[at - 3:at + 1] == ["--size", str(16 * MiB), "--tmpfs", "/tmp"]
    unsized = wrap(SandboxPolicy(bwrap="b", socat="s", bash="/bin/bash", limits=SpawnLimits(tmp_size=None)),
                   SpawnBox(workdir=Path("/w")), ["claude"])
    assert "--size" not in unsized


def test_a_spawn_ended_at_a_limit_crashed_with_the_limit_as_its_reason() -> None:
    finished = stream.TurnFacts()
    finished.feed(stream.classify(b'{"type":"result","subtype":"success","is_error":false}'))
    for reason in (limits.PIDS_LIMIT, limits.MEMORY_LIMIT):
        assert end_outcome(-9, stream.TurnFacts(), reason) == stream.Outcome("crashed", reason)
        # the CLI outlived the process the limit ended and finished: still cut short
        assert end_outcome(0, finished, reason) == stream.Outcome("crashed", reason)


def test_a_delegated_v2_subtree_is_made_ready_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its processes into a leaf (a cgroup with processes in it gives its children no controllers), then pids and
    memory enabled for the children; a cgroup not delegated is left alone."""
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("\n")
    (tmp_path / "cgroup.procs").write_text("4242\n")
    assert limits._setup_v2(tmp_path) is None  # a test runs as root or owns no delegated cgroup: not delegated
    monkeypatch.setattr(limits, "_delegated", lambda base: True)
    tree = limits._setup_v2(tmp_path)
    assert tree == CgroupTree(2, {"pids": tmp_path, "memory": tmp_path})
    assert (tmp_path / "petal-executor" / "cgroup.procs").read_text() == "4242"
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+pids +memory"
    (tmp_path / "cgroup.controllers").write_text("cpu io\n")  # the controllers not delegated: no tree
    (tmp_path / "cgroup.subtree_control").write_text("\n")
    assert limits._setup_v2(tmp_path) is None
