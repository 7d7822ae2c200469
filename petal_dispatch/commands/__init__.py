"""The `petal-dispatch` commands, one module per group; `petal_dispatch/cli.py` parses and dispatches.

Each command is `handler(args, settings) -> int` (the exit code): `args` as `cli.build_parser` parsed them,
`settings` read once from the environment by `cli.main`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from psycopg_pool import AsyncConnectionPool

from petal_dispatch import dbserver
from petal_dispatch.config import Settings
from shared.database import Database

T = TypeVar("T")
Handler = Callable[[argparse.Namespace, Settings], int]


@dataclass(frozen=True)
class Command:
    """A command's handler (`petal_dispatch/commands/<module>.py`), imported when it runs: a process runs one
    command, and importing every command module (routines' pulls in the ingress's) was a fifth of each start."""

    module: str
    name: str

    def __call__(self, args: argparse.Namespace, settings: Settings) -> int:
        handler: Handler = getattr(importlib.import_module(f"petal_dispatch.commands.{self.module}"), self.name)
        return handler(args, settings)


def with_pool(settings: Settings, work: Callable[[AsyncConnectionPool], Awaitable[T]]) -> T:
    info = dbserver.resolve(settings)

    async def run() -> T:
        async with Database(info.executor_dsn, name="petal-cli", max_size=2) as db:
            return await work(db.pool)

    return asyncio.run(run())
