"""What every way of getting a task's process shares: the spawn as planned (`Plan`), the process handed to the run
(`Started`), and the steps of taking one started before its task (`Way`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from executor.run import substrate
from executor.run.task_rows import ClaimedTask
from executor.sandbox.gateway import Gateway

# what runs beside the credential's binding, before the process gets its input (the runner's: the run's session)
Beside = Callable[[], Awaitable[object]]


@dataclass(frozen=True)
class Plan:
    """A task's spawn as it would be made cold: what a process started before the task must match."""

    spec: substrate.SpawnSpec  # its MCP config not chosen yet: the taken process's, or a fresh grant's
    workdir: Path
    session_id: uuid.UUID  # the run's session: its credential is bound to it
    substrate: substrate.SubstrateConfig  # the CLI config it runs in (an adopted conversation's own)
    use_mcp: bool  # its role speaks to the harness


@dataclass(frozen=True)
class Started:
    """A task's process, handed to the run."""

    proc: asyncio.subprocess.Process
    cmd: list[str]  # the CLI's command line, as the task's task.spawned shows it
    gateway: Gateway | None  # its sandbox's ways out (None: unsandboxed)
    spec: substrate.SpawnSpec  # as spawned: its MCP config, the form of its input
    # its PETAL_TASK_ID and sandbox key when it is not the task's id (a process started before its task)
    spawn_id: uuid.UUID | None = None
    way: str | None = None  # how it was got, as task.spawned names it ("warm", "ahead"; None: started cold)
    since: float = 0.0  # when what was started before the task started
    shown: Mapping[str, Any] = field(default_factory=dict)  # what else task.spawned says of it

    def spawned_facts(self, now: float) -> dict[str, Any]:
        """What task.spawned says of how it was got (nothing, for a cold start)."""
        if self.way is None:
            return {}
        return {self.way: {"spawn_id": str(self.spawn_id), "waited_s": round(now - self.since, 3), **self.shown}}


class Ready(Protocol):
    """A process (or sandbox) started before its task: the MCP config it has, and its credential's hash."""

    @property
    def mcp_config(self) -> Path | None: ...

    @property
    def digest(self) -> bytes | None: ...


R = TypeVar("R", bound=Ready)


class Way(Protocol[R]):
    """A way to a process started before its task."""

    unused: str  # the log's event for one that did not fit

    async def take(self, task: ClaimedTask) -> R | None:
        """The task's thread's, if it has one (the task's from now on: its pool forgets it)."""
        ...

    async def misfit(self, ready: R, task: ClaimedTask, plan: Plan) -> str | None:
        """Why it does not fit the task's spawn as planned (None: it fits)."""
        ...

    def hand_over(self, ready: R, plan: Plan) -> Started:
        """It as the task's process (its credential is the task's already)."""
        ...

    def release(self, ready: R, reason: str) -> None:
        """Given back unused: ended in the background."""
        ...
