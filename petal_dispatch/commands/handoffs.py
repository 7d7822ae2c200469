"""`petal-dispatch contract list|add` and `petal-dispatch reextract`: the handoff contract, and a
handoff made again."""

from __future__ import annotations

import argparse
import json
import uuid

from psycopg_pool import AsyncConnectionPool

from petal_dispatch.commands import ids, with_pool
from petal_dispatch.config import Settings
from shared import contract


def contract_list(args: argparse.Namespace, settings: Settings) -> int:
    version, fields = with_pool(settings, contract.active)
    if args.json:
        print(json.dumps({"version": version, "fields": [f.model_dump(mode="json") for f in fields],
                          "schema": contract.schema_for(fields)}, indent=2))
        return 0
    print(f"contract version {version}")
    for f in fields:
        print(f"  {f.field_key:<16} {'required' if f.required else 'optional':<9} {json.dumps(f.shape)}")
        print(f"  {'':<16} {f.semantics}  (read by {', '.join(f.read_by)})")
    return 0


def contract_add(args: argparse.Namespace, settings: Settings) -> int:
    try:
        shape = json.loads(args.shape)
    except ValueError as exc:
        raise contract.ContractError(f"--shape is not JSON: {exc}") from None
    if not isinstance(shape, dict):
        raise contract.ContractError("--shape must be a JSON object (a JSON Schema)")
    read_by = [r.strip() for r in args.read_by.split(",") if r.strip()]

    async def add(pool: AsyncConnectionPool) -> int:
        return await contract.add_field(pool, args.field, shape=shape, semantics=args.semantics,
                                        required=args.required, read_by=read_by, supersede=args.supersede)

    print(f"added contract row {with_pool(settings, add)} for {args.field}")
    return 0


def reextract(args: argparse.Namespace, settings: Settings) -> int:
    from executor.settle import extraction

    async def again(pool: AsyncConnectionPool) -> uuid.UUID:
        task_id = await ids.resolve_on(pool, "task", args.task_id)  # a unique prefix, as `status` prints it
        return await extraction.request(pool, task_id, requested_by="reextract")

    print(json.dumps({"extractor_task_id": str(with_pool(settings, again)),
                      "note": "the executor runs it; a new handoff record follows, the old one stays"}))
    return 0
