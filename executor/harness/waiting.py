"""The ask calls each task has waiting at once: a model's questions and its gate cards alike (executor/harness/
questions.py, permission.py). The CLI asks one at a time (a few, for tool calls made together); a process in the
sandbox calling the harness itself could put up questions, and notifications, without end."""

from __future__ import annotations

import collections
import contextlib
import uuid
from collections.abc import Iterator

from mcp.server.mcpserver.exceptions import ToolError

MAX_OPEN = 4


class OpenAsks:
    """The ask calls each task has waiting, counted in this executor (a credential is served by one)."""

    def __init__(self, most: int = MAX_OPEN):
        self.most = most
        self.open: collections.Counter[uuid.UUID] = collections.Counter()

    def full(self, task_id: uuid.UUID) -> bool:
        return self.open[task_id] >= self.most

    @contextlib.contextmanager
    def admitted(self, task_id: uuid.UUID) -> Iterator[None]:
        """One more of the task's calls while it waits; ToolError, nothing asked, when it has `most` already."""
        if self.full(task_id):
            raise ToolError(f"ask_user_question refused, nothing was asked: this task has {self.most} questions waiting "
                            "already; wait for their answers")
        self.open[task_id] += 1
        try:
            yield
        finally:
            self.open[task_id] -= 1
            if not self.open[task_id]:
                del self.open[task_id]
