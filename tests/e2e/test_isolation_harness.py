"""Harness scope (issue 47, item 4): what a spawn may name in a harness tool's arguments, checked against its
per-spawn credential. Reads answer only the caller's own thread (and its project); `dispatch_worker` runs a
worker only in the caller's project, only so deep and only so many times per task; and one credential's flood
of refusals cannot keep another's out of the journal. Calls go over HTTP through the mcp SDK's client with
real per-spawn credentials (rows as the supervisor records them); the depth chain runs the real CLI. Each
attack has its negative control: the same call for the caller's own scope answers, the same ids answer their
own threads, and the flood with the defence switched off does blind the other credential."""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from mcp.client import Client
from mcp.types import CallToolResult

from executor.harness.refusals import REFUSALS_PER_WINDOW, RefusalBudget
from executor.harness.scope import DispatchLimits
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests.harness import running_executor
from tests.harness_caller import mcp_client, wait_started
from tests import tables
from tests.pg import DB
from tests.scenarios import dispatch
from tests.wait import until

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

RUST = [{"approach": "rewrite the parser in Rust", "reason": "the team knows Python"}]


@dataclass(frozen=True)
class Node:
    """A task of the store: its id, its conversation, and the credential of its spawn (running ones)."""

    task_id: uuid.UUID
    session_id: uuid.UUID
    token: str = ""


class Store:
    """Threads, turns and workers as the executor records them, with handoffs in the journal."""

    def __init__(self, db: DB, tmp: Path):
        self.conn = psycopg.connect(db.admin_dsn, autocommit=True)
        self.tmp = tmp

    def project(self, name: str) -> uuid.UUID:
        workdir = self.tmp / name
        workdir.mkdir(parents=True, exist_ok=True)
        return tables.insert(self.conn, "projects", name=name, workdir=str(workdir))

    def thread(self, project: uuid.UUID | None = None, mode: str = "autonomous") -> uuid.UUID:
        return tables.insert_thread(self.conn, project_id=project, lifecycle="running", mode=mode, title="t")

    def task(self, *, thread: uuid.UUID | None = None, parent: Node | None = None, project: uuid.UUID | None = None,
             running: bool = False, status: str | None = None) -> Node:
        """A turn of `thread`, or a worker of `parent` (in a conversation of its own); a running one (or one
        with `status` given) holds a credential."""
        role = "orchestrator" if thread is not None else "worker"
        session = thread or tables.insert_thread(self.conn, project_id=project, role="worker", lifecycle="running")
        task = tables.insert_task(self.conn, project_id=project, session_id=session,
                                  parent_task_id=parent.task_id if parent else None, role=role,
                                  status=status or ("running" if running else "success"), started_at=tables.NOW)
        token = ""
        if running or status is not None:
            token = secrets.token_urlsafe(32)
            tables.add(self.conn, "harness_credentials", token_sha256=hashlib.sha256(token.encode()).digest(),
                       task_id=task, session_id=session)
        return Node(task, session, token)

    def handoff(self, node: Node, goal: str, project: uuid.UUID | None = None,
                ruled_out: list[dict[str, str]] | None = None) -> None:
        # the seq taken under the journal head's lock, as the executor's writer takes it (it runs meanwhile)
        tables.append(self.conn, "handoff", {"goal": goal, "current_state": "done", "next_step": "none",
                                             "status": "success", "ruled_out": ruled_out or []},
                      tier="derived", project_id=project, session_id=node.session_id, task_id=node.task_id)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def store(db: DB, tmp_path: Path) -> Iterator[Store]:
    made = Store(db, tmp_path)
    yield made
    made.close()


def _text(result: CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def _data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, _text(result)
    structured: dict[str, Any] | None = result.structured_content
    if structured is None:
        structured = json.loads(_text(result))
    return structured


async def _goals(client: Client, scope: uuid.UUID) -> list[str]:
    found = _data(await client.call_tool("get_handoffs", {"scope_id": str(scope)}))
    return sorted(h["goal"] for h in found["handoffs"])


async def _rule_outs(client: Client, scope: uuid.UUID) -> list[str]:
    found = _data(await client.call_tool("check_ruled_out", {"scope_id": str(scope),
                                                             "candidate": "Rewrite the parser in Rust"}))
    return [m["approach"] for m in found["matches"]]


async def test_reads_answer_only_the_callers_own_thread_and_project_and_others_as_unknown(
        db: DB, tmp_path: Path, store: Store) -> None:
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path) as h:
            await wait_started(h)
            a, b = store.project("a"), store.project("b")
            # thread X (project a): a turn, its worker, and that worker's worker — the caller, two deep
            x = store.thread(a)
            turn_x = store.task(thread=x, project=a)
            w1 = store.task(parent=turn_x, project=a)
            caller = store.task(parent=w1, project=a, running=True)
            store.handoff(w1, "x worker", a, RUST)
            # another thread of project a: its handoffs are the project's record
            x2 = store.thread(a)
            store.handoff(store.task(parent=store.task(thread=x2, project=a), project=a), "a sibling thread", a)
            # thread Y (project b) and thread Z (no project), each with a worker's handoff
            y = store.thread(b)
            turn_y = store.task(thread=y, project=b, running=True)
            wy = store.task(parent=turn_y, project=b)
            store.handoff(wy, "y worker", b, RUST)
            z = store.thread()
            turn_z = store.task(thread=z, running=True)
            wz = store.task(parent=turn_z)
            store.handoff(wz, "z worker", None, RUST)
            unknown = uuid.uuid4()
            async with mcp_client(h.mcp_url or "", caller.token) as client:
                own = {name: await _goals(client, scope) for name, scope in [
                    ("its parent", w1.task_id), ("its thread", x), ("its turn", turn_x.task_id),
                    ("its project", a), ("a thread of its project", x2)]}
                foreign = {name: await _goals(client, scope) for name, scope in [
                    ("another thread's worker", wy.task_id), ("another thread", y), ("another turn", turn_y.task_id),
                    ("another project", b), ("a no-project thread's worker", wz.task_id),
                    ("another worker's conversation", wy.session_id), ("unknown", unknown)]}
                raw_foreign = await client.call_tool("get_handoffs", {"scope_id": str(wy.task_id)})
                raw_unknown = await client.call_tool("get_handoffs", {"scope_id": str(unknown)})
                ruled = {"own": await _rule_outs(client, w1.task_id), "foreign": await _rule_outs(client, wy.task_id),
                         "no project": await _rule_outs(client, wz.task_id), "unknown": await _rule_outs(client, unknown)}
                state_own = _data(await client.call_tool("get_project_state", {"project_id": str(a)}))
                state_foreign = await client.call_tool("get_project_state", {"project_id": str(b)})
                state_unknown = await client.call_tool("get_project_state", {"project_id": str(unknown)})
            # the negative control: the same ids answer their own threads' callers
            async with mcp_client(h.mcp_url or "", turn_y.token) as other:
                y_sees: dict[str, Any] = {"worker": await _goals(other, wy.task_id), "project": await _goals(other, b),
                          "rule-outs": await _rule_outs(other, wy.task_id),
                          "state": _data(await other.call_tool("get_project_state", {"project_id": str(b)})),
                          "x's worker": await _goals(other, w1.task_id)}
            async with mcp_client(h.mcp_url or "", turn_z.token) as free:
                z_sees = {"worker": await _goals(free, wz.task_id), "project a": await _goals(free, a)}
    assert own == {"its parent": ["x worker"], "its thread": ["x worker"], "its turn": [],
                   "its project": ["a sibling thread", "x worker"], "a thread of its project": ["a sibling thread"]}
    assert foreign == {name: [] for name in foreign}
    # no existence oracle: an id of another thread is answered byte for byte as an unknown one
    assert raw_foreign.content == raw_unknown.content and not raw_foreign.is_error
    assert ruled == {"own": ["rewrite the parser in Rust"], "foreign": [], "no project": [], "unknown": []}
    assert state_own["project"]["id"] == str(a)
    assert state_foreign.is_error and state_unknown.is_error
    assert _text(state_foreign).replace(str(b), "<id>") == _text(state_unknown).replace(str(unknown), "<id>")
    assert y_sees["worker"] == ["y worker"] and y_sees["project"] == ["y worker"]
    assert y_sees["rule-outs"] == ["rewrite the parser in Rust"] and y_sees["state"]["project"]["id"] == str(b)
    assert y_sees["x's worker"] == []  # and the other way round
    assert z_sees == {"worker": ["z worker"], "project a": []}


async def test_dispatch_worker_runs_only_in_the_callers_project(db: DB, tmp_path: Path, store: Store) -> None:
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path) as h:
            await wait_started(h)
            a, b = store.project("a"), store.project("b")
            # interactive threads: a worker waits for the user's approval, so none is spawned here
            in_a = store.task(thread=store.thread(a, "interactive"), project=a, running=True)
            in_b = store.task(thread=store.thread(b, "interactive"), project=b, running=True)
            free = store.task(thread=store.thread(None, "interactive"), running=True)
            async with mcp_client(h.mcp_url or "", in_a.token) as client:
                to_b = await client.call_tool("dispatch_worker", {"brief": "edit b", "project_id": str(b)})
                to_unknown = await client.call_tool("dispatch_worker", {"brief": "edit b",
                                                                        "project_id": str(uuid.uuid4())})
                to_a = _data(await client.call_tool("dispatch_worker", {"brief": "edit a", "project_id": str(a)}))
                default = _data(await client.call_tool("dispatch_worker", {"brief": "edit a again"}))
            async with mcp_client(h.mcp_url or "", free.token) as client:
                free_to_a = await client.call_tool("dispatch_worker", {"brief": "edit a", "project_id": str(a)})
                free_own = _data(await client.call_tool("dispatch_worker", {"brief": "look around"}))
            # the negative control: project b is real, and its own thread dispatches into it
            async with mcp_client(h.mcp_url or "", in_b.token) as client:
                b_own = _data(await client.call_tool("dispatch_worker", {"brief": "edit b", "project_id": str(b)}))
            refusals = [e for e in await h.events() if e.event_type == "task.dispatch_refused"]
            tasks = {str(k): await h.task(uuid.UUID(v["task_id"]))
                     for k, v in {"a": to_a, "default": default, "free": free_own, "b": b_own}.items()}
    assert to_b.is_error and "dispatch refused: a worker runs in its caller's project" in _text(to_b)
    assert _text(to_b) == _text(to_unknown)  # the same words whether or not the named project exists
    assert free_to_a.is_error and "this thread has no project" in _text(free_to_a)
    assert {k: (t["project_id"], t["parent_task_id"]) for k, t in tasks.items()} == {
        "a": (a, in_a.task_id), "default": (a, in_a.task_id), "free": (None, free.task_id), "b": (b, in_b.task_id)}
    assert all(p in (None, in_b.task_id) for (p,) in tables.tasks(store.conn, "parent_task_id", project_id=b))
    assert sorted((str(e.task_id), e.payload["reason"]) for e in refusals) == sorted(
        [(str(in_a.task_id), "another project")] * 2 + [(str(free.task_id), "another project")])


@pytest.mark.parametrize("limit", [3, 100], ids=["bounded", "defence off"])
async def test_a_dispatch_flood_is_stopped_at_the_per_task_count(
        db: DB, tmp_path: Path, store: Store, limit: int) -> None:
    flood = 8
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path, dispatch_limits=DispatchLimits(max_per_task=limit)) as h:
            await wait_started(h)
            thread = store.thread(None, "interactive")  # workers wait for approval: none is spawned
            flooder = store.task(thread=thread, running=True)
            sibling = store.task(thread=store.thread(None, "interactive"), running=True)
            async with mcp_client(h.mcp_url or "", flooder.token) as client:
                # at once: the count and the insert of one caller's calls are taken in turn
                results = await asyncio.gather(*(client.call_tool("dispatch_worker", {"brief": f"part {i}"})
                                                 for i in range(flood)))
            async with mcp_client(h.mcp_url or "", sibling.token) as client:
                other = await client.call_tool("dispatch_worker", {"brief": "the sibling's own"})
    refused = [_text(r) for r in results if r.is_error]
    created = tables.count_tasks(store.conn, parent_task_id=flooder.task_id)
    assert not other.is_error, _text(other)  # the count is the task's own: another task still dispatches
    if limit < flood:
        assert created == limit and len(refused) == flood - limit, refused
        assert all("PETAL_MAX_DISPATCH_PER_TASK=3" in text for text in refused), refused
    else:  # without the bound the flood goes through whole
        assert created == flood and refused == []


async def test_a_chain_of_workers_is_stopped_at_the_dispatch_depth(db: DB, tmp_path: Path) -> None:
    link = dispatch("chain link", allowed_tools=["mcp__harness__dispatch_worker"])
    scenario = Scenario(rules=[Rule(role="worker", match="chain link", replies=[link, {"text": "done"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, dispatch_limits=DispatchLimits(max_depth=2)) as h:
            root = await h.dispatch("chain link", allowed_tools=["mcp__harness__dispatch_worker"])

            async def chain() -> list[dict[str, Any]] | None:
                rows = []
                parent: uuid.UUID | None = root
                while parent is not None:
                    row = await h.task(parent)
                    rows.append(row)
                    found = tables.tasks(db.admin_dsn, "id", parent_task_id=parent)
                    parent = found[0][0] if found else None
                return rows if len(rows) >= 3 and all(r["status"] == "success" for r in rows) else None
            tasks = await until(chain, "three links of the chain to end", 180)
            deepest = await h.events(tasks[-1]["id"])
            total = tables.count_tasks(db.admin_dsn)
            refusals = [e for e in await h.events() if e.event_type == "task.dispatch_refused"]
    # the root (depth 0, requested from outside) and its workers at depth 1 and 2 ran; the one at depth 2 was
    # refused a worker, so there is no fourth
    assert len(tasks) == 3 and total == 3
    results = [b for e in deepest if e.event_type == "stream.user" for b in e.payload["message"]["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result"]
    assert len(results) == 1 and results[0].get("is_error"), results
    assert "PETAL_MAX_DISPATCH_DEPTH" in json.dumps(results[0]["content"])
    assert [(e.task_id, e.payload["reason"], e.payload["depth"]) for e in refusals] == [
        (tasks[-1]["id"], "dispatch depth", 2)]


@pytest.mark.parametrize("per_credential", [True, False], ids=["per credential", "defence off"])
async def test_one_credentials_refusal_flood_leaves_anothers_refusals_journaled(
        db: DB, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch, per_credential: bool) -> None:
    if not per_credential:  # the budget as it was: one for every caller of the (one) loopback address
        admit = RefusalBudget.admit

        def shared(self: RefusalBudget, key: str, now: float | None = None) -> int | None:
            return admit(self, "peer:127.0.0.1", now)
        monkeypatch.setattr(RefusalBudget, "admit", shared)
    flood = REFUSALS_PER_WINDOW + 10
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path) as h:
            await wait_started(h)
            flooder = store.task(thread=store.thread(), running=True)
            victim = store.task(thread=store.thread(), running=True)
            ended = store.task(thread=store.thread(), status="success")  # a grandchild's left-over credential
            url = h.mcp_url or ""
            async with mcp_client(url, flooder.token) as client:
                for _ in range(flood):  # a foreign project, refused every time
                    await client.call_tool("dispatch_worker", {"brief": "x", "project_id": str(uuid.uuid4())})
            async with mcp_client(url) as anonymous:
                for _ in range(flood):
                    await anonymous.call_tool("dispatch_worker", {"brief": "x"})
            seq = tables.journal_head(store.conn)
            async with mcp_client(url, victim.token) as client:
                victims = await client.call_tool("dispatch_worker", {"brief": "y", "project_id": str(uuid.uuid4())})
            async with mcp_client(url, ended.token) as client:
                late = await client.call_tool("get_handoffs", {"scope_id": str(ended.task_id)})
            async with mcp_client(url, flooder.token) as client:
                await client.call_tool("dispatch_worker", {"brief": "x", "project_id": str(uuid.uuid4())})
            async with mcp_client(url) as anonymous:
                await anonymous.call_tool("dispatch_worker", {"brief": "x"})
            events = await h.events()
    assert victims.is_error and late.is_error
    after = [e for e in events if e.seq > seq and e.event_type in ("task.dispatch_refused", "harness.call_refused")]
    journaled = [(e.event_type, e.task_id or e.payload.get("credential_task_id")) for e in after]
    if per_credential:
        # the flooder's own budget is spent, and so is the one every uncredentialed call shares — but the
        # victim's refusal and the ended credential's are journaled, each under its own credential
        flooded = [e for e in events if e.event_type == "task.dispatch_refused" and e.task_id == flooder.task_id]
        assert len(flooded) == REFUSALS_PER_WINDOW
        assert journaled == [("task.dispatch_refused", victim.task_id), ("harness.call_refused", str(ended.task_id))]
    else:  # one shared budget: the flood blinds the journal to everyone's refusals
        assert journaled == []
