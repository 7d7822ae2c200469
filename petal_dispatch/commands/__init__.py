"""The `petal-dispatch` commands, one module per group; `petal_dispatch/cli.py` parses and dispatches.

Each command is `handler(args, settings) -> int` (the exit code): `args` as `cli.build_parser` parsed them,
`settings` read once from the environment by `cli.main`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from psycopg_pool import AsyncConnectionPool

from petal_dispatch import dbserver
from petal_dispatch.config import Settings
from shared.database import Database

T = TypeVar("T")


def with_pool(settings: Settings, work: Callable[[AsyncConnectionPool], Awaitable[T]]) -> T:
    info = dbserver.resolve(settings)

    async def run() -> T:
        async with Database(info.executor_dsn, name="petal-cli", max_size=2) as db:
            return await work(db.pool)

    return asyncio.run(run())
