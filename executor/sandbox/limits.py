"""Each spawn's share of the machine: a pids limit, a memory limit and the size of its /tmp, so that one spawn (a
fork bomb, a memory hog, a /tmp fill) cannot starve its siblings or the executor.

Where the executor can make cgroups, each spawn gets one of its own, joined before bubblewrap starts (so everything
in the sandbox is in it): cgroup v2 in a delegated subtree (the systemd unit's `Delegate=yes`: the executor moves
itself into a leaf, `petal-executor`, and makes `petal-spawn-<key>` beside it), else the cgroup v1 `pids` and
`memory` hierarchies where the executor may write them (root in a container on a hybrid host). A spawn that hits
a limit is ended by the executor (`hit`, `kill`) and its task says which one. Where no cgroup can be made, rlimits
set before bubblewrap are what remains: RLIMIT_NPROC (which counts the service user's processes, not the spawn's:
see docs/deploy.md) and RLIMIT_DATA per process. The /tmp size is bubblewrap's `--size` either way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shared import logs

log = logs.get(__name__)

PIDS_LIMIT, MEMORY_LIMIT = "pids_limit", "memory_limit"  # why a spawn was ended (its task's status reason)
GiB = 1 << 30
# The CLI (a Bun binary, 2.1.328) maps about 0.8 GiB of writable memory at its start whatever it then uses (some
# 220 MiB resident): under an RLIMIT_DATA of 0.4 GiB it aborts, at 1 GiB it runs. RLIMIT_AS (it reserves 9.4 GiB of
# address space) is no measure of it at all: a 2 GiB one aborts even `claude --version`.
RLIMIT_DATA_FLOOR = GiB
SPAWN_PREFIX = "petal-spawn-"
EXECUTOR_LEAF = "petal-executor"
# Joins the spawn's cgroup(s) and sets its rlimits, then runs bubblewrap: before its first fork, so nothing of
# the sandbox starts outside. Arguments: cgroup.procs files, `nproc=N`, `data=KiB`, then `--` and the command.
_ENTER = r"""
while [ "$1" != -- ]; do
  case $1 in
    nproc=*) ulimit -u "${1#*=}" || exit 125 ;;
    data=*) ulimit -d "${1#*=}" || exit 125 ;;
    *) echo $$ >"$1" || exit 125 ;;
  esac
  shift
done
shift
exec "$@"
"""


@dataclass(frozen=True)
class SpawnLimits:
    """Per spawn; None: no limit of that kind."""

    pids_max: int | None = 1024
    memory_max: int | None = 4 * GiB
    tmp_size: int | None = GiB


def parse_size(text: str | int | None) -> int | None:
    """"4G", "512M", "64K" (binary units, as systemd's MemoryMax=) or bytes; "max", "infinity" or "" → None."""
    if text is None or isinstance(text, int):
        return text
    value = text.strip().lower().removesuffix("b").removesuffix("i")
    if value in ("", "max", "infinity"):
        return None
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(value[-1:], 1)
    number = value[:-1] if scale > 1 else value
    try:
        size = int(float(number) * scale)
    except ValueError:
        raise ValueError(f"{text!r} is not a size (e.g. 4G, 512M, or a number of bytes)") from None
    if size <= 0:
        raise ValueError(f"{text!r}: a size must be positive (or \"max\" for none)")
    return size


def limit_hit(files: dict[str, str]) -> str | None:
    """Which limit a spawn's cgroup hit, from its event files' text (pure): an OOM kill in it (v2 memory.events'
    oom_kill / oom_group_kill, v1 memory.oom_control's oom_kill), or a fork refused at pids.max (pids.events'
    max). A memory limit merely reached is not hit: the kernel reclaims (page cache) before it kills."""
    def counters(name: str) -> dict[str, int]:
        out = {}
        for line in files.get(name, "").splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[key] = int(value)
        return out

    memory = {**counters("memory.events"), **counters("memory.oom_control")}
    if memory.get("oom_kill", 0) > 0 or memory.get("oom_group_kill", 0) > 0:
        return MEMORY_LIMIT
    if counters("pids.events").get("max", 0) > 0:
        return PIDS_LIMIT
    return None


def enter_argv(bash: str, procs: Sequence[Path], argv: Sequence[str], *, nproc: int | None = None,
               data: int | None = None) -> list[str]:
    """`argv` run after joining the cgroups whose `cgroup.procs` files are `procs` and setting the rlimits."""
    if not procs and nproc is None and data is None:
        return list(argv)
    args = [str(p) for p in procs]
    if nproc is not None:
        args.append(f"nproc={nproc}")
    if data is not None:
        args.append(f"data={data // 1024}")
    return [bash, "-c", _ENTER, "petal-limits", *args, "--", *argv]


@dataclass(frozen=True)
class SpawnCgroup:
    """One spawn's cgroup: a directory in the v2 tree, or one per v1 hierarchy."""

    dirs: tuple[Path, ...]
    kill_file: Path | None = None  # v2's cgroup.kill (Linux 5.14+)

    @property
    def procs(self) -> tuple[Path, ...]:
        return tuple(d / "cgroup.procs" for d in self.dirs)

    def hit(self) -> str | None:
        files = {}
        for d in self.dirs:
            for name in ("memory.events", "memory.oom_control", "pids.events"):
                with contextlib.suppress(OSError):
                    files[name] = (d / name).read_text()
        return limit_hit(files)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for f in self.procs:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in f.read_text().split())
        return found

    def kill(self) -> None:
        """SIGKILL to everything in it: cgroup.kill at once where there is one, else each process, pass after
        pass (a fork bomb at its pids.max forks again as soon as one of its processes goes)."""
        if self.kill_file is not None:
            with contextlib.suppress(OSError):
                self.kill_file.write_text("1")
                return
        for _ in range(100):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def remove(self, timeout_s: float = 5.0) -> bool:
        """Its directories gone, once its processes are (a sandbox's init dies a moment after bubblewrap). A v1
        memory cgroup can refuse its removal (EBUSY) a while after its last process left: asked again until the
        deadline (the first start's sandbox probe left one on a busy machine)."""
        deadline = time.monotonic() + timeout_s
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.01)  # a process's exit is not a file event
        left = list(self.dirs)
        while True:
            left = [d for d in left if not _removed(d)]
            if not left or time.monotonic() >= deadline:
                return not left
            time.sleep(0.05)  # nothing says when the kernel lets it go


def _removed(d: Path) -> bool:
    try:
        d.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class CgroupTree:
    """Where this executor makes its spawns' cgroups: `bases` maps each controller it limits ("pids",
    "memory") to the directory its spawns' cgroups go in (one directory for both in v2)."""

    version: int
    bases: dict[str, Path]

    @property
    def controllers(self) -> frozenset[str]:
        return frozenset(self.bases)

    def make(self, key: str, limits: SpawnLimits) -> SpawnCgroup:
        """The spawn's cgroup with its limits written; OSError if it cannot be."""
        dirs: dict[Path, None] = {}
        made = []
        try:
            for controller, base in self.bases.items():
                d = base / f"{SPAWN_PREFIX}{key}"
                if d not in dirs:
                    d.mkdir()
                    made.append(d)
                    dirs[d] = None
                self._write_limits(controller, d, limits)
        except OSError:
            for d in made:
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
        paths = tuple(dirs)
        kill = paths[0] / "cgroup.kill" if self.version == 2 and (paths[0] / "cgroup.kill").exists() else None
        return SpawnCgroup(paths, kill)

    def _write_limits(self, controller: str, d: Path, limits: SpawnLimits) -> None:
        if controller == "pids" and limits.pids_max is not None:
            (d / "pids.max").write_text(str(limits.pids_max))
        if controller != "memory" or limits.memory_max is None:
            return
        if self.version == 2:
            (d / "memory.max").write_text(str(limits.memory_max))
            # an OOM kill ends the whole spawn, not one process the CLI would outlive and carry on without
            (d / "memory.oom.group").write_text("1")
            with contextlib.suppress(OSError):
                (d / "memory.swap.max").write_text("0")
        else:
            (d / "memory.limit_in_bytes").write_text(str(limits.memory_max))
            with contextlib.suppress(OSError):  # only with swap accounting on
                (d / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_max))

    def sweep(self, min_age_s: float = 60.0) -> None:
        """The empty cgroups of spawns of an executor that ended without removing them: only old ones, since
        another executor sharing this cgroup (tests run several in one process) makes each just before its spawn
        joins it."""
        now = time.time()
        for base in set(self.bases.values()):
            with contextlib.suppress(OSError):
                for d in base.glob(f"{SPAWN_PREFIX}*"):
                    with contextlib.suppress(OSError):
                        if now - d.stat().st_mtime > min_age_s:
                            d.rmdir()


def _mounts(mountinfo: str) -> list[tuple[str, str, set[str]]]:
    """(mount point, file system type, super options) of each line of /proc/self/mountinfo."""
    out = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if sep and len(fields) >= 5 and len(rest) >= 3:
            point = fields[4].replace("\\040", " ")
            out.append((point, rest[0], set(rest[2].split(","))))
    return out


def v2_base(cgroup: str, mountinfo: str) -> Path | None:
    """This process's cgroup v2 directory (its `petal-executor` leaf's parent when it already moved there)."""
    own = next((line[3:] for line in cgroup.splitlines() if line.startswith("0::")), None)
    mount = next((point for point, fstype, _ in _mounts(mountinfo) if fstype == "cgroup2"), None)
    if own is None or mount is None:
        return None
    base = Path(mount) / own.strip().lstrip("/")
    return base.parent if base.name == EXECUTOR_LEAF else base


def v1_bases(cgroup: str, mountinfo: str) -> dict[str, Path]:
    """This process's cgroup in each v1 hierarchy of the pids and memory controllers."""
    own = {}
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                own[controller] = parts[2]
    bases = {}
    for point, fstype, options in _mounts(mountinfo):
        for controller in ("pids", "memory"):
            if fstype == "cgroup" and controller in options and controller in own:
                bases[controller] = Path(point) / own[controller].lstrip("/")
    return bases


def _delegated(base: Path) -> bool:
    """A v2 cgroup handed to this process to manage: marked by systemd (Delegate=yes) or owned by this user."""
    for attr in ("trusted.delegate", "user.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(base, attr) == b"1":
                return True
    with contextlib.suppress(OSError):
        return os.geteuid() != 0 and base.stat().st_uid == os.geteuid()
    return False


def _setup_v2(base: Path) -> CgroupTree | None:
    """The delegated subtree made ready: every process in it moved into a leaf (cgroup v2 lets a cgroup with
    processes in it have no controllers for its children), pids and memory enabled for the children."""
    if not _delegated(base):
        return None
    available = set((base / "cgroup.controllers").read_text().split())
    if not {"pids", "memory"} <= available:
        return None
    enabled = set((base / "cgroup.subtree_control").read_text().split())
    if not {"pids", "memory"} <= enabled:
        procs = (base / "cgroup.procs").read_text().split()
        if procs:
            leaf = base / EXECUTOR_LEAF
            leaf.mkdir(exist_ok=True)
            for pid in procs:
                with contextlib.suppress(ProcessLookupError):
                    (leaf / "cgroup.procs").write_text(pid)
        (base / "cgroup.subtree_control").write_text("+pids +memory")
    return CgroupTree(2, {"pids": base, "memory": base})


def _probe(tree: CgroupTree, limits: SpawnLimits) -> CgroupTree | None:
    """The tree when a spawn's cgroup can be made in it with the limits written (and removed again)."""
    try:
        probe = tree.make(f"probe-{os.getpid()}", limits)
    except OSError:
        return None
    probe.remove(0)
    return tree


def find_tree(limits: SpawnLimits, proc_self: Path = Path("/proc/self")) -> CgroupTree | None:
    """Where this executor can make its spawns' cgroups (v2 delegated, else v1 writable), or None: then the
    rlimits are what limits a spawn. Logged either way."""
    if limits.pids_max is None and limits.memory_max is None:
        return None
    try:
        cgroup = (proc_self / "cgroup").read_text()
        mountinfo = (proc_self / "mountinfo").read_text()
    except OSError:
        return None
    tree: CgroupTree | None = None
    base = v2_base(cgroup, mountinfo)
    if base is not None:
        try:
            tree = _setup_v2(base)
        except OSError as exc:
            log.warning("spawn_cgroup_v2_unusable", base=str(base), error=str(exc))
        tree = tree and _probe(tree, limits)
    if tree is None:
        bases = v1_bases(cgroup, mountinfo)
        tree = _probe(CgroupTree(1, bases), limits) if bases else None
    if tree is not None:
        tree.sweep()
    return tree


def rlimits_for(limits: SpawnLimits, tree: CgroupTree | None) -> tuple[int | None, int | None]:
    """(RLIMIT_NPROC, RLIMIT_DATA) for what no cgroup limits."""
    controllers = tree.controllers if tree is not None else frozenset()
    nproc = limits.pids_max if "pids" not in controllers else None
    data = (max(limits.memory_max, RLIMIT_DATA_FLOOR)
            if limits.memory_max is not None and "memory" not in controllers else None)
    return nproc, data
