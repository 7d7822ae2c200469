"""Checking an answer against the question it answers (pure: no I/O)."""

from __future__ import annotations

from typing import Any

from ingress.models import AnswerIn, Other
from ingress.problems import Problem


def _one(question: str, labels: set[str], value: str | Other) -> str:
    if isinstance(value, Other):
        return value.other
    if value not in labels:
        raise Problem(422, f"{value!r} is not an option of {question!r}; free text goes in {{\"other\": ...}}",
                      options=sorted(labels))
    return value


def normalise(questions: list[dict[str, Any]], body: AnswerIn) -> dict[str, str | list[str]]:
    """The answers in the tool's output shape ({question text: label or [labels]}), or a 422."""
    by_text = {q.get("question"): q for q in questions if isinstance(q, dict)}
    answers: dict[str, str | list[str]] = {}
    for text, value in (body.answers or {}).items():
        q = by_text.get(text)
        if q is None:
            raise Problem(422, f"no question {text!r} in this ask", questions=sorted(t for t in by_text if t))
        answers[text] = _answer(text, q, value)
    if body.response is None:
        missing = [t for t in by_text if t not in answers]
        if missing:
            raise Problem(422, f"unanswered: {missing[0]!r} (answer every question, or give a response)")
    return answers


def _answer(text: str, question: dict[str, Any], value: str | Other | list[str | Other]) -> str | list[str]:
    """One question's answer: a label (or the "Other" text), or for a multi-select a list of distinct ones."""
    labels: set[str] = {o["label"] for o in question.get("options", [])
                        if isinstance(o, dict) and isinstance(o.get("label"), str)}
    if not question.get("multiSelect"):
        if isinstance(value, list):
            raise Problem(422, f"{text!r} is single-select: answer with one label, not a list")
        return _one(text, labels, value)
    if not isinstance(value, list) or not value:
        raise Problem(422, f"{text!r} is multi-select: answer with a non-empty list")
    picked = [_one(text, labels, v) for v in value]
    if len(set(picked)) != len(picked):
        raise Problem(422, f"{text!r}: an option is chosen twice")
    return picked
