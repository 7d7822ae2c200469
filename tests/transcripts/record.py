"""Re-record the transcripts in this folder from a claude CLI and the scripted model.

    python -m tests.transcripts.record                      # the pinned CLI: the files in this folder
    python -m tests.transcripts.record --runs               # the pinned CLI: the interrupted/failed runs
                                                            # into v<version>/
    python -m tests.transcripts.record --runs --claude BIN  # another CLI (npm install --prefix DIR
                                                            # @anthropic-ai/claude-code@X): into v<X>/

`tests/store/test_transcript.py` expects a status for every file; docs/claude-cli.md says what differed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.harness import claude_bin

HERE = Path(__file__).parent


@dataclasses.dataclass(frozen=True)
class Case:
    scenario: Scenario
    extra: list[str] = dataclasses.field(default_factory=list)
    sig: signal.Signals | None = None  # sent to the process group 4 s in
    # with --input-format stream-json: lines written to stdin (each after a pause), then stdin closes
    stdin: tuple[tuple[float, dict[str, object]], ...] = ()


def _cases() -> dict[str, Case]:
    return {
        "text.jsonl": Case(Scenario.single({"text": "Hello from a recorded run."})),
        "tool_use.jsonl": Case(
            Scenario.single({"tool_use": {"name": "Bash", "input": {"command": "printf 'a\\r\\nb'"}}},
                            {"text": "ran"}),
            ["--allowedTools", "Bash"]),
        "partial_messages.jsonl": Case(Scenario.single({"text": "token by token here", "delay_s": 0.01}),
                                       ["--include-partial-messages"]),
        "rate_limited.jsonl": Case(Scenario.single({"error": {"status": 429}})),
        "denied.jsonl": Case(Scenario.single({"tool_use": {"name": "Write", "input": {"file_path": "/etc/x",
                                                                                      "content": "x"}}},
                                             {"text": "could not"})),
        "sigterm.jsonl": Case(Scenario.single({"stall": {"seconds": None}}), sig=signal.SIGTERM),
    }


def _runs() -> dict[str, Case]:
    """Interrupted and failed runs, recorded per CLI version."""
    bash_forever = {"tool_use": {"name": "Bash", "input": {"command": "tail -f /dev/null"}}}
    return {
        # SIGINT while the model streams, and while a tool runs: the CLI's own "interrupted by user"
        "sigint_streaming.jsonl": Case(Scenario.single({"stall": {"seconds": None, "text": "partial"}}),
                                       sig=signal.SIGINT),
        "sigint_tool.jsonl": Case(Scenario.single(bash_forever, {"text": "never"}), ["--allowedTools", "Bash"],
                                  sig=signal.SIGINT),
        "sigterm_streaming.jsonl": Case(Scenario.single({"stall": {"seconds": None}}), sig=signal.SIGTERM),
        # the control protocol's interrupt (a long-lived --input-format stream-json process)
        "control_interrupt.jsonl": Case(
            Scenario.single({"stall": {"seconds": None}}), ["--input-format", "stream-json"],
            stdin=((0, {"type": "user", "message": {"role": "user", "content": "go"}}),
                   (4, {"type": "control_request", "request_id": "req-1", "request": {"subtype": "interrupt"}}))),
        # a budget reached with work done
        "max_turns.jsonl": Case(
            Scenario.single({"tool_use": {"name": "Bash", "input": {"command": "echo one"}}},
                            {"tool_use": {"name": "Bash", "input": {"command": "echo two"}}}, {"text": "done"}),
            ["--allowedTools", "Bash", "--max-turns", "1"]),
        "max_budget.jsonl": Case(
            Scenario.single({"tool_use": {"name": "Bash", "input": {"command": "echo one"}}},
                            {"tool_use": {"name": "Bash", "input": {"command": "echo two"}}}, {"text": "done"}),
            ["--allowedTools", "Bash", "--max-budget-usd", "0.0001"]),
        # API errors, no retries
        "api_error_500.jsonl": Case(Scenario.single({"error": {"status": 500, "message": "boom"}})),
        "api_error_401.jsonl": Case(Scenario.single({"error": {"status": 401, "message": "bad key"}})),
        "rate_limited_429.jsonl": Case(Scenario.single({"error": {"status": 429}})),
        "success.jsonl": Case(Scenario.single({"text": "Hello from a recorded run."})),
    }


def _version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], check=False, capture_output=True, text=True, timeout=60).stdout
    return out.split()[0]


def record(cases: dict[str, Case], binary: str, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, case in cases.items():
        with ScriptedModelServer(case.scenario) as model, tempfile.TemporaryDirectory() as home:
            env = {"PATH": os.environ["PATH"], "HOME": home, "ANTHROPIC_BASE_URL": model.url,
                   "ANTHROPIC_API_KEY": "sk-ant-fake", "CLAUDE_CODE_MAX_RETRIES": "0",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1"}
            cmd = [binary, "-p", "--output-format", "stream-json", "--verbose", *case.extra]
            if not case.stdin:
                cmd += ["--", "go"]
            proc = subprocess.Popen(cmd, env=env, cwd=home, stdout=subprocess.PIPE,
                                    stdin=subprocess.PIPE if case.stdin else subprocess.DEVNULL,
                                    start_new_session=True)
            if case.stdin:
                assert proc.stdin is not None
                for pause, obj in case.stdin:
                    time.sleep(pause)  # the recorded case's pace: a user who types this long after the last line
                    proc.stdin.write(json.dumps(obj).encode() + b"\n")
                    proc.stdin.flush()
                time.sleep(2)  # a user still there after the last line: the CLI sees no early end of input
                proc.stdin.close()
            if case.sig is not None:
                time.sleep(4)  # the signal lands mid-turn, as a user's stop would, not before the CLI started
                os.killpg(proc.pid, case.sig)
            out = proc.stdout.read()  # type: ignore[union-attr]  # stdout=PIPE: never None
            proc.wait(timeout=60)
            (out_dir / name).write_bytes(out)
            last = out.strip().splitlines()[-1] if out.strip() else b"{}"
            try:
                tail = json.loads(last)
                summary = {k: tail.get(k) for k in ("type", "subtype", "is_error", "terminal_reason")}
            except ValueError:
                summary = {}
            print(out_dir.name, name, "rc", proc.returncode, "lines", len(out.splitlines()), summary)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--claude", help="the CLI binary (default: the pinned one)")
    parser.add_argument("--runs", action="store_true", help="record the interrupted and failed runs")
    args = parser.parse_args()
    binary = args.claude or claude_bin()
    if args.runs:
        record(_runs(), binary, HERE / f"v{_version(binary)}")
    else:
        record(_cases(), binary, HERE)


if __name__ == "__main__":
    main()
