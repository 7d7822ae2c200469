"""A spawn's sandbox as the run sees it: its gateway (the only ways out), its bubblewrap command line, and
after its exit the new conversation kept for the next turn's `--resume` (executor/sandbox/ builds each)."""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from pathlib import Path

from executor.run import substrate
from executor.run.task_store import TaskStore
from executor.sandbox import bwrap as sandbox
from executor.sandbox import cliconfig, git_view
from executor.sandbox import limits, scratch
from executor.sandbox.gateway import Gateway
from executor.sandbox.gateway import parse_allowlist as gateway_allow
from shared import logs

log = logs.get(__name__)


class Isolation:
    def __init__(self, policy: sandbox.SandboxPolicy, substrate_config: substrate.SubstrateConfig,
                 mcp_url: str | None, store: TaskStore, *, quiet: bool = False):
        self.policy = policy
        self.substrate = substrate_config
        self.mcp_url = mcp_url
        self.store = store
        self._gateways: scratch.Scratch | None = None
        # each spawn's limits: in a cgroup of its own where this executor can make one, else by rlimits
        self.cgroups = limits.find_tree(policy.limits)
        self.rlimits = limits.rlimits_for(policy.limits, self.cgroups)
        self.spawn_cgroups: dict[uuid.UUID, limits.SpawnCgroup] = {}
        if not quiet:  # `doctor`'s sandbox probe builds one too: the executor's start says it, once
            log.info("spawn_limits", pids_max=policy.limits.pids_max, memory_max=policy.limits.memory_max,
                     tmp_size=policy.limits.tmp_size, cgroup=self.cgroups and f"v{self.cgroups.version}",
                     cgroup_controllers=sorted(self.cgroups.controllers) if self.cgroups else [],
                     rlimit_nproc=self.rlimits[0], rlimit_data=self.rlimits[1])

    async def open_gateway(self, task_id: uuid.UUID, project_id: uuid.UUID | None) -> Gateway:
        forwards: dict[int, tuple[str, int]] = {}
        for port, target in (sandbox.loopback_port(self.mcp_url),
                             sandbox.loopback_port(self.substrate.base_env.get("ANTHROPIC_BASE_URL"))):
            if port is not None and target is not None:
                forwards[port] = target
        allow = (*sandbox.cli_hosts(self.substrate.base_env), *self.policy.allow,
                 *await self.store.project_sandbox_allow(project_id))
        return await Gateway.open(self._gateway_root() / task_id.hex[:16], forwards, gateway_allow(allow),
                                  label=str(task_id))

    def _gateway_root(self) -> Path:
        """Where this executor's gateways keep their sockets: a 0700 directory of its own in the system's temporary
        directory, not under the data directory, whose path can be longer than a Unix socket's (108 bytes)."""
        if self._gateways is None or not self._gateways.path.is_dir():
            self._gateways = scratch.Scratch("petal-gw-")
        return self._gateways.path

    def wrap(self, gateway: Gateway, workdir: Path, mcp_path: Path | None, cmd: list[str], env: dict[str, str],
             task_id: uuid.UUID, session_uuid: str | None, *, substrate_config: substrate.SubstrateConfig | None = None,
             fork_from: str | None = None, argv_fd: int | None = None) -> tuple[list[str], dict[str, str]]:
        """The command line and environment of a spawn inside its sandbox (`substrate_config`: an adopted
        conversation's own config directory; `fork_from`: the conversation its new one copies; `argv_fd`: the
        sandbox starts ahead of its command, which comes on that descriptor, and `cmd` is only its program;
        `session_uuid` None: a spare's, its conversation linked in later by `link_conversation`)."""
        sub = substrate_config or self.substrate
        git_rw, git_ro = git_view.git_parts(workdir)
        home = Path(sub.base_env.get("HOME") or Path.home())
        config_home = substrate.config_home(sub)
        config = cliconfig.config_view(config_home, workdir, session_uuid, task_id.hex, fork_from=fork_from,
                                     state_file=substrate.state_file(sub))
        hidden = config.hidden
        own = substrate.config_home(self.substrate)
        if own.resolve() != config_home.resolve():
            hidden = (*hidden, own)  # the executor's own conversations stay out of an adopted one's sight
        writable = [*config.writable, *git_rw]
        readonly = [*git_ro, *(p for p in (mcp_path,) if p is not None), *config.readonly, *self.policy.exposed]
        readonly += [p for p in (home / ".gitconfig", home / ".config" / "git") if p.exists()]
        found = shutil.which(cmd[0], path=env.get("PATH"))
        if found is None:  # said here, as an unsandboxed spawn would, not as the launcher's exit 127
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), cmd[0])
        if not sandbox.visible(Path(found), self.policy):
            readonly.append(Path(found).resolve())  # a wrapper script outside the CLI's install
        box = sandbox.SpawnBox(workdir=workdir, writable=tuple(writable), readonly=tuple(readonly),
                               hidden=hidden, bound=config.bound, ports=tuple(gateway.forwards),
                               sockets_dir=gateway.directory)
        argv = sandbox.wrap(self.policy, box, [] if argv_fd is not None else cmd, argv_fd=argv_fd)
        return self._limited(task_id, argv), {**env, **sandbox.proxy_env()}

    def _limited(self, spawn_id: uuid.UUID, argv: list[str]) -> list[str]:
        """The sandbox's command line run in the spawn's own cgroup and under the rlimits left to set. OSError
        when its cgroup cannot be made: no spawn runs without its limits."""
        procs: tuple[Path, ...] = ()
        if self.cgroups is not None:
            cgroup = self.cgroups.make(spawn_id.hex, self.policy.limits)
            self.spawn_cgroups[spawn_id] = cgroup
            procs = cgroup.procs
        nproc, data = self.rlimits
        return limits.enter_argv(self.policy.bash, procs, argv, nproc=nproc, data=data)

    def limit_hit(self, spawn_id: uuid.UUID) -> str | None:
        """Which limit the spawn hit (limits.PIDS_LIMIT, MEMORY_LIMIT), None if none or it has no cgroup."""
        cgroup = self.spawn_cgroups.get(spawn_id)
        return cgroup.hit() if cgroup is not None else None

    def kill_spawn(self, spawn_id: uuid.UUID) -> None:
        """Everything of the spawn killed at once (its cgroup's processes)."""
        cgroup = self.spawn_cgroups.get(spawn_id)
        if cgroup is not None:
            cgroup.kill()

    def drop_cgroup(self, spawn_id: uuid.UUID, timeout_s: float = 5.0) -> None:
        """After the spawn's exit: its cgroup removed (blocking, while its last processes go)."""
        cgroup = self.spawn_cgroups.pop(spawn_id, None)
        if cgroup is not None and not cgroup.remove(timeout_s):
            log.warning("spawn_cgroup_left", spawn_id=str(spawn_id), dirs=[str(d) for d in cgroup.dirs])

    def config_state(self) -> tuple[tuple[str, int, int], ...]:
        """The executor's CLI config files as a spawn's view mounts them (cliconfig.config_state)."""
        return cliconfig.config_state(substrate.config_home(self.substrate))

    def link_conversation(self, workdir: Path, session_uuid: str, task_id: uuid.UUID) -> bool:
        """A spare's sandbox given its thread's conversation (False: it cannot take that one)."""
        return cliconfig.link_conversation(substrate.config_home(self.substrate), workdir, session_uuid, task_id.hex)

    def keep_session(self, workdir: Path, session_id: str, task_id: uuid.UUID, *,
                     substrate_config: substrate.SubstrateConfig | None = None) -> None:
        """A sandboxed spawn's new conversation into place for the next turn's `--resume`."""
        try:
            cliconfig.keep_session(substrate.config_home(substrate_config or self.substrate), workdir, session_id,
                                 task_id.hex)
        except OSError:  # the next turn starts the conversation afresh (session_stored): logged, not fatal
            log.exception("keep_session_failed", task_id=str(task_id))

    def forget_spawn(self, task_id: uuid.UUID) -> None:
        """A spawn that never started: its private conversation directory goes."""
        cliconfig.forget_spawn(substrate.config_home(self.substrate), task_id.hex)
        self.drop_cgroup(task_id, timeout_s=0)  # what ran in it is gone (_release waited for it)

    def close(self) -> None:
        """At the executor's end: its gateways' directory (each gateway removes its own as its spawn ends)."""
        if self._gateways is not None:
            self._gateways.remove()
