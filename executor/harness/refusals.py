"""How many refused harness calls get a journal record: a bounded number per credential.

A refusal costs its caller one HTTP request and costs the store a journal row, a NOTIFY and an SSE event
to every open page; without a bound any local process could fill the journal at the cost of a loop.
Past the budget calls are still refused, only not journaled; the next record journaled under the same
key says how many were left out.

The budget is kept per credential (`credential_key`: the task a presented credential was granted to,
whether it still counts or not), so one spawn flooding refusals spends only its own budget and cannot
blind the journal to another's. Calls with no credential, or one the store does not know, cannot be told
apart by spawn (every spawn reaches the harness through the executor's own gateway, so all come from
one loopback address): they share one budget per peer address (`anonymous_key`), which no credential's
refusals draw on.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict, deque

REFUSALS_PER_WINDOW = 30
REFUSAL_WINDOW_S = 60.0
_KEYS = 1_000  # memory bound: the keys refused longest ago are forgotten first


def credential_key(task_id: uuid.UUID) -> str:
    """The budget of the credential granted to `task_id`."""
    return f"task:{task_id}"


def anonymous_key(peer_host: str | None) -> str:
    """The budget of calls without a credential the store knows, from one peer address."""
    return f"peer:{peer_host or 'unknown'}"


class RefusalBudget:
    def __init__(self, limit: int = REFUSALS_PER_WINDOW, window_s: float = REFUSAL_WINDOW_S):
        self.limit = limit
        self.window_s = window_s
        self._seen: OrderedDict[str, tuple[deque[float], int]] = OrderedDict()

    def admit(self, key: str, now: float | None = None) -> int | None:
        """None: do not journal this refusal (it is counted); else how many under `key` were left out before it."""
        now = time.monotonic() if now is None else now
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
        while len(self._seen) > _KEYS:
            self._seen.popitem(last=False)
        return admitted
