"""The questions this ingress saw asked, so that an answer is checked without reading its row first.

A question's `questions` never change once asked (adoption matches them by equality; nothing updates the
column), and every `question.asked` record carries them with the question's id. The SSE broadcaster sees
each such record as it fans the journal out (the page learns of a question that way, before anyone can
answer it), and hands it here. What is kept is only a shortcut: the answer is still written by the one
conditional UPDATE, which alone decides whether it lands; a question not kept here (asked before this
process started, fallen out of the bound, or on a primary that lost it) goes the reading way.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import orjson

from shared.models import Event

# A question is kept until this many later ones were asked, and only one of at most KEEP_BYTES as JSON (its text and
# options are the spawn's: a harness call can bring megabytes); a larger one is answered the reading way.
LIMIT = 4096
KEEP_BYTES = 16 * 1024


class Asked:
    def __init__(self, limit: int = LIMIT):
        self.limit = limit
        self._questions: OrderedDict[uuid.UUID, list[dict[str, Any]]] = OrderedDict()

    def saw(self, events: Iterable[Event]) -> None:
        for e in events:
            if e.event_type != "question.asked" or not isinstance(e.payload, dict):
                continue
            questions = e.payload.get("questions")
            try:
                qid = uuid.UUID(str(e.payload.get("question_id")))
            except ValueError:
                continue
            if isinstance(questions, list) and len(orjson.dumps(questions)) <= KEEP_BYTES:
                self._questions[qid] = questions
                self._questions.move_to_end(qid)
                while len(self._questions) > self.limit:
                    self._questions.popitem(last=False)

    def get(self, ref: str) -> tuple[uuid.UUID, list[dict[str, Any]]] | None:
        """The question `ref` names by id and its questions, if it was seen asked (a tool_use_id is not kept:
        an adopted question's row takes no new one, so only the row can say which it answers to)."""
        try:
            qid = uuid.UUID(ref)
        except ValueError:
            return None
        questions = self._questions.get(qid)
        return None if questions is None else (qid, questions)

    def __len__(self) -> int:
        return len(self._questions)
