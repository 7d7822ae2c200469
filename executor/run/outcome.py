"""How a run ended, from its exit and why the harness stopped it (if it did): the stop reasons the supervisor gives
and the settler reads, and the status they make of an exit (pure; the settler imports this, not the runner)."""

from __future__ import annotations

from executor.run import stream
from executor.sandbox import limits

# Stops the harness sends for its own reasons are not the user's cancellation: the executor's shutdown
# (a deploy) cut the run off like a crash, and the runtime cap is a failure; the policy retries both.
EXECUTOR_SHUTDOWN = "executor_shutdown"  # the reason the executor gives the runs its own stop cuts off
HARNESS_STOPS = {EXECUTOR_SHUTDOWN: "crashed", "max_runtime": "failed"}
# a spawn that hit its pids or memory limit (executor/sandbox/limits.py) crashed, even when its CLI outlived the
# process the limit ended and finished: what it did was cut short
LIMIT_STOPS = (limits.PIDS_LIMIT, limits.MEMORY_LIMIT)
USER_STOP = "stop_requested"
# a process parked on the user past the supervisor's bound (PETAL_MAX_PARKED): ended, its question left answerable
# (the answer resumes the conversation in a new turn); not the turn's failure
PARKED_LIMIT = "parked_limit"


def end_outcome(returncode: int, facts: stream.TurnFacts, stop_reason: str | None,
                gate_denials: int = 0) -> stream.Outcome:
    """A run's status from its exit, why the harness stopped it (if it did) and how many of its calls the
    harness refused at a gate (pure)."""
    if stop_reason in LIMIT_STOPS:
        return stream.Outcome("crashed", stop_reason)
    if stop_reason is None or stop_reason not in HARNESS_STOPS:
        outcome = stream.derive_status(returncode, facts, stop_requested=stop_reason is not None,
                                       gate_denials=gate_denials)
        return stream.Outcome(outcome.status, stop_reason or outcome.reason)
    outcome = stream.derive_status(returncode, facts, gate_denials=gate_denials)
    if outcome.status == "success":
        return outcome  # it finished before the stop took effect
    return stream.Outcome(HARNESS_STOPS[stop_reason], stop_reason)
