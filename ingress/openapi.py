"""The OpenAPI document, built from the route table and the pydantic request models."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

PROBLEM = {"description": "problem details", "content": {"application/problem+json": {"schema": {
    "type": "object", "required": ["title", "status", "detail"],
    "properties": {"type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
                   "detail": {"type": "string"}}}}}}


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # path | query | header
    schema: dict[str, Any]
    description: str = ""


@dataclass(frozen=True)
class Op:
    method: str
    path: str
    summary: str
    body: type[BaseModel] | None = None
    body_optional: bool = False
    params: tuple[Param, ...] = ()
    status: int = 200
    errors: tuple[int, ...] = ()
    upload: bool = False  # the body is a file: multipart/form-data with the field `file`
    responses: dict[str, Any] = field(default_factory=dict)


UUID = {"type": "string", "format": "uuid"}
SEQ = {"type": "integer", "minimum": 0}


def document(ops: list[Op], *, version: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for op in ops:
        entry: dict[str, Any] = {"summary": op.summary, "operationId": f"{op.method}_{op.path}".replace("/", "_")
                                 .replace("{", "").replace("}", ""),
                                 "responses": {str(op.status): {"description": "ok",
                                                                "content": {"application/json": {"schema": {}}}}}}
        if op.path == "/api/stream":
            entry["responses"] = {"200": {"description": "text/event-stream; see docs/api.md",
                                          "content": {"text/event-stream": {"schema": {"type": "string"}}}}}
        entry["responses"].update(op.responses)
        for code in (*op.errors, 401, 403, 503):  # 503: the database is away (with Retry-After)
            entry["responses"][str(code)] = PROBLEM
        if op.params:
            entry["parameters"] = [{"name": p.name, "in": p.where, "required": p.where == "path",
                                    "schema": p.schema, "description": p.description} for p in op.params]
        if op.body is not None:
            schema = op.body.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in schema.pop("$defs", {}).items():
                schemas[name] = sub
            schemas[op.body.__name__] = schema
            entry["requestBody"] = {"required": not op.body_optional, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{op.body.__name__}"}}}}
        if op.upload:
            entry["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": {
                "type": "object", "required": ["file"],
                "properties": {"file": {"type": "string", "format": "binary"}}}}}}
        paths.setdefault(op.path, {})[op.method] = entry
    return {
        "openapi": "3.1.0",
        "info": {"title": "petal-dispatch", "version": version,
                 "description": "REST actions and reads, and the SSE stream (docs/api.md)."},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {
            "proxy": {"type": "apiKey", "in": "header", "name": "X-Authentik-Username"},
            "token": {"type": "http", "scheme": "bearer"}}},
    }
