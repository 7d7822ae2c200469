"""A service whose stop hangs exits anyway, saying what it still waited on (petal_dispatch/signals.py): a crashed loop
sets `stop`, and a step of the orderly stop that never returns would otherwise leave a process that serves nothing
and that nothing restarts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from petal_dispatch.signals import STOP_OVERDUE_EXIT

pytestmark = pytest.mark.unit

# a service as `serve_until_stopped` runs it: a loop crashes (sets stop), then its stop waits on `hang`
SERVICE = textwrap.dedent("""
    import asyncio, sys, time
    from shared import logs
    from petal_dispatch import signals

    async def a_step_that_never_returns(how):
        if how == "await":
            await asyncio.Event().wait()
        if how == "block":
            time.sleep(3600)  # a blocking call on the event loop: no task of the loop runs again

    async def serve(how, stop):
        stop.set()  # as executor/main.py's _Loops does for a crashed loop
        await stop.wait()
        await a_step_that_never_returns(how)

    logs.configure(fmt="json")
    signals.serve_until_stopped(serve, sys.argv[1], stop_within_s=float(sys.argv[2]))
    print("came down", flush=True)
""")


def _run(how: str, within_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SERVICE, how, str(within_s)], capture_output=True, text=True,
                          timeout=60)


def _overdue(stderr: str) -> list[str]:
    """What the `stop_overdue` line says the service waited on."""
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    (said,) = [line for line in lines if line["event"] == "stop_overdue"]
    return [str(where) for where in said["waiting"]]


@pytest.mark.parametrize("how", ["await", "block"])
def test_a_stop_that_hangs_past_its_deadline_says_where_it_waits_and_exits_non_zero(how: str) -> None:
    ran = _run(how, 0.5)
    assert ran.returncode == STOP_OVERDUE_EXIT, ran.stderr
    assert "came down" not in ran.stdout
    waiting = "\n".join(_overdue(ran.stderr))
    # where: the task's await chain when the loop waits, the main thread's stack when it is blocked
    assert "a_step_that_never_returns" in waiting, waiting


def test_a_stop_that_completes_is_not_cut_short() -> None:
    ran = _run("return", 0.5)
    assert ran.returncode == 0, ran.stderr
    assert "came down" in ran.stdout and "stop_overdue" not in ran.stderr
