"""`petal-dispatch up`: database → migrate → executor → ingress, as one supervised group.

The two services stay separate processes (they never share memory or talk over HTTP). `up` starts them,
prints where to go, and supervises them: a service that dies is started again after a back-off (a log
line says so), and so is the embedded PostgreSQL. Only `up` holds a handle on the embedded server — the
services get their role's DSN — so a clean stop (Ctrl-C, SIGTERM) always stops the server, whatever
died before; and the services die with `up` if it is killed outright (a parent-death signal).
"""

from __future__ import annotations

import contextlib
import json
from importlib import metadata
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from petal_dispatch import (cli_install, config, datalock, dbfiles, dbprocess, dbserver, doctor, ingress_wiring, ports,
                            signals)
from petal_dispatch.config import Settings
from shared import errors, lifeline, logs

log = logs.get(__name__)

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
# how often the loop looks at its children and the database
WATCH_INTERVAL_S = 0.2
# a dead service (or database) is started again after this, doubling per quick death up to the cap
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
# a service that ran this long before dying starts again at the shortest back-off
STABLE_AFTER_S = 60.0
# the page's line is printed again once the services' start-up output has settled: no line for this long
# (or, a service still talking, after the cap), so it is the last thing on the screen
SETTLE_QUIET_S = 1.0
SETTLE_MAX_S = 15.0
# how long a stopped service's last stderr lines are waited for (its pipe closes when it exits)
RELAY_DRAIN_S = 2.0


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


def _child_env(base: Mapping[str, str], settings: Settings, claude: str) -> dict[str, str]:
    env = dict(base)
    env.update(PETAL_DATA_DIR=str(settings.data_dir), PETAL_CLAUDE_BIN=claude, PETAL_WORKDIR=str(settings.free_workdir),
               PETAL_INGRESS_HOST=settings.ingress_host, PETAL_INGRESS_PORT=str(settings.ingress_port),
               PETAL_MCP_HOST=settings.mcp_host, PETAL_MCP_PORT=str(settings.mcp_port))
    return env


def _service_env(env: Mapping[str, str], info: dbserver.ServerInfo, service: str) -> dict[str, str]:
    """A service's environment: its own role's DSN only (no admin DSN, and no handle on the embedded
    server, which `up` alone owns)."""
    out = {k: v for k, v in env.items()
           if k not in ("DATABASE_URL", "PETAL_DATABASE_URL", "PETAL_EXECUTOR_DSN", "PETAL_INGRESS_DSN")}
    if service == "executor":
        out["PETAL_EXECUTOR_DSN"] = info.executor_dsn
    else:
        out["PETAL_INGRESS_DSN"] = info.ingress_dsn
    return out


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


def _wait_for(ready: Callable[[], bool], services: list[Service], what: str) -> None:
    """Until `ready()`, or a service exits (its error is above), or the start-up timeout."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        for s in services:
            if s.proc is not None and s.proc.poll() is not None:
                raise errors.PetalError(f"the {s.name} exited during start-up (exit {s.proc.returncode}; "
                                        "its error is above)")
        if ready():
            return
        time.sleep(0.2)
    raise errors.PetalError(f"{what} within {READY_TIMEOUT_S:.0f} s")


def _wait_ready(url: str, services: list[Service]) -> None:
    def ready() -> bool:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    _wait_for(ready, services, "the ingress was not ready")


def _wait_listening(host: str, port: int, services: list[Service]) -> None:
    """Until the harness MCP accepts connections (the executor says so in its log), so the page's URL
    is the last line `up` prints at start-up."""
    def listening() -> bool:
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            return False
        time.sleep(0.1)  # the server's own start-up line follows its bind
        return True

    _wait_for(listening, services, f"the harness MCP server did not listen on {host}:{port}")


def _stop(children: list[subprocess.Popen[bytes]] | list[subprocess.Popen[str]]) -> None:
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


DEMO_MESSAGE = "Show me what you can do with this project."


DEMO_SCENARIO = Path(__file__).resolve().parent / "demo" / "scenario.json"


def demo_settings(settings: Settings) -> tuple[Settings, dict[str, str]]:
    """The demo's own settings and environment: its project as the working directory (petal's own, beside the
    default working directory, never in the data directory or the checkout), its own CLI config directory, the
    scripted model's fake key; the page in open mode on loopback. The model's address is added when it starts."""
    project = config.default_workdir().parent / "demo-project"
    (project / "src").mkdir(parents=True, exist_ok=True)
    (project / "README.md").write_text("# A demo project\n\nSomething for the demo worker to look at.\n")
    (project / "src" / "app.py").write_text("print('hello')\n")
    claude_config = settings.data_dir / "demo-claude"
    env = {"ANTHROPIC_API_KEY": "sk-ant-demo-not-a-real-key", "PETAL_DEMO": "1",
           "PETAL_CLAUDE_CONFIG_DIR": str(claude_config), "PETAL_CLAUDE_MAX_RETRIES": "0", "PETAL_WORKDIR": str(project)}
    if config.is_loopback(settings.ingress_host):
        env["OPEN_MODE"] = "1"  # the demo is for a browser on this machine
    return settings.model_copy(update={"workdir": project, "claude_config_dir": claude_config}), env


def _start_demo_model(env: dict[str, str], scenario: Path = DEMO_SCENARIO) -> tuple[subprocess.Popen[str], str]:
    model = subprocess.Popen([sys.executable, "-m", "petal_dispatch.demo.scripted_model", "--scenario", str(scenario)],
                             stdout=subprocess.PIPE, text=True, preexec_fn=lifeline.die_with_parent(signal.SIGTERM))
    url = (model.stdout.readline() if model.stdout else "").strip()
    if not url.startswith("http://127.0.0.1:"):
        model.kill()
        raise errors.PetalError("the demo's scripted model did not start")
    env["ANTHROPIC_BASE_URL"] = url
    return model, url


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"},
                                 method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        answer: dict[str, object] = json.load(r)
    return answer


DEMO_THREAD_FILE = "demo-thread"


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def _post_demo_message(url: str, data_dir: Path) -> None:
    """The demo's thread is made once per data directory (its id kept in DEMO_THREAD_FILE) and its first
    message sent once: a later `up --demo` on the same directory reuses both."""
    marker = data_dir / DEMO_THREAD_FILE
    known = marker.read_text().strip() if marker.is_file() else ""
    if known:
        listed = _get(f"{url}/api/threads")
        threads = listed.get("threads") if isinstance(listed, dict) else None
        # reused unless the user archived it (then the demo starts over in a new thread)
        if any(isinstance(t, dict) and str(t.get("id")) == known and t.get("lifecycle") != "archived"
               for t in threads or []):
            return
    # an autonomous thread: the demo's worker starts without an approval (interactive threads ask first)
    thread = _post(f"{url}/api/threads", {"title": "Demo", "mode": "autonomous"})
    marker.write_text(f"{thread['thread_id']}\n")
    _post(f"{url}/api/chat", {"text": DEMO_MESSAGE, "thread_id": thread["thread_id"]})


def preflight(settings: Settings, env: Mapping[str, str], *,
              demo: bool = False) -> tuple[datalock.DataDirLock, Path]:
    """The refusals `up` makes before it starts anything, each one line naming what is wrong (the checks of
    `petal-dispatch doctor`, the sandbox probe included); returns the data directory's `up` lock, held until `up`
    ends (a second `up` on it is refused, naming this one), and the CLI to run (installed when missing)."""
    # the same refusals the ingress and the executor make (no unsandboxed worker, ever)
    ingress_wiring.check_ingress_bind(settings)
    if not demo and not settings.open_mode:  # the demo opens the page itself (open mode on loopback)
        ingress_wiring.check_auth(settings)
    dbfiles.check_data_dir(settings)
    # before the checks and the ports: a second `up` on this data directory is told at once who holds it
    held = datalock.acquire(settings, datalock.UP)
    try:
        datalock.probe(settings, datalock.EXECUTOR)  # a bare `executor` on it: ours would be refused
        claude = doctor.require(settings, env, scope="up", demo=demo)
        ports.check_free(settings.ingress_host, settings.ingress_port, "ingress")
        ports.check_free(settings.mcp_host, settings.mcp_port, "harness MCP server")
    except BaseException:
        held.release()
        raise
    return held, claude


def _version() -> str:
    try:
        return metadata.version("petal-dispatch")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def auth_warning(settings: Settings, *, demo: bool = False) -> str | None:
    """One line, with the fix, when the auth mode will refuse a plain browser on this machine: proxy mode
    on loopback, where no proxy stands in front to vouch for the user."""
    if demo or settings.open_mode or settings.auth_mode != "proxy" or not config.is_loopback(settings.ingress_host):
        return None
    return ("proxy mode: a browser that does not come through your proxy gets 401 here; for a local try "
            "set OPEN_MODE=1, or use token mode (PETAL_AUTH_MODE=token, PETAL_AUTH_TOKEN=$(openssl rand -hex 16)) "
            "and sign in at /login")


def run(settings: Settings, env: Mapping[str, str], *, demo: bool = False, scenario: Path | None = None) -> int:
    """Run the pair. `demo`: the real CLI against the scripted model, playing `scenario` (a JSON file as
    petal_dispatch/demo/scripted_model.py describes) or, without one, the built-in demo, which also sends its first
    message."""
    if scenario is not None and not scenario.is_file():
        raise errors.ConfigError(f"no scenario file {scenario}")
    extra_env: dict[str, str] = {}
    if demo:
        settings, extra_env = demo_settings(settings)
    held, claude = preflight(settings, {**env, **extra_env}, demo=demo)
    with held:
        # which CLI runs and where free threads work: said before anything starts (the page's URL comes last)
        log.info("starting", version=_version(), claude=str(claude), claude_version=cli_install.version_of(claude),
                 workdir=str(settings.free_workdir))
        warning = auth_warning(settings, demo=demo)
        if warning is not None:
            log.warning("auth_refuses_plain_browser", detail=warning)
        embedded = None if _external(settings) else dbprocess.embedded(settings)
        try:
            info = dbserver.resolve(settings)  # starts the embedded server when there is no DATABASE_URL, migrates
            return _supervise(settings, {**env, **extra_env}, info, embedded, str(claude), demo=demo,
                              scenario=scenario)
        finally:
            if embedded is not None:
                embedded.release()  # stops the server: no live process holds another handle


def _set_apart(line: str) -> None:
    """`line` on stdout with a blank line before it (on stderr, where the log lines go: stdout's first line stays
    the page's) and after it."""
    with contextlib.suppress(OSError):
        sys.stderr.write("\n")
        sys.stderr.flush()
    print(f"{line}\n", flush=True)


def _external(settings: Settings) -> bool:
    return bool(settings.database_url or settings.executor_dsn or settings.ingress_dsn)


def _supervise(settings: Settings, env: Mapping[str, str], info: dbserver.ServerInfo,
               embedded: dbprocess.EmbeddedServer | None, claude: str, *, demo: bool, scenario: Path | None) -> int:
    child_env = _child_env(env, settings, claude)
    extra: list[subprocess.Popen[str]] = []
    stop = threading.Event()
    signals.on_stop(stop.set)
    cmd = [sys.executable, "-m", "petal_dispatch.cli"]
    services: list[Service] = []
    database = DatabaseWatch(embedded) if embedded is not None else None
    try:
        if demo:
            model, _ = _start_demo_model(child_env, scenario or DEMO_SCENARIO)
            extra.append(model)
        output = Output()
        services = [Service(name, [*cmd, name], _service_env(child_env, info, name), output=output)
                    for name in ("executor", "ingress")]
        for s in services:
            s.start()
        host = "127.0.0.1" if settings.ingress_host in ("0.0.0.0", "::") else settings.ingress_host
        url = f"http://{host}:{settings.ingress_port}"
        _wait_ready(url, services)
        _wait_listening(settings.mcp_host, settings.mcp_port, services)  # its "Running on" line comes first
        if demo and scenario is None:
            _post_demo_message(url, settings.data_dir.resolve())
        what = "the demo (a scripted model, not Claude)" if demo else "petal-dispatch"
        page = f"{url}/login" if not demo and not settings.open_mode and settings.auth_mode == "token" else f"{url}/"
        # the page to open: stdout's first line (scripts read it), set apart from the log lines around it, and
        # printed again once the services' start-up lines have settled, so it is the last thing on the screen
        up_line = f"{what} is up: {page}  (database: {info.location}; Ctrl-C stops everything)"
        _set_apart(up_line)
        output.settle(stop)
        if not stop.is_set():
            _set_apart(up_line)
        while not stop.is_set():
            if database is not None:
                database.watch(time.monotonic())
            for s in services:
                s.watch(time.monotonic())  # not one `now`: restarting the database can take seconds
            time.sleep(WATCH_INTERVAL_S)
        return 0
    finally:
        _stop([s.proc for s in services if s.proc is not None])
        for s in services:  # their last lines (the stop's own) relayed before `up` exits
            if s.relaying is not None:
                s.relaying.join(RELAY_DRAIN_S)
        _stop(extra)
