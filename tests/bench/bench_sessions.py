"""The index of stored CLI conversations at scale: what one pass of looking costs, and that a grown file is read
without reading the rest again.

    python -m tests.bench.bench_sessions [FILES] [ROUNDS]
FILES conversation files (default 2,000, each a 30-line conversation of about 12 KB, in 50 project
directories); ROUNDS (default 100) passes of each kind, interleaved so a shared machine's load drifts over
all of them alike. Kinds: the baseline — a bare `os.scandir` + `stat` of the same tree, the least any
looking costs; an idle pass (`Index._look`: stat everything, read nothing, look up the CLI's registry of live processes);
a pass after one file grew by one line; the live-process lookups alone (the CLI's registry, each pass; every
process's command line, at most every 5 s). The first pass (every file read
whole) is measured once. Printed: exact percentiles with their sample counts, ratios to the baseline.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from executor.sessions import live
from executor.sessions.index import Index
from tests.bench import record, stats


def _conversation(i: int) -> bytes:
    lines = []
    for turn in range(15):
        for role in ("user", "assistant"):
            lines.append(json.dumps({"type": role, "message": {"role": role, "content": f"{role} {i}.{turn} " + "x" * 300},
                                     "timestamp": f"2026-12-01T10:{turn:02d}:00.000Z", "uuid": f"{i}-{turn}-{role}",
                                     "cwd": f"/w/p{i % 50}", "gitBranch": "main", "isSidechain": False}))
    return ("\n".join(lines) + "\n").encode()


def _bare_walk(root: Path) -> int:
    n = 0
    for project in os.scandir(root / "projects"):
        for entry in os.scandir(project.path):
            entry.stat(follow_symlinks=False)
            n += 1
    return n


def main(files: int, rounds: int) -> None:
    print(f"load before: {stats.machine_load()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "claude"
        paths = []
        for i in range(files):
            path = root / "projects" / f"-w-p{i % 50}" / f"{i:08d}-0000-4000-8000-000000000000.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_conversation(i))
            paths.append(path)
        index = Index(None, "bench", (root,), (Path("/w"),), Path(tmp) / ".claude")  # type: ignore[arg-type]
        started = time.perf_counter()
        changed, _ = index._look()
        first = time.perf_counter() - started
        assert len(changed) == files
        bare: list[float] = []
        idle: list[float] = []
        grown: list[float] = []
        lookup: list[float] = []
        named: list[float] = []
        line = json.dumps({"type": "user", "message": {"role": "user", "content": "more"},
                           "timestamp": "2026-12-01T11:00:00.000Z"}).encode() + b"\n"
        for r in range(rounds):
            t = time.perf_counter()
            assert _bare_walk(root) == files
            bare.append(time.perf_counter() - t)
            t = time.perf_counter()
            assert index._look() == ([], [])
            idle.append(time.perf_counter() - t)
            with paths[r % files].open("ab") as fh:
                fh.write(line)
            t = time.perf_counter()
            changed, _ = index._look()
            grown.append(time.perf_counter() - t)
            assert len(changed) == 1
            t = time.perf_counter()
            live.registered(root)
            lookup.append(time.perf_counter() - t)
            t = time.perf_counter()
            live.named_on_command_lines()
            named.append(time.perf_counter() - t)
        print(f"files {files} ({sum(p.stat().st_size for p in paths) / 1e6:.1f} MB), rounds {rounds}")
        print(f"first pass (every file read whole): {first * 1000:.1f} ms (n=1)")
        for name, values in (("bare scandir+stat", bare), ("idle pass", idle), ("one file grown", grown),
                             ("registry lookup", lookup), ("command-line scan", named)):
            print(f"{name:>20}: {stats.summary(values, (50, 90))}")
        for name, values in (("idle pass", idle), ("one file grown", grown)):
            p50, p90 = stats.ratio(values, bare, 50), stats.ratio(values, bare, 90)
            print(f"{name:>20} / bare: p50 {p50:.2f}x  p90 {p90:.2f}x" if p50 and p90 else f"{name}: too few samples")
            record.value(f"sessions_{name.replace(' ', '_')}", f"stored CLI conversations index, {name} over {files} files",
                         (stats.percentile(values, 50) or 0) * 1000, "ms", n=len(values),
                         stat="p50", baseline=(stats.percentile(bare, 50) or 0) * 1000,
                         baseline_label="bare scandir + stat", baseline_n=len(bare), ratio=p50)
    print(f"load after: {stats.machine_load()}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000, int(sys.argv[2]) if len(sys.argv) > 2 else 100)
