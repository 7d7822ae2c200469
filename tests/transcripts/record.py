"""Re-record the transcripts in this folder from the pinned claude CLI and the scripted model.

    python -m tests.transcripts.record
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from executor.scripted_model import Scenario, ScriptedModelServer
from tests.harness import claude_bin

HERE = Path(__file__).parent

CASES = {
    "text.jsonl": (Scenario.single({"text": "Hello from a recorded run."}), [], None),
    "tool_use.jsonl": (
        Scenario.single({"tool_use": {"name": "Bash", "input": {"command": "printf 'a\\r\\nb'"}}}, {"text": "ran"}),
        ["--allowedTools", "Bash"], None),
    "partial_messages.jsonl": (Scenario.single({"text": "token by token here", "delay_s": 0.01}),
                               ["--include-partial-messages"], None),
    "rate_limited.jsonl": (Scenario.single({"error": {"status": 429}}), [], None),
    "denied.jsonl": (Scenario.single({"tool_use": {"name": "Write", "input": {"file_path": "/etc/x", "content": "x"}}},
                                     {"text": "could not"}), [], None),
    "sigterm.jsonl": (Scenario.single({"stall": {"seconds": None}}), [], signal.SIGTERM),
}


def record() -> None:
    for name, (scenario, extra, sig) in CASES.items():
        with ScriptedModelServer(scenario) as model, tempfile.TemporaryDirectory() as home:
            env = {"PATH": os.environ["PATH"], "HOME": home, "ANTHROPIC_BASE_URL": model.url,
                   "ANTHROPIC_API_KEY": "sk-ant-fake", "CLAUDE_CODE_MAX_RETRIES": "0",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1"}
            cmd = [claude_bin(), "-p", "--output-format", "stream-json", "--verbose", *extra, "--", "go"]
            proc = subprocess.Popen(cmd, env=env, cwd=home, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            if sig is not None:
                time.sleep(4)
                os.killpg(proc.pid, sig)
            out, _ = proc.communicate(timeout=60)
            (HERE / name).write_bytes(out)
            print(name, proc.returncode, len(out.splitlines()))


if __name__ == "__main__":
    record()
