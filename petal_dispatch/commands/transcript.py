"""`petal-dispatch import-transcript`: a recorded stream-json file journaled as one finished task."""

from __future__ import annotations

import argparse
import asyncio
import json

from petal_dispatch import dbserver
from petal_dispatch.commands import ids
from petal_dispatch.config import Settings
from shared import errors
from shared.database import Database


def import_transcript(args: argparse.Namespace, settings: Settings) -> int:
    from executor.run import transcript

    if not args.file.is_file():
        raise errors.ConfigError(f"no such file: {args.file}")
    info = dbserver.resolve(settings)

    async def run() -> dict[str, object]:
        async with Database(info.executor_dsn, name="petal-import", max_size=2) as db:
            project = await ids.resolve_on(db.pool, "project", args.project) if args.project else None
            return await transcript.import_transcript(db.pool, args.file, project_id=project, role=args.role)

    print(json.dumps(asyncio.run(run())))
    return 0
