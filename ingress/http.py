"""Small helpers shared by the route modules: parsing input strictly, answering JSON."""

from __future__ import annotations

import base64
import json
import re
import uuid
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from ingress.auth import BodyTooLarge
from ingress.problems import Problem
from shared.database import Database, Pool
from shared.query import Queries

M = TypeVar("M", bound=BaseModel)

# No request body needs more nesting than this; a deeper one is refused before parsing (json's parser
# recurses, and 100,000 levels would exhaust the stack).
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET = re.compile(rb"[\[\]{}]")


def who(request: Request) -> str:
    """Who made this request, as the authentication found it (the guard puts it on the request's state): the
    proxy's user name, 'token' or 'open'. Recorded with every answer, rule and message it writes."""
    return str(getattr(request.state, "user", None) or "unknown")[:200]


def pool(request: Request) -> Pool:
    """The process's connection pool (the lifespan put its Database on the app's state)."""
    db: Database = request.app.state.db
    return db.pool


def ingress_queries(request: Request) -> Queries:
    """The ingress's named queries over the process's pool (made once, by the lifespan)."""
    found: Queries = request.app.state.queries
    return found


def shared_queries(request: Request) -> Queries:
    """The named queries both services share (shared/sql), over the same pool."""
    found: Queries = request.app.state.shared_queries
    return found


def json_depth_exceeds(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text nests arrays/objects deeper than `limit` (strings skipped; no recursion)."""
    depth = 0
    for m in _BRACKET.finditer(_JSON_STRING.sub(b"", raw)):
        if m.group() in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def dumps(value: Any) -> bytes:
    def default(o: Any) -> Any:
        if isinstance(o, uuid.UUID):
            return str(o)
        if hasattr(o, "isoformat"):
            return o.isoformat()
        if isinstance(o, BaseModel):
            return o.model_dump(mode="json")
        raise TypeError(f"cannot encode {type(o).__name__}")

    return json.dumps(value, default=default, separators=(",", ":")).encode()


def respond(value: Any, status: int = 200) -> Response:
    return Response(dumps(value), status_code=status, media_type="application/json")


async def body(request: Request, model: type[M], *, optional: bool = False) -> M:
    try:
        raw = await request.body()
    except BodyTooLarge:
        raise Problem(413, "body too large") from None
    if not raw.strip():
        if optional:
            return model()
        raise Problem(400, "a JSON body is required")
    if json_depth_exceeds(raw):
        raise Problem(400, f"malformed JSON: nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise Problem(400, f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise Problem(422, "the body must be a JSON object")
    _check_text(data)
    return model.model_validate(data)


def _check_text(value: Any, where: str = "body") -> None:
    """PostgreSQL text holds neither NUL nor lone surrogates: refuse them with a clear message."""
    if isinstance(value, str):
        if "\x00" in value:
            raise Problem(422, f"{where}: text may not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise Problem(422, f"{where}: text is not valid Unicode (a lone surrogate)") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k, where)
            _check_text(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_text(v, f"{where}[{i}]")


def path_uuid(request: Request, name: str) -> uuid.UUID:
    raw = request.path_params[name]
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise Problem(404, f"no {name.removesuffix('_id')} {raw!r} (ids are UUIDs)") from None


def query_uuid(request: Request, name: str) -> uuid.UUID | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise Problem(400, f"{name} must be a UUID") from None


def query_cursor(request: Request, name: str = "before") -> tuple[datetime, uuid.UUID] | None:
    """A list's keyset cursor (`next_before` of the page before): the last row's (created_at, id)."""
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        at, _, row_id = base64.urlsafe_b64decode(raw.encode() + b"=" * (-len(raw) % 4)).decode().partition("|")
        return datetime.fromisoformat(at), uuid.UUID(row_id)
    except (ValueError, UnicodeDecodeError):
        raise Problem(400, f"{name} must be a list's next_before, as it gave it") from None


def next_cursor(rows: list[dict[str, Any]], limit: int) -> str | None:
    """The cursor of the page after `rows` (a full page), else None: the list ends here."""
    if len(rows) < limit:
        return None
    last = rows[-1]
    return base64.urlsafe_b64encode(f"{last['created_at'].isoformat()}|{last['id']}".encode()).decode().rstrip("=")


def query_int(request: Request, name: str, default: int, *, lo: int = 0, hi: int = 10**18) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise Problem(400, f"{name} must be an integer") from None
    if not lo <= value <= hi:
        raise Problem(400, f"{name} must be between {lo} and {hi}")
    return value


def query_choice(request: Request, name: str, choices: tuple[str, ...]) -> str | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    if raw not in choices:
        raise Problem(400, f"{name} must be one of {', '.join(choices)}")
    return raw


def query_bool(request: Request, name: str) -> bool | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise Problem(400, f"{name} must be true or false")
