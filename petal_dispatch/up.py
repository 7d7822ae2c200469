"""`petal-dispatch up`: database → migrate → executor → ingress, as one supervised group.

The two services stay separate processes (they never share memory or talk over HTTP). `up` starts them,
prints where to go, and supervises them: a service that dies is started again after a back-off (a log
line says so), and so is the embedded PostgreSQL. Only `up` holds a handle on the embedded server — the
services get their role's DSN — so a clean stop (Ctrl-C, SIGTERM) always stops the server, whatever
died before; and the services die with `up` if it is killed outright (a parent-death signal).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path

from petal_dispatch import (cli_install, config, datalock, dbfiles, dbprocess, dbserver, doctor, ingress_wiring, ports,
                            signals)
from petal_dispatch.children import DatabaseWatch, Output, Service, stop_all
from petal_dispatch.config import Settings
from petal_dispatch.demo import launch
from shared import errors, logs

log = logs.get(__name__)

READY_TIMEOUT_S = 60.0
# how often the loop looks at its children and the database
WATCH_INTERVAL_S = 0.2
# how long a stopped service's last stderr lines are waited for (its pipe closes when it exits)
RELAY_DRAIN_S = 2.0


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
        settings, extra_env = launch.demo_settings(settings)
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
    services: list[Service] = []
    try:
        if demo:
            model, _ = launch.start_model(child_env, scenario or launch.DEMO_SCENARIO)
            extra.append(model)
        output = Output()
        services = _start_services(child_env, info, output)
        url = _started(settings, services, demo=demo, scenario=scenario)
        # the page to open: stdout's first line (scripts read it), set apart from the log lines around it, and
        # printed again once the services' start-up lines have settled, so it is the last thing on the screen
        up_line = f"{_what(demo)} is up: {_page(settings, url, demo)}  (database: {info.location}; Ctrl-C stops everything)"
        _set_apart(up_line)
        output.settle(stop)
        if not stop.is_set():
            _set_apart(up_line)
        _watch(stop, DatabaseWatch(embedded) if embedded is not None else None, services)
        return 0
    finally:
        stop_all([s.proc for s in services if s.proc is not None])
        for s in services:  # their last lines (the stop's own) relayed before `up` exits
            if s.relaying is not None:
                s.relaying.join(RELAY_DRAIN_S)
        stop_all(extra)


def _start_services(child_env: Mapping[str, str], info: dbserver.ServerInfo, output: Output) -> list[Service]:
    cmd = [sys.executable, "-m", "petal_dispatch.cli"]
    services = [Service(name, [*cmd, name], _service_env(child_env, info, name), output=output)
                for name in ("executor", "ingress")]
    for s in services:
        s.start()
    return services


def _started(settings: Settings, services: list[Service], *, demo: bool, scenario: Path | None) -> str:
    """Until both services are up (and the demo's first message sent); the page's base URL."""
    host = "127.0.0.1" if settings.ingress_host in ("0.0.0.0", "::") else settings.ingress_host
    url = f"http://{host}:{settings.ingress_port}"
    _wait_ready(url, services)
    _wait_listening(settings.mcp_host, settings.mcp_port, services)  # its "Running on" line comes first
    if demo and scenario is None:
        launch.post_first_message(url, settings.data_dir.resolve())
    return url


def _what(demo: bool) -> str:
    return "the demo (a scripted model, not Claude)" if demo else "petal-dispatch"


def _page(settings: Settings, url: str, demo: bool) -> str:
    return f"{url}/login" if not demo and not settings.open_mode and settings.auth_mode == "token" else f"{url}/"


def _watch(stop: threading.Event, database: DatabaseWatch | None, services: list[Service]) -> None:
    """Until a stop: a dead database or service started again after its back-off."""
    while not stop.is_set():
        if database is not None:
            database.watch(time.monotonic())
        for s in services:
            s.watch(time.monotonic())  # not one `now`: restarting the database can take seconds
        time.sleep(WATCH_INTERVAL_S)
