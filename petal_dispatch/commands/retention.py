"""`petal-dispatch attachments purge`: retention of the files sent from the phone."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from psycopg_pool import AsyncConnectionPool

from petal_dispatch.commands import with_pool
from petal_dispatch.config import Settings
from shared import errors

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(raw: str) -> float:
    """'30d', '12h', '45m', '90s' → seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", raw)
    if m is None:
        raise errors.ConfigError(f"--older-than {raw!r}: give a number and a unit, e.g. 30d, 12h, 45m")
    return float(m.group(1)) * _UNITS[m.group(2)]


def purge(args: argparse.Namespace, settings: Settings) -> int:
    from executor.settle import threads

    older_than_s = parse_age(args.older_than)

    async def run(pool: AsyncConnectionPool) -> list[dict[str, Any]]:
        return await threads.purge_attachments(pool, older_than_s)

    gone = with_pool(settings, run)
    print(json.dumps({"purged": len(gone), "bytes": sum(int(g["size_bytes"]) for g in gone),
                      "note": "the journal keeps each file's name and sha256 (attachments.purged)"}))
    return 0
