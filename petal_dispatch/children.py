"""What `up` supervises: each service a process started again after a back-off when it dies, the embedded
PostgreSQL likewise, and the services' stderr relayed through `up`'s."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO

from petal_dispatch import dbprocess
from shared import lifeline, logs

log = logs.get(__name__)

STOP_TIMEOUT_S = 20.0
# a dead service (or database) is started again after this, doubling per quick death up to the cap
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
# a service that ran this long before dying starts again at the shortest back-off
STABLE_AFTER_S = 60.0
# the page's line is printed again once the services' start-up output has settled: no line for this long
# (or, a service still talking, after the cap), so it is the last thing on the screen
SETTLE_QUIET_S = 1.0
SETTLE_MAX_S = 15.0


class Output:
    """The services' stderr, relayed line by line to ours: `up` knows when their start-up lines have settled."""

    def __init__(self) -> None:
        self.last_line_at = time.monotonic()
        self._lock = threading.Lock()  # one line at a time on our stderr, whole

    def relay(self, stream: IO[bytes]) -> None:
        """Until the child closes its stderr (it exited): its lines onto ours."""
        with stream:
            for chunk in iter(stream.readline, b""):
                with self._lock:
                    sys.stderr.buffer.write(chunk)
                    sys.stderr.buffer.flush()
                self.last_line_at = time.monotonic()

    def settle(self, stop: threading.Event) -> None:
        """Until no service wrote a line for SETTLE_QUIET_S (at most SETTLE_MAX_S), or a stop."""
        deadline = time.monotonic() + SETTLE_MAX_S
        while not stop.is_set() and time.monotonic() < deadline:
            quiet = time.monotonic() - self.last_line_at
            if quiet >= SETTLE_QUIET_S:
                return
            stop.wait(SETTLE_QUIET_S - quiet)


def backoff_s(failures: int) -> float:
    """The wait before the next start after `failures` quick deaths in a row."""
    return min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * 2.0 ** max(0, failures))


@dataclass
class Service:
    """One supervised service process, started again after a back-off when it dies."""

    name: str
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    restarts: int = 0
    output: Output | None = None  # its stderr relayed through `up` (else inherited)
    relaying: threading.Thread | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, env=self.env, preexec_fn=lifeline.die_with_parent(signal.SIGTERM),
                                     stderr=subprocess.PIPE if self.output is not None else None)
        if self.output is not None and self.proc.stderr is not None:
            self.relaying = threading.Thread(target=self.output.relay, args=(self.proc.stderr,),
                                             name=f"{self.name}-stderr", daemon=True)
            self.relaying.start()
        self.started = time.monotonic()
        self.restart_at = None

    def watch(self, now: float) -> None:
        if self.proc is None:
            return
        if self.restart_at is None:
            if self.proc.poll() is None:
                return
            if now - self.started >= STABLE_AFTER_S:
                self.failures = 0
            delay = backoff_s(self.failures)
            self.failures += 1
            self.restart_at = now + delay
            log.warning("service_died", service=self.name, exit_code=self.proc.returncode, restart_in_s=delay)
        elif now >= self.restart_at:
            self.start()
            self.restarts += 1
            log.warning("service_restarted", service=self.name, pid=self.proc.pid, restarts=self.restarts)


@dataclass
class DatabaseWatch:
    """The embedded server, started again after a back-off when it dies."""

    server: dbprocess.EmbeddedServer
    failures: int = 0
    restart_at: float | None = None

    def watch(self, now: float) -> None:
        if self.restart_at is None:
            if self.server.pid() is not None:
                return
            delay = backoff_s(self.failures)
            self.restart_at = now + delay
            log.warning("database_died", pgdata=str(self.server.pgdata), restart_in_s=delay)
        elif now >= self.restart_at:
            try:
                self.server.restart()
            except Exception as exc:  # noqa: BLE001 - e.g. its old backends still hold the shared memory
                self.failures += 1
                delay = backoff_s(self.failures)
                self.restart_at = now + delay
                log.warning("database_restart_failed", error=f"{type(exc).__name__}: {exc}"[:300],
                            retry_in_s=delay)
                return
            self.failures, self.restart_at = 0, None
            log.warning("database_restarted", pid=self.server.pid())


def stop_all(children: list[subprocess.Popen[bytes]] | list[subprocess.Popen[str]]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
