"""The fleet's VAPID key: the one Web Push signs with, from the setting, else offered by the first executor and
kept in the store so every executor of the fleet signs with the same."""

from __future__ import annotations

import base64
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from py_vapid import Vapid
from pydantic import SecretStr

SECRET_NAME = "vapid_private_pem"  # the fleet secret's name in the store


def configured(private_key: SecretStr | None) -> Vapid | None:
    """The VAPID key from the setting, if one is set (then every executor of the fleet must have the same)."""
    if not private_key:
        return None
    key = private_key.get_secret_value().strip()
    if key.startswith("-----BEGIN"):
        return Vapid.from_pem(key.encode())
    return Vapid.from_string(private_key=key)


def candidate_pem(data_dir: Path) -> bytes:
    """The key this executor offers the fleet: a data directory's key from before the fleet, else a new one."""
    path = data_dir / "vapid_private.pem"
    if path.exists():
        return bytes(Vapid.from_file(str(path)).private_pem())
    vapid = Vapid()
    vapid.generate_keys()
    return bytes(vapid.private_pem())


def public_key(vapid: Vapid) -> str:
    raw = vapid.public_key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
