"""A webhook delivery's signature (ingress/webhooks.py): Standard Webhooks against the specification's own test
vector, its tolerance window either way, and GitHub's X-Hub-Signature-256 naming the body as what must not come
twice."""

from __future__ import annotations

import hashlib

import pytest

from ingress import webhooks
from ingress.webhooks import Refused, Verified

pytestmark = pytest.mark.unit

# the Standard Webhooks specification's example (and its reference libraries' tests)
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID, STAMP, BODY = "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def standard(signature: str = SIGNATURE, msg_id: str = MSG_ID, stamp: str = str(STAMP)) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": stamp, "webhook-signature": signature}


def test_the_specifications_example_verifies() -> None:
    assert webhooks.standard_signature(SECRET, MSG_ID, STAMP, BODY) == SIGNATURE
    assert webhooks.verify(standard(), BODY, SECRET, STAMP) == Verified("standard", MSG_ID, None)
    # one of several signatures (a sender rotating its secret), unknown versions beside it ignored
    assert webhooks.verify(standard(f"v1a,xyz v1,bm90IGl0 {SIGNATURE}"), BODY, SECRET, STAMP).scheme == "standard"


@pytest.mark.parametrize("change", ["body", "id", "timestamp", "secret", "version"])
def test_anything_signed_changed_is_a_wrong_signature(change: str) -> None:
    headers, body, secret = standard(), BODY, SECRET
    if change == "body":
        body = b'{"test": 2432232315}'
    elif change == "id":
        headers = standard(msg_id="msg_other")
    elif change == "timestamp":
        headers = standard(stamp=str(STAMP + 1))
    elif change == "secret":
        secret = "whsec_" + "A" * 32
    else:
        headers = standard("v2," + SIGNATURE[3:])
    with pytest.raises(Refused, match="wrong credential") as refused:
        webhooks.verify(headers, body, secret, STAMP)
    assert refused.value.status == 401


@pytest.mark.parametrize("off", [-webhooks.TOLERANCE_S, webhooks.TOLERANCE_S])
def test_a_timestamp_within_five_minutes_either_way_is_accepted(off: int) -> None:
    assert webhooks.verify(standard(), BODY, SECRET, STAMP + off).delivery_id == MSG_ID


@pytest.mark.parametrize("off, says", [(webhooks.TOLERANCE_S + 1, "301 s behind"),
                                       (-webhooks.TOLERANCE_S - 1, "301 s ahead of")])
def test_a_signed_timestamp_past_the_tolerance_is_refused_saying_how_far(off: int, says: str) -> None:
    with pytest.raises(Refused, match=says) as refused:
        webhooks.verify(standard(), BODY, SECRET, STAMP + off)
    assert refused.value.status == 401 and "within 300 s" in refused.value.detail


@pytest.mark.parametrize("headers, says", [
    ({"webhook-signature": SIGNATURE, "webhook-timestamp": str(STAMP)}, "webhook-id"),
    (standard(msg_id="x" * 201), "webhook-id"),
    ({"webhook-signature": SIGNATURE, "webhook-id": MSG_ID}, "webhook-timestamp"),
    (standard(stamp="1614265330.5"), "webhook-timestamp"),
    (standard(stamp="-1"), "webhook-timestamp"),
])
def test_a_standard_delivery_without_its_id_or_an_integer_timestamp_is_a_bad_request(
        headers: dict[str, str], says: str) -> None:
    with pytest.raises(Refused, match=says) as refused:
        webhooks.verify(headers, BODY, SECRET, STAMP)
    assert refused.value.status == 400


def test_a_new_secret_keys_both_schemes() -> None:
    secret = webhooks.new_secret()
    assert secret.startswith("whsec_") and len(webhooks.standard_key(secret)) == 32
    signed = webhooks.standard_signature(secret, "m1", STAMP, BODY)
    assert webhooks.verify(standard(signed, "m1"), BODY, secret, STAMP + 10).delivery_id == "m1"
    github = {"x-hub-signature-256": webhooks.github_signature(secret, BODY), "x-github-delivery": "d-1"}
    assert webhooks.verify(github, BODY, secret, 0) == Verified("github", "d-1", hashlib.sha256(BODY).digest())


def test_a_secret_made_before_whsec_still_verifies_as_its_senders_libraries_read_it() -> None:
    # the hex secrets issued before are valid base64: a Standard Webhooks library given one decodes it the same way
    legacy = "ab" * 32
    signed = webhooks.standard_signature(legacy, "m1", STAMP, BODY)
    assert webhooks.standard_key(legacy) == bytes.fromhex("69b69b" * 16)
    assert webhooks.verify(standard(signed, "m1"), BODY, legacy, STAMP).scheme == "standard"


def test_github_the_body_is_what_identifies_a_delivery() -> None:
    signed = webhooks.github_signature(SECRET, BODY)
    first = webhooks.verify({"x-hub-signature-256": signed, "x-github-delivery": "d-1"}, BODY, SECRET, 0)
    replayed = webhooks.verify({"x-hub-signature-256": signed, "x-github-delivery": "d-2"}, BODY, SECRET, 0)
    assert first.body_sha256 == replayed.body_sha256 == hashlib.sha256(BODY).digest()
    with pytest.raises(Refused, match="X-Hub-Signature-256") as wrong:
        webhooks.verify({"x-hub-signature-256": signed, "x-github-delivery": "d-1"}, BODY + b" ", SECRET, 0)
    assert wrong.value.status == 401
    with pytest.raises(Refused, match="X-GitHub-Delivery") as no_id:
        webhooks.verify({"x-hub-signature-256": signed}, BODY, SECRET, 0)
    assert no_id.value.status == 400


def test_an_unsigned_delivery_is_told_both_schemes() -> None:
    with pytest.raises(Refused, match="webhook-signature.*X-Hub-Signature-256") as refused:
        webhooks.verify({"x-github-delivery": "d-1"}, BODY, SECRET, 0)
    assert refused.value.status == 401
