"""A webhook delivery's signature, verified (pure: headers, body, the routine's secret, the clock). Two schemes:

- Standard Webhooks (standardwebhooks.com): `webhook-id`, `webhook-timestamp` (integer seconds) and
  `webhook-signature`, a space-separated list of `v1,<base64 HMAC-SHA256 of "id.timestamp.body">` keyed with the
  base64 bytes of the secret after its `whsec_` prefix. The id and the time are signed: a delivery is accepted
  within TOLERANCE_S of this server's clock, either way, and its id once (the caller keeps the ids).
- GitHub's `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`, keyed with the secret's text as it is
  pasted into GitHub's form. Nothing signed names or dates the delivery (`X-GitHub-Delivery` is not signed), so
  the caller refuses a body it accepted before (`body_sha256`), whatever id comes with it.

A routine's secret (`whsec_<base64 of 32 random bytes>`) serves both.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER = "webhook-id", "webhook-timestamp", "webhook-signature"
GITHUB_SIGNATURE_HEADER, GITHUB_DELIVERY_HEADER = "x-hub-signature-256", "x-github-delivery"
# the Standard Webhooks spec's and its libraries' default: a signed timestamp further from the clock is refused
TOLERANCE_S = 5 * 60
MAX_ID_CHARS = 200  # routine_queue.delivery_id


class Refused(Exception):
    """A delivery not accepted: the HTTP status and the problem's detail."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


@dataclass(frozen=True)
class Verified:
    scheme: str  # "standard" or "github"
    delivery_id: str  # refused when seen again
    body_sha256: bytes | None  # GitHub's: the body is what was signed, so the body is what must not come twice


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def standard_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (as its reference libraries read it: base64 after `whsec_`)."""
    try:
        return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise Refused(401, "the routine's webhook secret is no Standard Webhooks secret (base64): sign with "
                           "X-Hub-Signature-256") from None


def standard_signature(secret: str, delivery_id: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(standard_key(secret), f"{delivery_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def github_signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(headers: Mapping[str, str], body: bytes, secret: str, now: float) -> Verified:
    """The delivery's scheme and what identifies it, or Refused. `headers` are looked up by lower-case name."""
    if SIGNATURE_HEADER in headers:
        return _standard(headers, body, secret, now)
    if GITHUB_SIGNATURE_HEADER in headers:
        return _github(headers, body, secret)
    raise Refused(401, "unknown routine or wrong credential: sign the delivery with webhook-id, webhook-timestamp "
                       "and webhook-signature (Standard Webhooks) or X-Hub-Signature-256 (GitHub)")


def _standard(headers: Mapping[str, str], body: bytes, secret: str, now: float) -> Verified:
    delivery_id = headers.get(ID_HEADER, "").strip()
    stamp = headers.get(TIMESTAMP_HEADER, "").strip()
    if not delivery_id or len(delivery_id) > MAX_ID_CHARS:
        raise Refused(400, f"webhook-id (the delivery's id, 1 to {MAX_ID_CHARS} characters) is required with "
                           "webhook-signature")
    if not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
        raise Refused(400, "webhook-timestamp (integer seconds since the epoch) is required with webhook-signature")
    expected = standard_signature(secret, delivery_id, int(stamp), body).encode()
    given = [s.encode() for s in headers[SIGNATURE_HEADER].split() if s.startswith("v1,")]
    # every v1 signature is compared (a sender rotating its secret sends one per key)
    if not any([hmac.compare_digest(s, expected) for s in given]):
        raise Refused(401, "unknown routine or wrong credential (webhook-signature: no v1 signature of "
                           "id.timestamp.body with the routine's secret)")
    off = now - int(stamp)
    if abs(off) > TOLERANCE_S:
        raise Refused(401, f"webhook-timestamp is {abs(off):.0f} s {'behind' if off > 0 else 'ahead of'} this "
                           f"server's clock; a delivery is accepted within {TOLERANCE_S} s either way (a replay "
                           "of an old delivery, or a clock to set right)")
    return Verified("standard", delivery_id, None)


def _github(headers: Mapping[str, str], body: bytes, secret: str) -> Verified:
    if not hmac.compare_digest(headers[GITHUB_SIGNATURE_HEADER].encode(), github_signature(secret, body).encode()):
        raise Refused(401, "unknown routine or wrong credential (X-Hub-Signature-256)")
    delivery_id = headers.get(GITHUB_DELIVERY_HEADER, "").strip()
    if not delivery_id or len(delivery_id) > MAX_ID_CHARS:
        raise Refused(400, f"X-GitHub-Delivery (the delivery's id, at most {MAX_ID_CHARS} characters) is required")
    return Verified("github", delivery_id, hashlib.sha256(body).digest())
