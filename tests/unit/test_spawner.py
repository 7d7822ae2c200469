"""The spawner's pieces (executor/run/spawn/): which way a task's process comes by, what a process started before
its task must match, and that one taken is given back whatever cuts the start short. Processes, credentials and
the launcher are stand-ins; the real CLI's side is tests/e2e/test_warm_turns.py and tests/e2e/test_ahead.py."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import pytest

from executor.projects import service as projects
from executor.run import substrate
from executor.run.plan import Planner, Unspawned
from executor.run.spawn.ahead import AheadWay
from executor.run.spawn.ahead_pool import Ahead, command_line
from executor.run.spawn.cold import Cold
from executor.run.spawn.spawner import Spawner
from executor.run.spawn.warm import WarmWay
from executor.run.spawn.warm_pool import Warm
from executor.run.spawn.way import Plan, Started
from executor.run.task_rows import ClaimedTask, RoleProfile

pytestmark = pytest.mark.unit

OWN = substrate.SubstrateConfig(claude_bin="claude")
THREAD = uuid.UUID("2cdf1b69-101f-4ae7-b118-c8e5c03f1d80")


class _Proc:
    pid = 4242
    returncode: int | None = None


def _task(**kw: Any) -> ClaimedTask:
    fields: dict[str, Any] = dict(
        id=uuid.uuid4(), project_id=None, session_id=THREAD, parent_task_id=None, role="orchestrator",
        brief="hello", plan_ref=None, workdir=None, allowed_tools=None, attempt=1, json_schema=None,
        attachment_ids=[], max_budget_usd=None, chat=True)
    return ClaimedTask(**{**fields, **kw})


def _plan(**kw: Any) -> Plan:
    spec = substrate.SpawnSpec(role="orchestrator", prompt="hello", session_uuid=str(THREAD), resume=True,
                               allowed_tools=("Read",), system_prompt="be brief")
    return Plan(**{"spec": spec, "workdir": Path("/work"), "session_id": THREAD, "substrate": OWN,
                   "use_mcp": True, **kw})


@dataclass
class _Ready:
    name: str
    mcp_config: Path | None = Path("/run/mcp/ready.json")
    digest: bytes | None = b"digest"


@dataclass
class _Way:
    """A way whose pool holds `ready` (or nothing), which fits unless told why not."""

    unused = "test_unused"
    ready: _Ready | None
    reason: str | None = None
    misfit_error: BaseException | None = None
    hand_over_error: BaseException | None = None
    released: list[tuple[str, str]] = field(default_factory=list)
    taken: int = 0

    async def take(self, task: ClaimedTask) -> _Ready | None:
        self.taken += 1
        ready, self.ready = self.ready, None
        return ready

    async def misfit(self, ready: _Ready, task: ClaimedTask, plan: Plan) -> str | None:
        if self.misfit_error is not None:
            raise self.misfit_error
        return self.reason

    def hand_over(self, ready: _Ready, plan: Plan) -> Started:
        if self.hand_over_error is not None:
            raise self.hand_over_error
        proc: Any = _Proc()
        return Started(proc, [ready.name], None, replace(plan.spec, mcp_config=ready.mcp_config), way=ready.name)

    def release(self, ready: _Ready, reason: str) -> None:
        self.released.append((ready.name, reason))


class _Credentials:
    mcp_url = "http://127.0.0.1:1/mcp"

    def __init__(self) -> None:
        self.bound: list[tuple[bytes, uuid.UUID, uuid.UUID]] = []
        self.granted: list[tuple[uuid.UUID, uuid.UUID]] = []
        self.bind_error: BaseException | None = None

    async def bind(self, digest: bytes, task_id: uuid.UUID, session_id: uuid.UUID) -> None:
        if self.bind_error is not None:
            raise self.bind_error
        self.bound.append((digest, task_id, session_id))

    async def grant(self, task_id: uuid.UUID, session_id: uuid.UUID) -> Path | None:
        self.granted.append((task_id, session_id))
        return Path(f"/run/mcp/mcp-{task_id}.json")


class _Launcher:
    def __init__(self, error: OSError | None = None) -> None:
        self.launched: list[tuple[uuid.UUID, substrate.SpawnSpec, list[str]]] = []
        self.error = error

    async def launch(self, spawn_id: uuid.UUID, project_id: uuid.UUID | None, workdir: Path,
                     spec: substrate.SpawnSpec, cmd: list[str], sub: substrate.SubstrateConfig,
                     argv_fd: int | None = None) -> tuple[Any, None]:
        if self.error is not None:
            raise self.error
        self.launched.append((spawn_id, spec, cmd))
        return _Proc(), None


def _spawner(warm: _Way, ahead: _Way, credentials: _Credentials | None = None,
             launcher: _Launcher | None = None) -> tuple[Spawner, _Credentials, _Launcher]:
    credentials = credentials or _Credentials()
    launcher = launcher or _Launcher()
    cold = Cold(cast(Any, launcher), cast(Any, credentials))
    pools: Any = None
    return Spawner(OWN, cast(Any, credentials), cold, warm, ahead, pools, pools), credentials, launcher


class _Beside:
    def __init__(self, error: BaseException | None = None) -> None:
        self.calls = 0
        self.error = error

    async def __call__(self) -> None:
        self.calls += 1
        if self.error is not None:
            raise self.error


async def test_a_warm_process_that_fits_is_the_turns_its_credential_bound_to_the_task_beside_the_session() -> None:
    warm, ahead = _Way(_Ready("warm")), _Way(_Ready("ahead"))
    spawner, credentials, launcher = _spawner(warm, ahead)
    task, beside = _task(), _Beside()
    started = await spawner.acquire(task, _plan(), beside)
    assert isinstance(started, Started) and started.way == "warm"
    assert credentials.bound == [(b"digest", task.id, THREAD)] and beside.calls == 1
    assert ahead.taken == 0 and launcher.launched == [] and warm.released == []


async def test_one_that_does_not_fit_is_given_back_and_the_next_way_tried_then_a_cold_start() -> None:
    warm, ahead = _Way(_Ready("warm"), reason="spawn_differs"), _Way(_Ready("ahead"), reason="conversation_moved_on")
    spawner, credentials, launcher = _spawner(warm, ahead)
    task, beside = _task(), _Beside()
    started = await spawner.acquire(task, _plan(), beside)
    assert warm.released == [("warm", "spawn_differs")] and ahead.released == [("ahead", "conversation_moved_on")]
    # started now: its own credential granted (not a taken one's bound), its command line built from the plan
    assert isinstance(started, Started) and started.way is None and started.spawned_facts(1.0) == {}
    assert credentials.bound == [] and credentials.granted == [(task.id, THREAD)] and beside.calls == 1
    [(spawn_id, spec, cmd)] = launcher.launched
    assert spawn_id == task.id and spec.mcp_config == Path(f"/run/mcp/mcp-{task.id}.json")
    assert cmd == substrate.build_command(OWN, spec) and started.cmd == cmd


@pytest.mark.parametrize("plan_or_task", [
    {"task": {"json_schema": {"type": "object"}}},  # an extractor
    {"plan": {"spec": substrate.SpawnSpec(role="orchestrator", prompt="hi", session_uuid=str(THREAD))}},  # a first turn
    {"plan": {"substrate": replace(OWN, config_dir=Path("/adopted"))}},  # an adopted conversation's own CLI config
])
async def test_only_a_turn_resuming_its_conversation_in_the_executors_own_config_takes_one_started_before(
        plan_or_task: dict[str, dict[str, Any]]) -> None:
    warm, ahead = _Way(_Ready("warm")), _Way(_Ready("ahead"))
    spawner, _, launcher = _spawner(warm, ahead)
    started = await spawner.acquire(_task(**plan_or_task.get("task", {})), _plan(**plan_or_task.get("plan", {})),
                                    _Beside())
    assert isinstance(started, Started) and started.way is None and len(launcher.launched) == 1
    assert warm.taken == ahead.taken == 0  # not even asked: a pool's take tells it a turn started


async def test_a_process_taken_is_given_back_whatever_cuts_the_start_short() -> None:
    for way, reason in [(_Way(_Ready("warm"), misfit_error=asyncio.CancelledError()), "start_cut_short"),
                        (_Way(_Ready("warm"), hand_over_error=RuntimeError("boom")), "start_failed")]:
        spawner, *_ = _spawner(way, _Way(None))
        with pytest.raises((asyncio.CancelledError, RuntimeError)):
            await spawner.acquire(_task(), _plan(), _Beside())
        assert way.released == [("warm", reason)]
    # the credential's binding and the session beside it: an outage leaves the task claimed, the process given back
    for credentials, beside in [(_Credentials(), _Beside(error=OSError("database away"))),
                                (_Credentials(), _Beside(error=asyncio.CancelledError()))]:
        way = _Way(_Ready("warm"))
        spawner, *_ = _spawner(way, _Way(None), credentials)
        with pytest.raises((OSError, asyncio.CancelledError)):
            await spawner.acquire(_task(), _plan(), beside)
        assert way.released == [("warm", "start_failed")]


async def test_a_cold_start_that_cannot_start_says_why() -> None:
    spawner, *_ = _spawner(_Way(None), _Way(None), launcher=_Launcher(error=FileNotFoundError("no claude")))
    assert await spawner.acquire(_task(), _plan(), _Beside()) == "could not start claude: no claude"


def test_the_spawned_facts_say_how_and_how_long_it_waited() -> None:
    proc: Any = _Proc()
    spec = _plan().spec
    spawn_id = uuid.uuid4()
    warm = Started(proc, ["claude"], None, spec, spawn_id=spawn_id, way="warm", since=10.0)
    ahead = Started(proc, ["claude"], None, spec, spawn_id=spawn_id, way="ahead", since=10.0, shown={"spare": True})
    assert warm.spawned_facts(12.5) == {"warm": {"spawn_id": str(spawn_id), "waited_s": 2.5}}
    assert ahead.spawned_facts(10.25) == {"ahead": {"spawn_id": str(spawn_id), "waited_s": 0.25, "spare": True}}


# ---- the ways' predicates ------------------------------------------------------------------------------------


def _stored(tmp_path: Path) -> substrate.SubstrateConfig:
    """The executor's CLI config with the thread's conversation stored in it."""
    own = substrate.SubstrateConfig(claude_bin="claude", config_dir=tmp_path / "cfg")
    stored = tmp_path / "cfg" / "projects" / "-work" / f"{THREAD}.jsonl"
    stored.parent.mkdir(parents=True, exist_ok=True)
    stored.write_text('{"type":"user","message":{"role":"user","content":"hi"}}\n')
    return own


def _warm(own: substrate.SubstrateConfig, plan: Plan, **kw: Any) -> Warm:
    spec = replace(plan.spec, prompt="", mcp_config=Path("/run/mcp/warm.json"), stream_input=True)
    proc: Any = _Proc()
    fields: dict[str, Any] = dict(
        session_id=THREAD, spawn_id=uuid.uuid4(), proc=proc, spec=spec, cmd=substrate.build_command(own, spec),
        workdir=plan.workdir, project_id=None, mcp_config=spec.mcp_config, digest=b"d", gateway=None,
        transcript=substrate.session_state(own, str(THREAD)))
    return Warm(**{**fields, **kw})


async def test_a_warm_process_fits_a_turn_spawned_exactly_as_it_was_started_and_its_conversation_unmoved(
        tmp_path: Path) -> None:
    own = _stored(tmp_path)
    plan = _plan(substrate=own)
    way = WarmWay(cast(Any, None), own)
    task = _task()
    assert await way.misfit(_warm(own, plan), task, plan) is None
    assert await way.misfit(_warm(own, plan, workdir=Path("/elsewhere")), task, plan) == "spawn_differs"
    other_tools = replace(plan, spec=replace(plan.spec, allowed_tools=("Bash",)))
    assert await way.misfit(_warm(own, plan), task, other_tools) == "spawn_differs"
    budget = replace(plan, spec=replace(plan.spec, extra_args=("--max-budget-usd", "0.5000")))
    assert await way.misfit(_warm(own, plan), task, budget) == "spawn_differs"
    assert await way.misfit(_warm(own, plan), _task(project_id=uuid.uuid4()), plan) == "spawn_differs"
    moved = _warm(own, plan)
    with (tmp_path / "cfg" / "projects" / "-work" / f"{THREAD}.jsonl").open("a") as f:
        f.write('{"type":"user","message":{"role":"user","content":"a turn elsewhere"}}\n')
    assert await way.misfit(moved, task, plan) == "conversation_moved_on"
    # handed over: it runs already, its message goes as a stream-json line, its config the one it started with
    started = way.hand_over(moved, plan)
    assert started.proc is moved.proc and started.cmd == moved.cmd and started.spec.stream_input
    assert started.spec.mcp_config == moved.mcp_config and started.spawn_id == moved.spawn_id


class _Pipe:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


def _ahead(own: substrate.SubstrateConfig, **kw: Any) -> Ahead:
    proc: Any = _Proc()
    gateway: Any = object()
    fields: dict[str, Any] = dict(
        session_id=THREAD, role="orchestrator", spawn_id=uuid.uuid4(), proc=proc, command=_Pipe(),
        program="claude", workdir=Path("/work"), mcp_config=Path("/run/mcp/ahead.json"), digest=b"d",
        gateway=gateway, transcript=substrate.session_state(own, str(THREAD)), spare=True)
    return Ahead(**{**fields, **kw})


async def test_a_sandbox_started_ahead_fits_a_plain_turn_of_its_role_and_gets_the_command_line_when_handed_over(
        tmp_path: Path) -> None:
    own = _stored(tmp_path)
    plan = _plan(substrate=own)
    way = AheadWay(cast(Any, None), own, mcp_served=True)
    task = _task()
    assert await way.misfit(_ahead(own), task, plan) is None
    assert await way.misfit(_ahead(own, role="worker"), task, plan) == "spawn_differs"
    assert await way.misfit(_ahead(own, mcp_config=None), task, plan) == "spawn_differs"  # started without MCP
    assert await way.misfit(_ahead(own), _task(project_id=uuid.uuid4()), plan) == "spawn_differs"
    assert await way.misfit(_ahead(own, workdir=Path("/elsewhere")), task, plan) == "spawn_differs"
    assert await way.misfit(_ahead(own, transcript=(1, 1)), task, plan) == "conversation_moved_on"
    assert await AheadWay(cast(Any, None), own, mcp_served=False).misfit(
        _ahead(own, mcp_config=None), task, plan) is None  # no harness served: no spawn has an MCP config
    ahead = _ahead(own)
    started = way.hand_over(ahead, plan)
    # the command line a cold spawn of the plan would run, with the sandbox's own config, to its launcher
    assert started.cmd == substrate.build_command(own, replace(plan.spec, mcp_config=ahead.mcp_config))
    pipe = cast(_Pipe, ahead.command)
    assert pipe.written == command_line(started.cmd) and pipe.closed
    assert started.spawned_facts(ahead.started + 1)["ahead"]["spare"] is True


# ---- the plan ------------------------------------------------------------------------------------------------


class _Store:
    pool: Any = None

    def __init__(self, *, cli: dict[str, Any] | None = None, grant: dict[str, Any] | None = None) -> None:
        self.cli = cli
        self.grant = grant

    async def role_profile(self, role: str) -> RoleProfile:
        return RoleProfile(role=role, system_prompt="be brief", allowed_tools=["Read", "Bash"], use_mcp=True)

    async def session_cli(self, session_id: uuid.UUID) -> dict[str, Any] | None:
        return self.cli

    async def grant_budget(self, task_id: uuid.UUID) -> dict[str, Any] | None:
        return self.grant


@pytest.fixture
def no_worktree(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """No task here is a project's worker (its worktree is the projects room's, over the database); an error put in
    the list is what making one raises."""
    raised: list[BaseException] = []

    async def prepare_worktree(*args: Any) -> Path | None:
        if raised:
            raise raised[0]
        return None
    monkeypatch.setattr(projects, "prepare_worktree", prepare_worktree)
    return raised


def _planner(tmp_path: Path, store: _Store) -> Planner:
    return Planner(cast(Any, store), cast(Any, None), _stored(tmp_path), tmp_path, tmp_path / "worktrees")


async def test_a_threads_turn_resumes_its_stored_conversation_with_its_roles_tools(
        tmp_path: Path, no_worktree: list[BaseException]) -> None:
    plan = await _planner(tmp_path, _Store()).plan(_task(workdir=str(tmp_path)))
    assert isinstance(plan, Plan) and plan.session_id == THREAD and plan.workdir == tmp_path and plan.use_mcp
    assert plan.spec.resume and plan.spec.session_uuid == str(THREAD) and plan.spec.mcp_config is None
    assert plan.spec.allowed_tools == ("Read", "Bash") and plan.spec.system_prompt == "be brief"
    first = await _planner(tmp_path, _Store()).plan(_task(session_id=None, workdir=str(tmp_path)))
    assert isinstance(first, Plan) and not first.spec.resume and first.session_id != THREAD  # a session of its own


async def test_an_adopted_conversation_runs_in_its_own_config_and_forks_when_not_stored_yet(
        tmp_path: Path, no_worktree: list[BaseException]) -> None:
    cli = {"adopted_session_id": "a", "cli_config_dir": str(tmp_path / "theirs"), "cli_workdir": str(tmp_path),
           "cli_session_id": "11111111-2222-3333-4444-555555555555", "cli_fork_from": "their-live-one"}
    plan = await _planner(tmp_path, _Store(cli=cli)).plan(_task())
    assert isinstance(plan, Plan) and plan.substrate.config_dir == tmp_path / "theirs"
    assert plan.spec.session_uuid == cli["cli_session_id"] and not plan.spec.resume
    assert plan.spec.fork_from == "their-live-one" and plan.workdir == tmp_path


async def test_why_a_task_gets_no_process(tmp_path: Path, no_worktree: list[BaseException]) -> None:
    missing = await _planner(tmp_path, _Store()).plan(_task(workdir=str(tmp_path / "gone")))
    assert missing == Unspawned("skipped", f"working directory {tmp_path / 'gone'} does not exist")
    spent = _Store(grant={"granted": 0.001, "spent": 0.999, "cap": 1.0})
    assert await _planner(tmp_path, spent).plan(_task(workdir=str(tmp_path), max_budget_usd=1.0)) == Unspawned(
        "skipped", "budget: the run spent 1.00 of its 1.00 USD")
    left = _Store(grant={"granted": 0.25, "spent": 0.75, "cap": 1.0})
    plan = await _planner(tmp_path, left).plan(_task(workdir=str(tmp_path), max_budget_usd=1.0))
    assert isinstance(plan, Plan) and plan.spec.extra_args == ("--max-budget-usd", "0.2500")
    no_worktree.append(OSError("disk full"))
    assert await _planner(tmp_path, _Store()).plan(_task()) == Unspawned(
        "failed", "could not make the worker's git worktree: disk full")
