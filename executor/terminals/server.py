"""The executor's terminal sessions: a unix socket in its run directory that `petal-dispatch claude`, `attach` and
the sessions' permission hook connect to (shared/terminal_wire.py), and the sessions it holds.

Only this user connects: the socket is 0600 in a 0700 directory, and a peer of another uid (SO_PEERCRED) is
refused. A session starts in the directory the wrapper was started in, which must lie under PETAL_PROJECT_ROOTS;
it is the user's own Claude Code, with the user's environment and login, as `claude` run in that terminal
would be, plus the harness MCP (its own credential, as any spawn) and the permission hook.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import os
import secrets
import socket
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool

from executor.asks import Asks
from executor.projects.service import Refused, check_workdir
from executor.run.caller import Caller
from executor.run.credentials import Credentials
from executor.run.isolation import Isolation
from executor.run.substrate import SubstrateConfig
from executor.sandbox import scratch
from executor.sessions.store import SessionStore
from executor.terminals import launch, permission
from executor.terminals.boxed import Boxed
from executor.terminals.follow import Follower, conversation_file
from executor.terminals.held import Client, Held
from executor.terminals.store import NewTerminal, TerminalStore
from shared import logs
from shared import terminal_wire as wire
from shared.models import NewEvent

log = logs.get(__name__)
# A connection says who it is (its HELLO) within this long or is closed: one that says nothing holds a descriptor.
HELLO_S = 10.0


async def hello_frames(reader: asyncio.StreamReader, frames: wire.Frames,
                       timeout_s: float = HELLO_S) -> list[tuple[bytes, bytes]]:
    """The frames of a connection's first whole frame's read; none when it closed or said nothing in time."""
    async def first() -> list[tuple[bytes, bytes]]:
        found: list[tuple[bytes, bytes]] = []
        while not found:
            data = await reader.read(65536)
            if not data:
                return []
            found = frames.feed(data)
        return found

    try:
        return await asyncio.wait_for(first(), timeout_s)
    except TimeoutError:
        return []


def _link(at: Path, to: Path) -> None:
    """`at` made a symbolic link to `to`, replacing what was there in one step."""
    tmp = at.with_name(f".{at.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(to)
    tmp.replace(at)


@dataclass(frozen=True)
class TerminalsConfig:
    executor: str
    run_dir: Path
    claude_bin: str
    roots: tuple[Path, ...]  # empty: the service user's home
    cli: str = "claude"  # how the hand-back command names the CLI
    python: str = ""  # the interpreter the permission hook runs in (default: this one)
    pointer: Path | None = None  # the link a wrapper started anywhere finds the socket by


class Terminals:
    def __init__(self, pool: AsyncConnectionPool, config: TerminalsConfig, asks: Asks, credentials: Credentials,
                 isolation: Isolation | None = None, substrate: SubstrateConfig | None = None):
        self.config = config
        # the spawns' sandbox, for `--sandbox` (None: the operator turned it off) and the CLI's config it starts from
        self.isolation = isolation
        self.substrate = substrate or SubstrateConfig(claude_bin=config.claude_bin)
        self.store = TerminalStore.over(pool)
        self.sessions = SessionStore.over(pool)
        self.asks = asks
        self.credentials = credentials
        self.held: dict[uuid.UUID, Held] = {}  # by thread
        self.tokens: dict[uuid.UUID, str] = {}  # each session's permission hook's secret, by thread
        self.asking: set[uuid.UUID] = set()  # the threads whose permission card is out
        self.path = config.run_dir / wire.SOCKET_NAME  # a link to the socket
        self.private: scratch.Scratch | None = None
        self.socket = self.path  # where it listens (start)
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        for orphan in await self.store.end_orphans(self.config.executor):
            log.info("terminal_session_ended_by_restart", thread=str(orphan.thread_id))
        # A Unix socket's path holds at most 108 bytes, and a data directory's can be longer: the socket lives in a
        # short 0700 directory of its own in the system's temporary directory (as the gateways' do), found through
        # a link in the run directory and the one a wrapper started anywhere reads (clients resolve the link).
        try:
            self.private = scratch.Scratch("petal-term-")
            self.socket = self.private.path / wire.SOCKET_NAME
            self.server = await asyncio.start_unix_server(self._connected, path=str(self.socket))
            os.chmod(self.socket, 0o600)
            self.config.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            _link(self.path, self.socket)
            if self.config.pointer is not None:
                self.config.pointer.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                _link(self.config.pointer, self.socket)
        except OSError:  # the executor runs on; only `petal-dispatch claude` cannot reach it
            log.exception("terminal_socket_failed", run_dir=str(self.config.run_dir))

    async def stop(self) -> None:
        """End every session (its conversation stays resumable in its thread) and close the socket."""
        if self.server is not None:
            self.server.close()
        await asyncio.gather(*(h.end("executor_stopped") for h in list(self.held.values())), return_exceptions=True)
        for link in (self.path, self.config.pointer):
            with contextlib.suppress(OSError):
                if link is not None and link.is_symlink() and Path(os.readlink(link)) == self.socket:
                    link.unlink()
        if self.private is not None:
            self.private.remove()

    # ---- what the page asks of a session ---------------------------------------------------------------

    def deliver(self, thread_id: uuid.UUID) -> bool:
        """The page sent the thread a message: True when a session here takes it (typed at its prompt)."""
        held = self.held.get(thread_id)
        if held is None:
            return False
        held.messages.set()
        return True

    async def end(self, thread_id: uuid.UUID) -> str | None:
        """"End session" from the page: None, or why not."""
        held = self.held.get(thread_id)
        if held is None:
            return "no terminal session of this thread runs on this executor"
        await held.end("ended_from_the_page")
        return None

    def interrupt(self, task_id: uuid.UUID) -> bool:
        """Stop from the page: the session's running turn is interrupted as Esc does (True when it is held here)."""
        held = next((h for h in self.held.values() if h.task_id == task_id), None)
        if held is None:
            return False
        if not held.interrupt():
            log.info("terminal_nothing_to_stop", thread=str(held.thread_id))
        return True

    # ---- connections ---------------------------------------------------------------------------------

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                         hook_only: bool = False) -> None:
        """One connection (`hook_only`: a sandboxed session's own hook socket, which answers the hook alone)."""
        try:
            await self._serve(reader, writer, hook_only)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        except Exception:  # noqa: BLE001 - one connection's failure is not the executor's
            log.exception("terminal_connection_failed")
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hook_only: bool) -> None:
        sock = writer.get_extra_info("socket")
        uid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.getuid():
            writer.write(wire.frame(wire.REFUSED, "only the executor's own user may connect"))
            return
        frames = wire.Frames()
        first = await hello_frames(reader, frames)
        if not first:
            return
        kind, payload = first.pop(0)
        if kind != wire.HELLO:
            return
        hello = json.loads(payload)
        op = hello.get("op")
        if op == "permission":
            await self._permission(hello, reader, writer)
            return
        if hook_only:
            return
        held, why = await (self._start(hello) if op == "start" else self._find(hello.get("id")))
        if held is None:
            writer.write(wire.frame(wire.REFUSED, why or "refused"))
            await writer.drain()
            return
        client = Client(writer, str(hello.get("holder") or "a terminal"))
        await held.attach(client, int(hello.get("rows") or 40), int(hello.get("cols") or 120))
        await self._relay(held, client, reader, frames, first)

    async def _relay(self, held: Held, client: Client, reader: asyncio.StreamReader, frames: wire.Frames,
                     pending: list[tuple[bytes, bytes]]) -> None:
        try:
            while held.exit_code is None:
                for kind, payload in pending:
                    if kind == wire.DATA:
                        held.keys(payload)
                    elif kind == wire.SIZE:
                        size = json.loads(payload)
                        held.resize(int(size["rows"]), int(size["cols"]))
                    elif kind == wire.DETACH:
                        return
                data = await reader.read(65536)
                if not data:
                    return  # the terminal closed: the session runs on
                pending = frames.feed(data)
        finally:
            await held.detach(client)

    async def _find(self, given: Any) -> tuple[Held | None, str | None]:
        live = sorted(self.held.values(), key=lambda h: h.started)
        if not live:
            return None, "no terminal session runs on this executor"
        if not given:
            return live[-1], None
        found = [h for h in live if str(h.thread_id).startswith(str(given)) or str(h.task_id).startswith(str(given))]
        if len(found) != 1:
            return None, f"{len(found)} sessions match {given!r}: " + ", ".join(str(h.thread_id) for h in live)
        return found[0], None

    async def _start(self, hello: dict[str, Any]) -> tuple[Held | None, str | None]:
        cwd = str(hello.get("cwd") or "")
        sandboxed = bool(hello.get("sandbox"))
        if sandboxed and self.isolation is None:
            return None, ("--sandbox: this executor runs its spawns unsandboxed (PETAL_SANDBOX=off), so it has no "
                          "sandbox to give")
        try:
            roots = [r.expanduser().resolve() for r in (self.config.roots or (Path.home(),))]
            check_workdir(cwd, roots)
        except Refused as exc:
            return None, f"refused: {exc}"
        env = {str(k): str(v) for k, v in (hello.get("env") or {}).items()}
        plan = launch.plan(list(map(str, hello.get("argv") or [])), cwd, env)
        if isinstance(plan, str):
            return None, plan
        found = await self.store.conversation_thread(plan.session_id)
        thread_id = found or uuid.uuid4()
        if thread_id in self.held:
            return None, f"this conversation is live in a terminal already: `petal-dispatch attach {thread_id}`"
        path = conversation_file(plan.config_dir, cwd, plan.session_id)
        title = await self.store.new_title(cwd) if found is None else ""  # (a thread that exists keeps its own)
        row = NewTerminal(uuid.uuid4(), thread_id, self.config.executor, plan.session_id, cwd, str(plan.config_dir),
                          title, path.stat().st_size if path.exists() else 0,
                          launch.resume_command(cwd, plan, self.config.cli), sandboxed,
                          str(hello.get("holder") or "a terminal"))
        await self._record_start(row, plan, new_thread=found is None)
        return await self._launch(row, plan, env, path, hello)

    async def _record_start(self, row: NewTerminal, plan: launch.Plan, *, new_thread: bool) -> None:
        async with self.store.work() as (store, unit):
            await store.insert(row, new_thread=new_thread)
            if not new_thread:  # what the conversation holds already is the thread's
                await SessionStore(unit).advance_import(row.thread_id, None, row.offset)
            unit.emit(*([NewEvent("thread.created", {"title": row.title, "mode": "interactive", "terminal": True},
                                  session_id=row.thread_id)] if new_thread else []),
                      NewEvent("terminal.started", {"cwd": row.cwd, "argv": plan.user_args,
                                                    "session_id": plan.session_id, "holder": row.held_by,
                                                    "sandboxed": row.sandboxed},
                               session_id=row.thread_id, task_id=row.task_id))

    async def _launch(self, row: NewTerminal, plan: launch.Plan, env: dict[str, str], path: Path,
                      hello: dict[str, Any]) -> tuple[Held | None, str | None]:
        token = secrets.token_urlsafe(24)
        mcp = await self.credentials.grant(row.task_id, row.thread_id)
        boxed: Boxed | None = None
        held = Held(row.task_id, row.thread_id, self.store, self.sessions, Follower(path, row.thread_id, row.task_id,
                                                                                   row.offset),
                    int(hello.get("rows") or 40), int(hello.get("cols") or 120), self._ended)
        held.mcp = mcp
        try:
            if row.sandboxed:
                assert self.isolation is not None
                boxed = held.boxed = await Boxed.open(self.isolation, self.substrate, env, row.task_id, row.cwd,
                                                      plan.session_id, functools.partial(self._connected,
                                                                                         hook_only=True))
                held.follower.path = boxed.conversation()
                argv, run_env = boxed.wrap(launch.command(self.config.claude_bin, plan, mcp, Boxed.hook_command()),
                                           launch.environment(env, Boxed.hook_socket(), row.thread_id, token), mcp)
            else:
                argv = launch.command(self.config.claude_bin, plan, mcp, launch.hook_command(self.config.python))
                run_env = launch.environment(env, self.socket, row.thread_id, token)
            pid = await held.spawn(argv, row.cwd, run_env, int(hello.get("umask") or 0o022) & 0o777)
        except OSError as exc:
            await self._finish(held, None, "failed", f"spawn_failed: {exc.strerror}")
            return None, f"the CLI could not start: {exc}"
        self.held[row.thread_id] = held
        self.tokens[row.thread_id] = token
        await self.store.set_pid(row.task_id, pid)
        log.info("terminal_session_started", thread=str(row.thread_id), pid=pid, cwd=row.cwd, sandboxed=row.sandboxed)
        return held, None

    async def _ended(self, held: Held) -> None:
        self.held.pop(held.thread_id, None)
        self.tokens.pop(held.thread_id, None)
        code = held.exit_code
        reason = held.ending_reason or "exited"
        status = "cancelled" if held.ending_reason else ("success" if code == 0 else
                                                         "crashed" if code is not None and code < 0 else "failed")
        await self._finish(held, code, status, reason)

    async def _finish(self, held: Held, code: int | None, status: str, reason: str) -> None:
        if held.boxed is not None:
            with contextlib.suppress(Exception):
                await held.boxed.close()
        if held.mcp is not None:
            held.mcp.unlink(missing_ok=True)
            with contextlib.suppress(Exception):
                await self.credentials.revoke(held.task_id, held.mcp)
        async with self.store.work() as (store, unit):
            await store.end(held.task_id, code, status, reason)
            unit.emit(NewEvent("terminal.ended", {"exit_code": code, "reason": reason, "status": status},
                               session_id=held.thread_id, task_id=held.task_id))
        log.info("terminal_session_ended", thread=str(held.thread_id), exit_code=code, reason=reason)

    # ---- the permission hook ---------------------------------------------------------------------------

    async def _permission(self, hello: dict[str, Any], reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        try:
            thread_id = uuid.UUID(str(hello.get("id")))
        except ValueError:
            return
        held, token = self.held.get(thread_id), self.tokens.get(thread_id)
        if held is None or token is None or not hmac.compare_digest(token, str(hello.get("token") or "")):
            return  # nothing decided: the terminal's own dialog stays
        if thread_id in self.asking:
            return  # one card at a time, as the CLI shows one dialog (a process in a sandbox could post any number)
        self.asking.add(thread_id)
        try:
            await self._ask_permission(held, thread_id, hello, reader, writer)
        finally:
            self.asking.discard(thread_id)

    async def _ask_permission(self, held: Held, thread_id: uuid.UUID, hello: dict[str, Any],
                              reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        caller = Caller(task_id=held.task_id, session_id=thread_id, thread_id=thread_id, project_id=None,
                        role="terminal")
        given = hello.get("event")
        event: dict[str, Any] = given if isinstance(given, dict) else {}
        where = held.client.holder if held.client is not None else "a detached terminal"
        asking = asyncio.create_task(permission.ask(self.asks, caller, event, where, f"gate-terminal-{uuid.uuid4()}"))
        closed = asyncio.create_task(reader.read())  # the hook's end (the CLI stopped waiting for it)
        answered = asyncio.create_task(held.dialog_answered())  # the terminal answered its dialog first
        done, _ = await asyncio.wait({asking, closed, answered}, return_when=asyncio.FIRST_COMPLETED)
        closed.cancel()
        answered.cancel()
        self.asking.discard(thread_id)  # decided: the next dialog's card may go out while this one's is closed
        if asking in done:
            answer = asking.result()
            if answer is not None:
                writer.write(wire.frame(wire.ANSWER, answer))
                await writer.drain()
            return
        log.info("terminal_prompt_answered_in_terminal", thread=str(thread_id))
        asking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asking
