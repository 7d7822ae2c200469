"""Token mode's sign-in (/login): the form, and the cookie a right token sets. A form the browser posted gets a page
back whatever the outcome (a wrong token, too many of them: the form again, saying so); a JSON client, a problem."""

from __future__ import annotations

import html

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from ingress import problems
from ingress.auth import COOKIE, AuthConfig, TokenLimiter, parse_login, same_secret, too_many
from ingress.boundary import forwarded, peer

# no inline style or script: the page is served under the same CSP as the app
_PAGE = """<!doctype html><meta charset=utf-8><meta name=viewport content="width=device-width">
<title>petal-dispatch · sign in</title><form method=post action=/login>
<h1>petal-dispatch</h1>{said}<label>Token <input name=token type=password autofocus required></label>
<p><button>Sign in</button></p></form>"""


def _page(said: str = "", status: int = 200) -> HTMLResponse:
    return HTMLResponse(_PAGE.format(said=f"<p role=alert><strong>{html.escape(said)}</strong></p>" if said else ""),
                        status_code=status)


def _refused(request: Request, response: Response, said: str) -> Response:
    """The problem for a JSON client; for the browser's form, the form again saying why (a phone has no way back
    from a page of JSON but the back button)."""
    if request.headers.get("content-type", "").startswith("application/json"):
        return response
    page = _page(said, response.status_code)
    if "retry-after" in response.headers:
        page.headers["retry-after"] = response.headers["retry-after"]
    return page


async def login(request: Request) -> Response:
    config: AuthConfig = request.app.state.auth
    if request.method == "GET":
        return _page()
    if config.mode != "token":
        return problems.problem(404, "sign-in is only used in token mode")
    scheme, client = forwarded(request.app.state.boundary, request.scope)
    limiter: TokenLimiter = request.app.state.limiter
    wait = limiter.retry_after(client, peer(request.scope))
    if wait:
        return _refused(request, too_many(wait), f"Too many wrong tokens: try again in {int(wait) + 1} s.")
    token = parse_login(await request.body(), request.headers.get("content-type", ""))  # over the limit: 413
    # again now the body is in: guesses held open in parallel all passed the first look before any failed
    wait = limiter.retry_after(client, peer(request.scope))
    if wait:
        return _refused(request, too_many(wait), f"Too many wrong tokens: try again in {int(wait) + 1} s.")
    if not token or not same_secret(token, config.token):
        limiter.fail(client, peer(request.scope))
        return _refused(request, problems.problem(401, "wrong token"), "Wrong token: try again.")
    response = RedirectResponse("/", status_code=303)
    # Secure when the user's browser spoke https (to the trusted proxy, which speaks http to us)
    response.set_cookie(COOKIE, config.cookie_value(), httponly=True, samesite="strict",
                        secure=scheme == "https", max_age=30 * 24 * 3600)
    return response
