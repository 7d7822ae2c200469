"""Errors as RFC 9457 problem details (application/problem+json) with a clear message."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from shared.errors import Conflict, Missing

_TITLES = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found",
           405: "Method not allowed", 409: "Conflict", 413: "Payload too large", 415: "Unsupported media type",
           421: "Misdirected request", 422: "Invalid input", 429: "Too many requests", 500: "Internal error", 503: "Unavailable"}


class Problem(Exception):
    def __init__(self, status: int, detail: str, **extra: Any):
        self.status = status
        self.detail = detail
        self.extra = extra


def problem(status: int, detail: str, **extra: Any) -> JSONResponse:
    body = {"type": "about:blank", "title": _TITLES.get(status, "Error"), "status": status, "detail": detail,
            **extra}
    return JSONResponse(body, status_code=status, media_type="application/problem+json")


async def handle_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Problem)
    return problem(exc.status, exc.detail, **exc.extra)


async def handle_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return problem(exc.status_code, exc.detail or _TITLES.get(exc.status_code, "Error"))


async def handle_validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ValidationError)
    errors = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors(include_url=False, include_input=False)]
    first = errors[0] if errors else {"loc": [], "msg": "invalid"}
    where = ".".join(str(p) for p in first["loc"]) or "body"
    return problem(422, f"{where}: {first['msg']}", errors=errors)


async def handle_too_large(request: Request, exc: Exception) -> Response:
    # a body read past the limit (chunked bodies carry no Content-Length to refuse up front)
    return problem(413, "body too large")


async def handle_client_gone(request: Request, exc: Exception) -> Response:
    # a client that dropped off mid-request (a phone losing its network): nothing was done, no one is left to
    # answer, and it is no error of the server's
    return problem(400, "the client went away before its request body arrived")


async def handle_data_error(request: Request, exc: Exception) -> Response:
    # the database refused a value (a safety net behind the input checks): the statement wrote nothing
    return problem(422, f"a value cannot be stored: {str(exc).splitlines()[0]}")


async def handle_refused(request: Request, exc: Exception) -> Response:
    # a named query's write refused for its content (translated in shared/query.py): nothing was written
    status = 409 if isinstance(exc, Conflict) else 404 if isinstance(exc, Missing) else 422
    return problem(status, f"the database refused it: {exc}")


# How soon a client should try again while the database is away (the ingress reconnects by itself).
RETRY_AFTER_S = 5


async def handle_unavailable(request: Request, exc: Exception) -> Response:
    # the database is away (refused, cut, or no pooled connection within the acquire timeout): nothing was
    # written; a retry with the same client_msg_id is safe
    response = problem(503, "the database is unavailable; nothing was written; retry shortly",
                       retry_after_s=RETRY_AFTER_S)
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


async def handle_contended(request: Request, exc: Exception) -> Response:
    # a deadlock or serialization failure: PostgreSQL aborted this request's transaction for a concurrent
    # one; the database is there (no outage, no Retry-After) and the same request again is expected to pass
    return problem(409, f"a concurrent change got in the way ({str(exc).strip().splitlines()[0]}); "
                        "nothing was written; retry")


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    return problem(500, "internal error; nothing was written")
