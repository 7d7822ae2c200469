"""The handoff contract is data: its active rows become a JSON Schema (Draft 2020-12).

Adding a field is an INSERT (`petal-dispatch contract add`); rows never change. The schema allows
unknown fields, because readers are shape-tolerant and old handoffs carry old shapes.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import jsonschema
import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from shared import errors
from shared.models import ContractField
from shared.query import Queries, Transaction
from shared.sql import queries

_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


class ContractError(errors.PetalError):
    """A contract change was refused; nothing was written."""


async def active(pool: AsyncConnectionPool) -> tuple[int, list[ContractField]]:
    """(version, active fields). The version is the newest row's id: any change makes a new one."""
    async with Queries(pool, queries).transaction() as tx:  # one snapshot: the version and its fields
        return await active_on(tx.conn)


async def active_on(conn: psycopg.AsyncConnection) -> tuple[int, list[ContractField]]:
    """`active`, read on the caller's connection (inside its transaction)."""
    tx = Transaction(conn, queries)
    row = await tx.one("get_contract_version")
    assert row is not None  # an aggregate: always one row
    return int(row["version"]), await tx.all("list_active_contract_fields", into=ContractField)


def schema_for(fields: list[ContractField]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {f.field_key: {**f.shape, "description": f.semantics} for f in fields},
        "required": [f.field_key for f in fields if f.required],
        "additionalProperties": True,
    }


@functools.lru_cache(maxsize=16)
def _validator(schema_json: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(schema_json))


def validate(schema: dict[str, Any], value: Any) -> list[str]:
    """Every way `value` breaks `schema` (empty when it passes). The validator is compiled once per schema."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))]


async def add_field(pool: AsyncConnectionPool, field_key: str, *, shape: dict[str, Any], semantics: str,
                    required: bool = False, read_by: list[str] | None = None, supersede: bool = False,
                    retire: bool = False) -> int:
    """Append a contract row; returns its id.

    Raises:
        ContractError: a bad key or shape, a field that exists (without supersede), or none to supersede.
    """
    if not _KEY.match(field_key):
        raise ContractError(f"field key {field_key!r}: lower-case letters, digits and _ only, starting with a letter")
    if not semantics.strip():
        raise ContractError("a field needs its semantics: what it means and who reads it")
    try:
        jsonschema.Draft202012Validator.check_schema(shape)
    except jsonschema.SchemaError as exc:
        raise ContractError(f"shape is not a valid JSON Schema: {exc.message}") from None
    async with Queries(pool, queries).transaction() as tx:
        current = await tx.one("get_current_contract_field", {"field_key": field_key})
        if current and not supersede:
            raise ContractError(f"field {field_key!r} exists; contract rows are never edited: pass --supersede to "
                                "add a row that replaces it")
        if supersede and not current:
            raise ContractError(f"no active field {field_key!r} to supersede")
        row = await tx.one("insert_contract_field", {
            "field_key": field_key, "required": required, "read_by": read_by or ["harness", "human"],
            "semantics": semantics, "shape": Jsonb(shape), "supersedes": current["id"] if current else None,
            "retired": retire})
    assert row is not None  # INSERT … RETURNING gives its row
    return int(row["id"])
