"""The ingress's record of questions seen asked: only `question.asked` with a readable id, bounded."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from ingress.asked import KEEP_BYTES, Asked
from shared.models import Event


def _event(seq: int, event_type: str, payload: Any) -> Event:
    return Event(event_id=uuid.uuid4(), seq=seq, project_id=None, session_id=None, task_id=None, parent_id=None,
                 message_id=None, event_type=event_type, tier="raw", created_at=datetime.now(UTC), payload=payload)


def test_kept_by_id_only_and_the_oldest_leave_first() -> None:
    asked = Asked(limit=2)
    ids = [uuid.uuid4() for _ in range(3)]
    asked.saw([_event(1, "question.asked", {"question_id": str(ids[0]), "questions": [{"question": "a"}],
                                            "tool_use_id": "toolu_a"}),
               _event(2, "question.answered", {"question_id": str(ids[1]), "questions": [{"question": "x"}]}),
               _event(3, "question.asked", {"question_id": "not a uuid", "questions": []}),
               _event(4, "question.asked", {"question_id": str(ids[1]), "questions": "not a list"}),
               _event(5, "question.asked", ["not", "a", "dict"])])
    assert asked.get(str(ids[0])) == (ids[0], [{"question": "a"}])
    assert asked.get(str(ids[0]).upper()) == (ids[0], [{"question": "a"}])
    assert asked.get("toolu_a") is None and asked.get(str(ids[1])) is None and len(asked) == 1
    asked.saw([_event(6 + i, "question.asked", {"question_id": str(q), "questions": []}) for i, q in enumerate(ids[1:])])
    assert len(asked) == 2 and asked.get(str(ids[0])) is None and asked.get(str(ids[2])) == (ids[2], [])


def test_a_question_larger_than_the_bound_is_not_kept_it_is_answered_the_reading_way() -> None:
    asked = Asked()
    big, small = uuid.uuid4(), uuid.uuid4()
    huge = [{"question": "q", "options": [{"label": "a", "description": "d", "preview": "x" * (KEEP_BYTES + 1)}]}]
    asked.saw([_event(1, "question.asked", {"question_id": str(big), "questions": huge}),
               _event(2, "question.asked", {"question_id": str(small), "questions": [{"question": "q"}]})])
    assert asked.get(str(big)) is None and asked.get(str(small)) == (small, [{"question": "q"}])
