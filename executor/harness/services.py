"""What the harness's tools share: its store, the journal, who is calling, the ask service, and the
dispatch bounds."""

from __future__ import annotations

import uuid

from executor.asks import PROGRESS_INTERVAL_S, Asks
from executor.harness.identity import Identities
from executor.harness.scope import DispatchLimits
from executor.harness.store import HarnessStore
from executor.harness.waiting import OpenAsks
from executor.journal.writer import JournalWriter
from shared.database import Database
from shared.listener import Listener


class Harness:
    def __init__(self, db: Database, writer: JournalWriter, listener: Listener, ask_timeout_s: float,
                 progress_interval_s: float = PROGRESS_INTERVAL_S, dispatch_limits: DispatchLimits = DispatchLimits()):
        self.db = db
        self.dispatch_limits = dispatch_limits
        self.writer = writer
        self.store = HarnessStore.over(db.pool)
        # the named queries over the pool, for what still takes them rather than a store of its own (the
        # caller's credential, the ask service)
        self.q = self.store.pooled()
        self.identities = Identities(self.q, writer)
        self.asks = Asks(self.q, writer, listener, ask_timeout_s, progress_interval_s)
        self.waiting = OpenAsks()  # each task's questions and gate cards out at once, bounded

    def forget(self, task_id: uuid.UUID) -> None:
        """A task's process exited: its credential no longer counts (the supervisor calls this)."""
        self.identities.forget(task_id)
