"""One terminal session: the user's interactive `claude` in a pseudo-terminal the executor holds.

The process outlives the terminal that started it: a terminal attached (at most one at a time; a new one takes
the screen) gets every byte the CLI writes and sends its keys and size; with none attached the session runs on.
Beside it run the follower (the conversation into the journal, executor/terminals/follow.py) and the steering
(the page's messages typed at the CLI's empty prompt, executor/terminals/screen.py). The process's exit ends the
session: its rows, its credential, and the terminal's wrapper, which exits with the CLI's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import struct
import termios
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from executor.sessions.store import SessionStore
from executor.terminals.boxed import Boxed
from executor.terminals.osc import OscFilter
from executor.terminals.follow import FOLLOW_S, Follower
from executor.terminals.screen import Screen
from executor.terminals.store import TerminalStore
from shared import logs
from shared import terminal_wire as wire
from shared.models import NewEvent

log = logs.get(__name__)

STEER_S = 0.25  # how often a waiting message looks at the prompt again
END_GRACE_S = 5.0  # after SIGHUP, then SIGTERM, before SIGKILL
DIALOG_SHOWS_S = 5.0  # how long after its hook is called a permission dialog may take to show
SCREEN_BACKLOG = 256 * 1024  # bytes the screen may have waiting before the pty is read on
PASTE_START, PASTE_END = b"\x1b[200~", b"\x1b[201~"


# What the CLI's input box takes as something other than a prompt when it comes first: `!` runs a shell command
# without a permission prompt, `/` a command (its settings among them), `#` a memory, `&` a background task.
# Observed on 2.1.328: a leading space makes it a prompt, as the page's message is meant to be.
NOT_A_PROMPT = ("!", "/", "#", "&")


def as_prompt(text: str) -> str:
    """A page's message as the terminal gets it: its text, always as a prompt (pure)."""
    text = text.replace("\x1b", "")
    return f" {text}" if text.lstrip().startswith(NOT_A_PROMPT) else text


@dataclass
class Client:
    """An attached terminal: where the screen's bytes go."""

    writer: asyncio.StreamWriter
    holder: str

    def send(self, kind: bytes, payload: bytes | str | dict[str, object] = b"") -> None:
        if not self.writer.is_closing():
            self.writer.write(wire.frame(kind, payload))


def _winsize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _in_child(umask: int) -> Callable[[], None]:
    def child() -> None:  # between fork and exec: the pty becomes its terminal, and the files it makes are the user's
        os.umask(umask)
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    return child


class Held:
    def __init__(self, task_id: uuid.UUID, thread_id: uuid.UUID, store: TerminalStore, sessions: SessionStore,
                 follower: Follower, rows: int, cols: int, on_end: Callable[[Held], Awaitable[None]]):
        self.task_id = task_id
        self.thread_id = thread_id
        self.store = store
        self.sessions = sessions
        self.follower = follower
        self.screen = Screen(rows, cols)
        self.size = (rows, cols)
        self.on_end = on_end
        self.client: Client | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.master = -1
        self.writes: asyncio.Queue[bytes] = asyncio.Queue()
        self.messages = asyncio.Event()  # the page sent something: look at the prompt
        self.exit_code: int | None = None
        self.ended = asyncio.Event()
        self.ending_reason: str | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.started = time.monotonic()
        self.mcp: Path | None = None  # its harness credential's config (revoked at the end)
        self.boxed: Boxed | None = None  # its sandbox (`--sandbox`), closed at the end
        self.osc = OscFilter()
        self._draining = False  # the screen's feeding goes on in later ticks
        self._paused = False  # the pty is not read until the screen has caught up

    async def spawn(self, argv: list[str], cwd: str, env: dict[str, str], umask: int = 0o022) -> int:
        """Start the CLI on a new pty (`umask`: the user's terminal's, not the executor's private one)."""
        master, slave = os.openpty()
        _winsize(slave, *self.size)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, start_new_session=True,
                preexec_fn=_in_child(umask))
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self.master = master
        os.set_blocking(master, False)
        asyncio.get_running_loop().add_reader(master, self._readable)
        self.tasks = [asyncio.create_task(self._write_loop(), name=f"terminal-write-{self.task_id}"),
                      asyncio.create_task(self._follow_loop(), name=f"terminal-follow-{self.task_id}"),
                      asyncio.create_task(self._steer_loop(), name=f"terminal-steer-{self.task_id}"),
                      asyncio.create_task(self._wait_exit(), name=f"terminal-exit-{self.task_id}")]
        return self.proc.pid

    # ---- the screen ----------------------------------------------------------------------------------

    def _readable(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: the CLI closed its terminal (it is exiting)
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.master)
            return
        if self.boxed is not None:  # a sandboxed session sends the user's terminal only the OSCs a screen uses (osc.py)
            data = self.osc.feed(data)
        if not self.screen.feed(data) and not self._draining:
            self._draining = True
            asyncio.get_running_loop().call_soon(self._drain_screen)
        if self.screen.pending > SCREEN_BACKLOG:  # read on once the screen has caught up: the session waits for it
            asyncio.get_running_loop().remove_reader(self.master)
            self._paused = True
        if self.client is not None and data:
            self.client.send(wire.DATA, data)

    def _drain_screen(self) -> None:
        """Feed the screen on, a tick at a time, other work running between (screen.py)."""
        loop = asyncio.get_running_loop()
        if not self.screen.drain():
            loop.call_soon(self._drain_screen)
            return
        self._draining = False
        if self._paused and self.master >= 0:
            self._paused = False
            with contextlib.suppress(OSError, ValueError):  # the terminal went meanwhile
                loop.add_reader(self.master, self._readable)

    async def _write_loop(self) -> None:
        while True:
            data = await self.writes.get()
            view = memoryview(data)
            while view:
                try:
                    n = os.write(self.master, view)
                except BlockingIOError:
                    await asyncio.sleep(0.01)  # the CLI has not read its input yet: a full pty buffer
                    continue
                except OSError:
                    return  # the terminal is gone with its process
                view = view[n:]

    def keys(self, data: bytes) -> None:
        self.writes.put_nowait(data)

    def resize(self, rows: int, cols: int) -> None:
        self.size = (rows, cols)
        self.screen.resize(rows, cols)
        if self.master >= 0 and self.exit_code is None:
            with contextlib.suppress(OSError):
                _winsize(self.master, rows, cols)  # the kernel tells the CLI (SIGWINCH)

    async def attach(self, client: Client, rows: int, cols: int) -> None:
        """`client` takes the screen; the one it had is told and let go. It sees the screen as it is now."""
        before, self.client = self.client, client
        if before is not None:
            before.send(wire.NOTE, {"text": f"the session was taken by {client.holder}"})
            before.send(wire.EXIT, {"code": 0})
        client.send(wire.NOTE, {"id": str(self.thread_id), "text": ""})
        # the row before the record: a page that reads the session when the record reaches it finds the new holder
        await self.store.set_holder(self.task_id, client.holder)
        await self._journal(NewEvent("terminal.attached", {"holder": client.holder}, session_id=self.thread_id,
                                     task_id=self.task_id))
        client.send(wire.DATA, self.screen.redraw())
        if (rows, cols) == self.size:  # the CLI redraws itself only on a change of size: make one
            self.resize(rows, max(1, cols - 1))
            await asyncio.sleep(0.05)
        self.resize(rows, cols)

    async def detach(self, client: Client) -> None:
        if self.client is not client:
            return
        self.client = None
        if self.exit_code is None:
            await self.store.set_holder(self.task_id, None)
            await self._journal(NewEvent("terminal.detached", {"holder": client.holder}, session_id=self.thread_id,
                                         task_id=self.task_id))

    # ---- the conversation ----------------------------------------------------------------------------

    async def _follow_loop(self) -> None:
        while True:
            await self.follow_once()
            await asyncio.sleep(FOLLOW_S)

    async def follow_once(self) -> None:
        previous = self.follower.offset
        end, events = await asyncio.to_thread(self.follower.read)
        if end == previous:
            return
        try:
            async with self.store.work() as (store, unit):
                if await SessionStore(unit).advance_import(self.thread_id, previous, end):
                    unit.emit(*events)
        except Exception:  # noqa: BLE001 - an outage: the same stretch is read again next time
            log.warning("terminal_follow_failed", task=str(self.task_id), exc_info=True)
            return
        self.follower.offset = end

    # ---- the page's messages -------------------------------------------------------------------------

    async def _steer_loop(self) -> None:
        while True:
            await self.messages.wait()
            try:
                if not await self.steer_once():
                    self.messages.clear()
                    continue
            except Exception:  # noqa: BLE001 - an outage: looked at again
                log.warning("terminal_steer_failed", task=str(self.task_id), exc_info=True)
            await asyncio.sleep(STEER_S)

    async def steer_once(self) -> bool:
        """Type the oldest waiting message if the prompt is empty. True while messages still wait."""
        waiting = await self.store.messages_waiting(self.thread_id)
        if not waiting:
            await self._set_waiting(False)
            return False
        state = self.screen.state()
        if not state.ready:
            # the user is typing: the message waits, and the page says why (a turn or a dialog just waits)
            await self._set_waiting(bool(state.at_prompt and state.typed))
            return True
        async with self.store.work() as (store, unit):
            msg = await store.take_message(self.thread_id)
            if msg is None:
                return False
            unit.emit(NewEvent("task.user_message", {"text": msg.text, "thread_id": str(self.thread_id),
                                                     "origin": "user", "typed_in": "terminal"},
                               session_id=self.thread_id, task_id=self.task_id, message_id=msg.id))
        self.follower.typed.append(msg.text.strip())
        # a paste (the CLI takes newlines in it as text), then Enter
        self.keys(PASTE_START + as_prompt(msg.text).encode() + PASTE_END)
        await asyncio.sleep(0.1)  # the CLI takes the paste before the Enter that submits it
        self.keys(b"\r")
        await self._set_waiting(False)
        return waiting > 1

    async def _set_waiting(self, waiting: bool) -> None:
        """Said when it changes, both ways (an open page shows it, and clears it, from the record)."""
        if await self.store.set_input_waiting(self.task_id, waiting):
            await self._journal(NewEvent("terminal.input_waiting", {
                "waiting": waiting, "why": "the terminal's input line holds text being typed" if waiting else None},
                session_id=self.thread_id, task_id=self.task_id))

    async def dialog_answered(self) -> None:
        """Until the permission dialog the CLI shows now is closed in the terminal (its input box is back). The
        CLI lets its hook run on when the terminal answers (observed), so the screen is what says so."""
        shown = time.monotonic() + DIALOG_SHOWS_S
        while self.screen.state().box:  # the dialog is put up beside the hook's call
            if time.monotonic() > shown:
                await asyncio.Event().wait()  # no dialog here to watch: the card's answer or the hook's end decides
            await asyncio.sleep(0.1)
        while not self.screen.state().box:
            await asyncio.sleep(0.1)

    def interrupt(self) -> bool:
        """Stop the running turn (or close a dialog), as Esc in the terminal does; never at an idle prompt, where
        Esc would clear what the user is typing. Whether there was something to stop."""
        if self.screen.state().at_prompt:
            return False
        self.keys(b"\x1b")
        return True

    # ---- the end -------------------------------------------------------------------------------------

    async def _wait_exit(self) -> None:
        assert self.proc is not None
        code = await self.proc.wait()
        self.exit_code = code
        await asyncio.sleep(0.05)  # the last bytes on the terminal
        with contextlib.suppress(Exception):
            await self.follow_once()  # the last entries, before the end's record
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self.master)
        with contextlib.suppress(OSError):
            os.close(self.master)
        self.master = -1  # (a screen still catching up must not read a number the next open takes)
        if self.client is not None:
            self.client.send(wire.EXIT, {"code": code if code >= 0 else 128 - code})
        try:
            await self.on_end(self)  # its rows, before anyone waiting on the end (a stopping executor) goes on
        finally:
            self.ended.set()

    async def end(self, reason: str) -> None:
        """End the CLI as closing its terminal does (SIGHUP), then harder."""
        self.ending_reason = self.ending_reason or reason
        if self.proc is None or self.exit_code is not None:
            return
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ended.wait(), END_GRACE_S)
                return

    async def _journal(self, event: NewEvent) -> None:
        async with self.store.work() as (_, unit):
            unit.emit(event)
