"""How many refused harness calls get a journal record: a bounded number per peer address.

A refusal costs its caller one HTTP request and costs the store a journal row, a NOTIFY and an SSE event
to every open page; without a bound any local process could fill the journal at the cost of a loop.
Past the budget calls are still refused, only not journaled; the next record journaled for that peer
says how many were left out.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque

REFUSALS_PER_WINDOW = 30
REFUSAL_WINDOW_S = 60.0
_PEERS = 1_000  # memory bound: the peers refused longest ago are forgotten first


class RefusalBudget:
    def __init__(self, limit: int = REFUSALS_PER_WINDOW, window_s: float = REFUSAL_WINDOW_S):
        self.limit = limit
        self.window_s = window_s
        self._seen: OrderedDict[str, tuple[deque[float], int]] = OrderedDict()

    def admit(self, peer: str | None, now: float | None = None) -> int | None:
        """None: do not journal this refusal (it is counted); else how many were left out before it."""
        now = time.monotonic() if now is None else now
        key = peer or "unknown"
        times, skipped = self._seen.pop(key) if key in self._seen else (deque(maxlen=self.limit), 0)
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) >= self.limit:
            self._seen[key] = (times, skipped + 1)
            admitted = None
        else:
            times.append(now)
            self._seen[key] = (times, 0)
            admitted = skipped
        while len(self._seen) > _PEERS:
            self._seen.popitem(last=False)
        return admitted
