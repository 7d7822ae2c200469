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
    import asyncio, sys, threading, time
    from shared import logs
    from petal_dispatch import signals

    def a_blocking_call_that_never_returns():
        time.sleep(3600)  # a worker thread that never returns: asyncio.run's end waits on it

    async def a_step_that_never_returns(how):
        if how in ("await", "stuck-log"):
            await asyncio.Event().wait()
        if how == "block":
            time.sleep(3600)  # a blocking call on the event loop: no task of the loop runs again

    async def serve(how, stop):
        if how == "failed-start":  # a start that fails, leaving a thread busy: asyncio.run's end waits on it
            asyncio.create_task(asyncio.to_thread(a_blocking_call_that_never_returns))
            await asyncio.sleep(0)  # the task's first step: its call goes to a worker thread
            raise RuntimeError("a port in use")
        stop.set()  # as executor/main.py's _Loops does for a crashed loop
        await stop.wait()
        await a_step_that_never_returns(how)

    if sys.argv[1] == "stuck-log":  # saying where it waits waits itself (a full pipe under the logger's lock)
        signals._overdue = lambda *args: threading.Event().wait()
        signals.OVERDUE_LOG_S = 0.5
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


@pytest.mark.parametrize("how", ["await", "block", "failed-start"])
def test_a_stop_that_hangs_past_its_deadline_says_where_it_waits_and_exits_non_zero(how: str) -> None:
    ran = _run(how, 0.5)
    assert ran.returncode == STOP_OVERDUE_EXIT, ran.stderr
    assert "came down" not in ran.stdout
    waiting = "\n".join(_overdue(ran.stderr))
    # where: the task's await chain when the loop waits, the blocked thread's stack
    assert "never_returns" in waiting, waiting


def test_a_stop_that_completes_is_not_cut_short() -> None:
    ran = _run("return", 0.5)
    assert ran.returncode == 0, ran.stderr
    assert "came down" in ran.stdout and "stop_overdue" not in ran.stderr


def test_when_saying_where_it_waits_hangs_too_the_process_still_exits() -> None:
    ran = _run("stuck-log", 0.5)
    assert ran.returncode == STOP_OVERDUE_EXIT, ran.stderr
    assert "came down" not in ran.stdout
