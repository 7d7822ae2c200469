"""Request bodies. Unknown fields are refused so a typo is an error, not silently ignored."""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Mode = Literal["interactive", "autonomous"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChatIn(_Body):
    text: str = Field(min_length=1, max_length=100_000)
    thread_id: uuid.UUID | None = None
    client_msg_id: str | None = Field(default=None, min_length=1, max_length=200)


class ThreadIn(_Body):
    title: str | None = Field(default=None, max_length=200)
    mode: Mode | None = None


class ThreadPatch(_Body):
    title: str | None = Field(default=None, min_length=1, max_length=200)
    mode: Mode | None = None
    archived: Literal[True] | None = None

    @model_validator(mode="after")
    def _one_change(self) -> ThreadPatch:
        if self.title is None and self.mode is None and self.archived is None:
            raise ValueError("give at least one of title, mode, archived")
        return self


class StopIn(_Body):
    reason: str | None = Field(default=None, max_length=500)


class Other(_Body):
    """A free-text answer typed in the "Other" field; stored as the text itself."""

    other: str = Field(min_length=1, max_length=10_000)


class AnswerIn(_Body):
    answers: dict[str, str | Other | list[str | Other]] | None = None
    response: str | None = Field(default=None, min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _something(self) -> AnswerIn:
        if not self.answers and self.response is None:
            raise ValueError("give answers, or a response to dismiss the question with a reply")
        return self
