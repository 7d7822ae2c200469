"""The base of the harness tools' typed results.

A tool returning one of these gets an `outputSchema` from the model, and its `structuredContent` and its
text block are the model's JSON. Fields left None are left out of both, as the CLI and the model saw
them before the results were typed (an absent `response`, not `"response": null`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer


class Result(BaseModel):
    @model_serializer(mode="wrap")
    def _without_nones(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        return {k: v for k, v in dumped.items() if v is not None}
