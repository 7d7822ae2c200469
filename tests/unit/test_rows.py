"""Store rows (shared/query.py FromRow): a frozen dataclass made from the columns its fields name."""

from __future__ import annotations

import uuid

import pytest

from executor.run.task_rows import StopRequest
from tests.fake_queries import FakeWork


def test_a_row_takes_the_columns_its_fields_name_and_leaves_the_others() -> None:
    stop_id, task_id = uuid.uuid4(), uuid.uuid4()
    made = StopRequest.from_row({"id": stop_id, "task_id": task_id, "reason": None, "claimed_by": "vm"})
    assert made == StopRequest(id=stop_id, task_id=task_id, reason=None)
    with pytest.raises(KeyError, match="task_id"):
        StopRequest.from_row({"id": stop_id, "reason": None})
    with pytest.raises(AttributeError):
        made.reason = "changed"  # type: ignore[misc]


async def test_the_fake_query_layer_makes_rows_as_the_real_one_does() -> None:
    row = {"id": uuid.uuid4(), "task_id": uuid.uuid4(), "reason": "asked", "extra": 1}
    unit = FakeWork({"claim_stop_requests": [row]})
    assert await unit.all("claim_stop_requests", {"name": "vm"}, into=StopRequest) == [StopRequest.from_row(row)]
