"""Request bodies. Unknown fields are refused so a typo is an error, not silently ignored."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared import remotes

Mode = Literal["interactive", "autonomous"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChatIn(_Body):
    text: str = Field(min_length=1, max_length=100_000)
    thread_id: uuid.UUID | None = None
    client_msg_id: str | None = Field(default=None, min_length=1, max_length=200)
    # files uploaded first (POST /api/attachments), in the order the model sees them
    attachment_ids: list[uuid.UUID] = Field(default_factory=list, max_length=20)

    @field_validator("attachment_ids")
    @classmethod
    def _distinct(cls, ids: list[uuid.UUID]) -> list[uuid.UUID]:
        if len(set(ids)) != len(ids):
            raise ValueError("an attachment is listed twice")
        return ids

    @field_validator("text")
    @classmethod
    def _not_blank(cls, text: str) -> str:
        # the CLI refuses a prompt that is only whitespace, and the thread's turn would fail
        if not text.strip():
            raise ValueError("text is empty (only whitespace)")
        return text


class ThreadIn(_Body):
    title: str | None = Field(default=None, max_length=200)
    mode: Mode | None = None
    # the project the thread works on: its turns know the project, its workers run in its repository
    project_id: uuid.UUID | None = None
    # a CLI conversation stored on an executor (GET /api/claude-sessions) the thread continues, and that
    # executor (needed only when more than one holds a conversation of that id)
    adopt_session_id: uuid.UUID | None = None
    executor: str | None = Field(default=None, min_length=1, max_length=200)

    @model_validator(mode="after")
    def _adopt_alone(self) -> ThreadIn:
        if self.adopt_session_id is not None and self.project_id is not None:
            raise ValueError("a thread made from a stored conversation has no project: give one of them")
        if self.executor is not None and self.adopt_session_id is None:
            raise ValueError("executor names where adopt_session_id is held: give adopt_session_id")
        return self


class ThreadPatch(_Body):
    title: str | None = Field(default=None, min_length=1, max_length=200)
    mode: Mode | None = None
    archived: Literal[True] | None = None

    @model_validator(mode="after")
    def _one_change(self) -> ThreadPatch:
        if self.title is None and self.mode is None and self.archived is None:
            raise ValueError("give at least one of title, mode, archived")
        return self


class RetryIn(_Body):
    task_id: uuid.UUID | None = Field(default=None, description="the failed turn (default: the thread's latest)")


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


def _b64url_bytes(value: str, what: str, size: int) -> str:
    import base64
    import binascii

    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not base64url") from None
    if len(raw) != size:
        raise ValueError(f"{what} must be {size} bytes (got {len(raw)})")
    return value


class PushKeys(_Body):
    p256dh: str = Field(min_length=1, max_length=200)
    auth: str = Field(min_length=1, max_length=100)

    @model_validator(mode="after")
    def _sizes(self) -> PushKeys:
        _b64url_bytes(self.p256dh, "keys.p256dh (an uncompressed P-256 point)", 65)
        _b64url_bytes(self.auth, "keys.auth", 16)
        return self


class PushSubscriptionIn(BaseModel):
    """What PushSubscription.toJSON() gives (expirationTime and unknown keys are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    endpoint: str = Field(min_length=8, max_length=2000)
    keys: PushKeys

    @model_validator(mode="after")
    def _endpoint(self) -> PushSubscriptionIn:
        from urllib.parse import urlparse

        url = urlparse(self.endpoint)
        loopback = url.hostname in ("127.0.0.1", "localhost", "::1")
        # push services speak https; plain http only to this machine (a self-hosted relay, tests)
        if not url.hostname or not (url.scheme == "https" or (url.scheme == "http" and loopback)):
            raise ValueError("endpoint must be an https URL of a push service")
        return self


class PushEndpointIn(_Body):
    endpoint: str = Field(min_length=8, max_length=2000)


class PresenceIn(_Body):
    client_id: str = Field(min_length=8, max_length=100)
    thread_id: uuid.UUID | None = None
    visible: bool = False  # the page is in front of the user: nothing is pushed meanwhile


class NotifyActIn(_Body):
    """A notification's answer button pressed: the notification's one-use token and the option it answers."""
    token: str = Field(min_length=20, max_length=100)
    choice: str = Field(min_length=1, max_length=1000)


_PUSH_REMOTE = ("where Push sends a worker's reviewed commit: an https:// or http:// URL (no credentials) or the "
                "absolute path of a repository")


def _checked_remote(value: str | None) -> str | None:
    return None if value is None else remotes.parse(value).url


class ProjectIn(_Body):
    """A project on a git repository: the executor checks the workdir (under PETAL_PROJECT_ROOTS, a
    repository's top level, or initialised when `init` is true) and refuses with the reason otherwise."""

    slug: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$", description="short unique name")
    workdir: str = Field(min_length=1, max_length=4096, description="absolute path of the repository")
    plan: str | None = Field(default=None, min_length=1, max_length=200_000,
                             description="markdown with `- [ ] T-001 title` lines")
    plan_path: str | None = Field(default=None, min_length=1, max_length=1000,
                                  description="a plan file in the repository, relative to workdir")
    init: bool = False
    sandbox_allow: list[Annotated[str, Field(min_length=1, max_length=300)]] | None = Field(
        default=None, max_length=100,
        description="hosts the project's workers may reach from their sandbox (host, host:port or *.domain: "
                    "its package registries), besides the operator's PETAL_SANDBOX_ALLOW")
    check_command: str | None = Field(
        default=None, min_length=1, max_length=2000,
        description="a command run in each worker's sandbox on its worktree after it ends (e.g. `python -m pytest "
                    "-q`): its result is on the diff card and in the handoff; a failure gets a fix round")
    check_retries: int = Field(default=1, ge=0, le=5, description="fix rounds a failing check gets")
    push_remote: str | None = Field(default=None, min_length=1, max_length=remotes.MAX_CHARS,
                                    description=_PUSH_REMOTE)

    check_push_remote = field_validator("push_remote")(_checked_remote)

    @model_validator(mode="after")
    def _one_plan(self) -> ProjectIn:
        if self.plan is not None and self.plan_path is not None:
            raise ValueError("give plan or plan_path, not both")
        return self


class ProjectPatch(_Body):
    """A project's settings changed: its push remote (null: none)."""

    push_remote: str | None = Field(min_length=1, max_length=remotes.MAX_CHARS, description=_PUSH_REMOTE)

    check_push_remote = field_validator("push_remote")(_checked_remote)


class ReviewIn(_Body):
    reason: str | None = Field(default=None, max_length=500)


class LineComment(_Body):
    """A comment on a line (or the lines `line`..`end_line`) of a file in a worker's diff, with its hunk."""
    file: str = Field(min_length=1, max_length=500)
    line: int = Field(ge=1)
    end_line: int | None = Field(default=None, ge=1)
    text: str = Field(min_length=1, max_length=4000)
    hunk: str | None = Field(default=None, max_length=8000)

    @model_validator(mode="after")
    def _range(self) -> LineComment:
        if self.end_line is not None and self.end_line < self.line:
            raise ValueError("end_line comes after line")
        return self


class SendBackIn(_Body):
    """A review of a worker's diff, sent back: its line comments (and a note) go to a follow-up worker."""
    comments: list[LineComment] = Field(default_factory=list, max_length=50)
    note: str | None = Field(default=None, min_length=1, max_length=4000)

    @model_validator(mode="after")
    def _something(self) -> SendBackIn:
        if not self.comments and self.note is None:
            raise ValueError("a review needs at least one comment, or a note")
        return self


# ---- routines ------------------------------------------------------------------------------------------

class ScheduleIn(_Body):
    cron: str = Field(min_length=1, max_length=200, description="five fields: minute hour day month weekday")
    tz: str = Field(min_length=1, max_length=100, description="an IANA time zone, e.g. Europe/Berlin")
    missed: Literal["skip", "run_once"] = Field(
        default="skip", description="instants missed while no executor ran: none of them, or one run for all")
    overlap: Literal["skip", "queue", "parallel"] = Field(
        default="skip", description="when the previous run is still going: skip this one, queue it, or run both")


class BudgetIn(_Body):
    usd_per_run: float | None = Field(default=None, gt=0, le=10_000, description="the CLI's --max-budget-usd")
    runtime_s: int | None = Field(default=None, gt=0, le=7 * 24 * 3600, description="a run is stopped after this")
    usd_per_day: float | None = Field(default=None, gt=0, le=100_000,
                                      description="a run that would pass the routine's day (UTC) is skipped")
    max_workers: int | None = Field(default=None, gt=0, le=100, description="workers a run may have at once")


class RoutineIn(_Body):
    name: str = Field(min_length=1, max_length=200)
    project_id: uuid.UUID | None = None
    prompt: str = Field(min_length=1, max_length=100_000,
                        description="a template: {{ event.<field> }} from the trigger's payload")
    mode: Mode = "autonomous"
    schedule: ScheduleIn | None = None
    webhook: bool = Field(default=False, description="issue a webhook secret (POST /api/hooks/{id})")
    budget: BudgetIn | None = None
    enabled: bool = True


class RoutinePatch(_Body):
    name: str | None = Field(default=None, min_length=1, max_length=200)
    prompt: str | None = Field(default=None, min_length=1, max_length=100_000)
    mode: Mode | None = None
    enabled: bool | None = None
    schedule: ScheduleIn | None = None
    unschedule: Literal[True] | None = Field(default=None, description="remove the schedule")
    budget: BudgetIn | None = None


class RunIn(_Body):
    event: dict[str, object] = Field(default_factory=dict, description="what the template sees as `event`")
