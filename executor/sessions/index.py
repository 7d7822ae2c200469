"""The index of the CLI's stored conversations on this executor, published into the store, kept fresh.

Each pass stats every `<config>/projects/*/*.jsonl` of the configured directories (a stat, not a read) and
reads only what changed: a new file whole, a grown one from where the last pass stopped (a file that shrank
or was replaced is read again). Only rows that changed are written; a file that went is deleted. Which
conversations a live process holds is looked up each pass (executor/sessions/live.py). The same pass brings
the journal of this executor's adopted threads up to date with what a terminal added to their conversation
(executor/sessions/adopt.py), and runs again at once when a turn ends (task_ended).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool

from executor.projects.service import Refused, check_workdir
from executor.sandbox.cliconfig import session_dir
from executor.sessions import live, reading
from executor.sessions.parse import Message, Scan
from executor.sessions.store import SessionStore
from shared import logs, threads

log = logs.get(__name__)

# how often a pass also scans every process's command line for conversations named there (older CLIs keep no
# registry): about as costly as the stat of 2,000 files (tests/bench/bench_sessions.py)
NAMED_EVERY_S = 5.0


@dataclass(frozen=True)
class SessionsConfig:
    """Where the CLI's conversations are looked for: `dirs` (config directories; empty: the service user's
    ~/.claude), besides the executor's own config directory; how often the files are looked at."""

    dirs: tuple[Path, ...] = ()
    poll_s: float = 1.0


@dataclass
class File:
    """A conversation's file as the last pass saw it: what it parsed, which process holds it, what was published."""

    config_dir: Path
    path: Path
    inode: int
    size: int
    mtime_ns: int
    scan: Scan
    live_pid: int | None = None
    published: dict[str, Any] | None = None


@dataclass
class Index:
    """This executor's view of the conversations it holds (one per process; its passes are serial)."""

    pool: AsyncConnectionPool
    executor: str
    config_dirs: tuple[Path, ...]
    roots: tuple[Path, ...]
    default_config_dir: Path  # ~/.claude of the service user: a command to continue needs no CLAUDE_CONFIG_DIR
    poll_s: float = 1.0
    # what no worker may write (shared/protected.py): a conversation there is not adopted
    protected: tuple[tuple[str, Path], ...] = ()
    # how the hand-back command names the CLI (substrate.handback_cli)
    cli: str = "claude"
    files: dict[str, File] = field(default_factory=dict)  # by path
    # conversations whose file grew (or appeared) since a thread's journal was last brought up to date with it
    grown: set[str] = field(default_factory=set)
    _by_id: dict[str, list[File]] = field(default_factory=dict)
    _live: list[File] = field(default_factory=list)  # the files a live process held at the last pass
    _named: dict[str, int] = field(default_factory=dict)
    _named_at: float = -NAMED_EVERY_S
    _cleaned: bool = False

    def __post_init__(self) -> None:
        self.store = SessionStore.over(self.pool)
        # one pass at a time: the loop's and an adoption's (which wants the file as it is now)
        self._lock = asyncio.Lock()

    # ---- the files ---------------------------------------------------------------------------------------

    def by_session(self, session_id: str, config_dir: Path | None = None) -> File | None:
        for f in self._by_id.get(session_id, ()):
            if config_dir is None or f.config_dir == config_dir:
                return f
        return None

    def _look(self) -> tuple[list[File], list[File]]:
        """Stat every file (blocking: run in a thread); read what changed. Returns (changed, gone)."""
        seen: set[str] = set()
        changed: list[File] = []
        for config_dir, entry in self._entries():
            if entry.path in seen:
                continue
            seen.add(entry.path)
            f = self._visit(config_dir, entry)
            if f is not None:
                changed.append(f)
        gone = [self.files.pop(p) for p in list(self.files) if p not in seen]
        for f in gone:
            self._forget(f)
        self._mark_live(changed)
        return changed, gone

    def _entries(self) -> Iterator[tuple[Path, os.DirEntry[str]]]:
        """Every conversation file of the config directories (`projects/*/*.jsonl`, no symbolic links); a
        directory that cannot be listed is passed over."""
        for config_dir in self.config_dirs:
            try:
                projects = [e.path for e in os.scandir(config_dir / "projects") if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for project in projects:
                try:
                    entries = [e for e in os.scandir(project)
                               if e.name.endswith(".jsonl") and e.is_file(follow_symlinks=False)]
                except OSError:
                    continue
                for entry in entries:
                    yield config_dir, entry

    def _visit(self, config_dir: Path, entry: os.DirEntry[str]) -> File | None:
        """One file of a pass: read what it gained, or all of it when it is new or was replaced; None when
        it did not change (or went between the listing and the stat)."""
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            return None
        known = self.files.get(entry.path)
        if known is not None and known.size == st.st_size and known.mtime_ns == st.st_mtime_ns \
                and known.inode == st.st_ino:
            return None  # the common case: a stat, nothing read
        if known is None or known.inode != st.st_ino or st.st_size < known.scan.parsed_to:
            if known is not None:
                self._forget(known)
            path = Path(entry.path)
            known = File(config_dir, path, st.st_ino, 0, 0, Scan(path.stem))
            self.files[entry.path] = known
            self._by_id.setdefault(known.scan.session_id, []).append(known)
        before = known.scan.parsed_to
        self._read(known, st.st_size)
        if known.scan.parsed_to != before or before == 0:
            self.grown.add(known.scan.session_id)
        known.inode, known.size, known.mtime_ns = st.st_ino, st.st_size, st.st_mtime_ns
        return known

    def _held(self) -> dict[str, int]:
        """The conversations a live process holds now, by id: the CLI's registry each pass, the command lines
        of every process less often."""
        now = time.monotonic()
        if now - self._named_at >= NAMED_EVERY_S:  # the fallback reads every process's command line: not each pass
            self._named, self._named_at = live.named_on_command_lines(), now
        held = dict(self._named)
        for config_dir in self.config_dirs:
            held.update(live.registered(config_dir))
        return held

    def _mark_live(self, changed: list[File]) -> None:
        """Set each file's live process; a file whose process came or went is `changed` too (once)."""
        held = self._held()
        marked = {id(f) for f in changed}
        for session_id, pid in held.items():
            for f in self._by_id.get(session_id, ()):
                if f.live_pid != pid and id(f) not in marked:
                    changed.append(f)
                    marked.add(id(f))
                f.live_pid = pid
        for f in self._live:  # those no longer held
            if f.scan.session_id not in held and f.live_pid is not None:
                f.live_pid = None
                if id(f) not in marked:
                    changed.append(f)
        self._live = [f for fs in (self._by_id.get(s, ()) for s in held) for f in fs]

    def _forget(self, f: File) -> None:
        same = self._by_id.get(f.scan.session_id, [])
        if f in same:
            same.remove(f)
        if not same:
            self._by_id.pop(f.scan.session_id, None)

    def _read(self, f: File, size: int) -> None:
        try:
            with open(f.path, "rb") as fh:
                reading.feed(fh, f.scan, size)
        except OSError as exc:
            f.scan.unreadable = f"cannot read: {exc.strerror or exc}"

    def read_messages(self, f: File, start: int) -> tuple[list[Message], int, str | None]:
        """The messages of a file from byte `start` to where the index has parsed it (whole lines), read a
        chunk at a time (blocking); and where that ends, or the reason it cannot be read. A turn can grow its
        conversation file without bound: it is never read whole into memory."""
        scan = Scan(f.scan.session_id, parsed_to=start)
        try:
            with open(f.path, "rb") as fh:
                messages = reading.feed(fh, scan, f.scan.parsed_to)
        except OSError as exc:
            return [], start, f"cannot read: {exc.strerror or exc}"
        return messages, scan.parsed_to, scan.unreadable

    # ---- the store ---------------------------------------------------------------------------------------

    @staticmethod
    def kept_cwd(f: File) -> tuple[str | None, str | None]:
        """The directory the conversation was had in, as its lines say, when its file is kept where the CLI keeps
        that directory's conversations (`projects/<its slug>/`); else (None, why). The lines are their writer's
        word, and a spawn writes its own: a `cwd` naming another directory listed it under that one, with a
        title of its choosing, and made an adoption's turns run there."""
        cwd = f.scan.cwd
        if not cwd:
            return None, "the conversation names no working directory"
        if not os.path.isabs(cwd) or session_dir(f.config_dir, Path(cwd)).name != f.path.parent.name:
            return None, (f"the conversation says it was had in {cwd[:200]!r}, which is not the directory its file "
                          "is kept under")
        return cwd, None

    def adoptable(self, cwd: str | None) -> str | None:
        """None when the conversation's directory may be adopted, else why not."""
        if not cwd:
            return "the conversation names no working directory"
        try:
            check_workdir(cwd, [r.expanduser().resolve() for r in (self.roots or (Path.home(),))], self.protected)
        except Refused as exc:
            return str(exc)
        return None

    def row(self, f: File) -> dict[str, Any]:
        s = f.scan
        last = s.last_activity or datetime.fromtimestamp(f.mtime_ns / 1e9, UTC)
        cwd, _ = self.kept_cwd(f)
        return {"executor": self.executor, "session_id": s.session_id, "config_dir": str(f.config_dir),
                "path": str(f.path), "cwd": cwd, "title": s.title or s.summary, "git_branch": s.git_branch,
                "last_activity": last, "message_count": s.message_count, "size_bytes": f.size,
                "live_pid": f.live_pid, "readable": s.unreadable is None, "unreadable_reason": s.unreadable,
                "adoptable": s.unreadable is None and self.adoptable(cwd) is None}

    async def refresh(self) -> bool:
        """One pass: look at the files, publish what changed. Never asks for a second pass at once."""
        async with self._lock:
            await self._refresh()
        return False

    async def _refresh(self) -> None:
        changed, gone = await asyncio.to_thread(self._look)
        rows = [(f, r) for f, r in ((f, self.row(f)) for f in changed) if r != f.published]
        if not (rows or gone or not self._cleaned):
            return
        await self.store.publish(
            self.executor, [r for _f, r in rows],
            # a conversation still held by another file (another config directory) stays listed
            [f.scan.session_id for f in gone if self.by_session(f.scan.session_id) is None],
            # the first pass: what an earlier run published of files gone since
            keep=None if self._cleaned else [f.scan.session_id for f in self.files.values()])
        new = sum(1 for f, _r in rows if f.published is None)
        for f, r in rows:
            f.published = r
        self._cleaned = True
        # a change of what is listed (a conversation appeared or went) is news; a known one growing while
        # its CLI writes is every pass of a running turn: debug only
        if new or gone:
            log.info("claude_sessions_indexed", new=new, gone=len(gone), updated=len(rows) - new,
                     known=len(self.files))
        elif rows:
            log.debug("claude_sessions_updated", updated=len(rows), known=len(self.files))

    def resume_command(self, workdir: str, config_dir: Path, session_id: str) -> str:
        """The shell command that continues a conversation in a terminal."""
        default = config_dir.resolve() == self.default_config_dir.resolve()
        return threads.resume_command(workdir, None if default else str(config_dir), session_id, self.cli)
