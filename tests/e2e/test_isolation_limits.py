"""Each spawn's limits end to end (executor/sandbox/limits.py): a worker's Bash runs a fork bomb, a memory hog or a
/tmp fill in its sandbox through the real executor, the real CLI and the scripted model. With the limits, the fork
bomb and the hog end their task `crashed` with the limit as its reason while a sibling keeps running and completes;
the fill stops at the /tmp size. Each has its negative control: with the limit off, the same bounded program gets
past the bound by a small margin (never exhausting the machine), so each test can fail."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from executor.sandbox import limits
from executor.sandbox.limits import SpawnLimits
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests.harness import running_executor, sandbox_for
from tests.pg import DB

PIDS_MAX = 64
# bounded: 100 processes, each gone within 20 s, a small margin past PIDS_MAX (the CLI's own threads count too)
FORK_BOMB = ("for i in $(seq 1 100); do (exec sleep 20) & done; sleep 1; "
             "echo \"live=$(ls /proc | grep -c '^[0-9]')\"; kill $(jobs -p)")
MEMORY_MAX = 512 << 20
# 640 MiB touched: past MEMORY_MAX with the CLI's own ~220 MiB beside it, far from the machine's memory
MEMORY_HOG = "python3 -c 'b = bytearray(640 << 20); b[::4096] = b\"x\" * len(b[::4096]); print(\"held\", len(b))'"
TMP_SIZE = 16 << 20
# a script in the tree (the gate refuses a shell redirect outside it; a program's own writes are the sandbox's)
TMP_FILL = "python3 fill.py"
FILL_PY = """
import os
try:
    with open("/tmp/fill", "wb") as f:
        for _ in range(24):
            f.write(b"x" * (1 << 20))
            f.flush()
except OSError:
    pass
written = os.path.getsize("/tmp/fill")
os.remove("/tmp/fill")  # the CLI keeps its own temporary files in /tmp too (its Bash output among them)
print(f"written={written}")
"""
SIBLING_WAITS = "until [ -e bomb-ended ]; do sleep 0.1; done; echo sibling-finished"


def _bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "Bash", "input": {"command": command, "timeout": 120000}}}


def _scenario(hostile: str) -> Scenario:
    return Scenario(rules=[
        Rule(role="worker", match="sibling", replies=[_bash(SIBLING_WAITS), {"text": "sibling done"}]),
        Rule(role="worker", match="hostile", replies=[_bash(hostile), {"text": "hostile done"}]),
    ])


def _tool_output(events: list[Any]) -> str:
    out = []
    for e in events:
        content = (e.payload.get("message") or {}).get("content") if e.event_type == "stream.user" else None
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                out.append(json.dumps(block.get("content")))
    return "\n".join(out)


async def _run(db: DB, tmp: Path, hostile: str, spawn_limits: SpawnLimits, *, sibling: bool = False
               ) -> dict[str, Any]:
    """The hostile worker's end (and its sibling's, run beside it), with every spawn under `spawn_limits`."""
    sandbox = replace(sandbox_for(tmp), limits=spawn_limits)
    (tmp / "work").mkdir(parents=True, exist_ok=True)
    (tmp / "work" / "fill.py").write_text(FILL_PY)
    with ScriptedModelServer(_scenario(hostile)) as model:
        async with running_executor(db, model, tmp, sandbox=sandbox) as h:
            sibling_id = None
            if sibling:
                sibling_id = await h.dispatch("a sibling that waits for the hostile one")
                await h.wait_task(sibling_id, lambda r: r["status"] == "running")
                await h.wait_event(sibling_id, "stream.system.init")
            hostile_id = await h.dispatch("the hostile one")
            final = await h.wait_final(hostile_id, timeout=120)
            out: dict[str, Any] = {"final": final, "output": _tool_output(await h.events(hostile_id)),
                                   "exited": (await h.wait_event(hostile_id, "task.exited")).payload}
            if sibling_id is not None:
                out["sibling_running"] = (await h.task(sibling_id))["status"] == "running"
                (tmp / "work" / "bomb-ended").touch()
                out["sibling"] = await h.wait_final(sibling_id, timeout=120)
                out["sibling_output"] = _tool_output(await h.events(sibling_id))
            # the executor is still there and spawns: one more task runs to its end
            (tmp / "work" / "bomb-ended").touch()
            out["after"] = await h.wait_final(await h.dispatch("a sibling after it"), timeout=120)
            return out


def _number(output: str, name: str) -> int:
    match = re.search(rf"{name}=(\d+)", output)
    assert match is not None, output
    return int(match.group(1))


def _live(output: str) -> int:
    return _number(output, "live")


def _written(output: str) -> int:
    return _number(output, "written")


def _needs_cgroups() -> None:
    if limits.find_tree(SpawnLimits(PIDS_MAX, MEMORY_MAX, None)) is None:
        pytest.skip("no cgroup this executor can make here: pids and memory are left to rlimits (docs/deploy.md)")


async def test_a_fork_bomb_ends_its_own_task_at_the_pids_limit_and_its_sibling_completes(db: DB, tmp_path: Path
                                                                                        ) -> None:
    _needs_cgroups()
    got = await _run(db, tmp_path, FORK_BOMB, SpawnLimits(pids_max=PIDS_MAX), sibling=True)
    assert got["final"]["status"] == "crashed" and got["final"]["status_reason"] == limits.PIDS_LIMIT
    assert got["exited"]["reason"] == limits.PIDS_LIMIT
    assert got["sibling_running"], "the sibling was ended with the bomb"
    assert got["sibling"]["status"] == "success" and "sibling-finished" in got["sibling_output"]
    assert got["after"]["status"] == "success"


async def test_without_the_pids_limit_the_same_bomb_gets_past_it(db: DB, tmp_path: Path) -> None:
    got = await _run(db, tmp_path, FORK_BOMB, SpawnLimits(pids_max=None, memory_max=None, tmp_size=None))
    assert got["final"]["status"] == "success"
    assert _live(got["output"]) > PIDS_MAX


async def test_a_memory_hog_ends_its_task_at_the_memory_limit(db: DB, tmp_path: Path) -> None:
    _needs_cgroups()
    got = await _run(db, tmp_path, MEMORY_HOG, SpawnLimits(memory_max=MEMORY_MAX))
    assert got["final"]["status"] == "crashed" and got["final"]["status_reason"] == limits.MEMORY_LIMIT
    assert f"held {640 << 20}" not in got["output"]
    assert got["after"]["status"] == "success"


async def test_without_the_memory_limit_the_same_hog_holds_past_it(db: DB, tmp_path: Path) -> None:
    got = await _run(db, tmp_path, MEMORY_HOG, SpawnLimits(pids_max=None, memory_max=None, tmp_size=None))
    assert got["final"]["status"] == "success"
    assert f"held {640 << 20}" in got["output"]


async def test_a_tmp_fill_stops_at_the_tmp_size(db: DB, tmp_path: Path) -> None:
    got = await _run(db, tmp_path, TMP_FILL, SpawnLimits(tmp_size=TMP_SIZE))
    # up to the size, less what the CLI's own temporary files hold there meanwhile
    assert TMP_SIZE - (1 << 20) < _written(got["output"]) <= TMP_SIZE


async def test_without_the_tmp_size_the_same_fill_gets_past_it(db: DB, tmp_path: Path) -> None:
    got = await _run(db, tmp_path, TMP_FILL, SpawnLimits(pids_max=None, memory_max=None, tmp_size=None))
    assert _written(got["output"]) == 24 << 20

