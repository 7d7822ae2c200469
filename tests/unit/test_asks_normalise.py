"""An answer checked against the question it answers (ingress/asks.py `normalise`): the tool's output shape, or a
422 naming what is wrong."""

from __future__ import annotations

from typing import Any

import pytest

from ingress.asks import normalise
from ingress.models import AnswerIn
from ingress.problems import Problem

COLOUR = {"question": "Colour?", "options": [{"label": "red"}, {"label": "blue"}]}
TOPPINGS = {"question": "Toppings?", "multiSelect": True,
            "options": [{"label": "cheese"}, {"label": "olives"}, {"label": 7}, "not an option"]}
QUESTIONS: list[dict[str, Any]] = [COLOUR, TOPPINGS]


def _answer(answers: dict[str, Any] | None = None, response: str | None = None) -> AnswerIn:
    return AnswerIn.model_validate({"answers": answers, "response": response})


def _refused(questions: list[dict[str, Any]], body: AnswerIn) -> Problem:
    with pytest.raises(Problem) as caught:
        normalise(questions, body)
    assert caught.value.status == 422
    return caught.value


def test_every_question_answered_gives_the_tools_shape() -> None:
    body = _answer({"Colour?": "red", "Toppings?": ["olives", {"other": "basil"}]})
    assert normalise(QUESTIONS, body) == {"Colour?": "red", "Toppings?": ["olives", "basil"]}


def test_other_text_stands_for_a_label_in_a_single_select() -> None:
    assert normalise([COLOUR], _answer({"Colour?": {"other": "green"}})) == {"Colour?": "green"}


def test_a_label_that_is_no_option_is_refused_with_the_options() -> None:
    problem = _refused([COLOUR], _answer({"Colour?": "green"}))
    assert "'green' is not an option of 'Colour?'" in problem.detail
    assert problem.extra == {"options": ["blue", "red"]}


def test_only_string_labels_of_dict_options_count() -> None:
    problem = _refused([TOPPINGS], _answer({"Toppings?": ["7"]}))
    assert problem.extra == {"options": ["cheese", "olives"]}


def test_an_unknown_question_is_refused_naming_the_asked_ones() -> None:
    problem = _refused([COLOUR, "not a question"], _answer({"Size?": "big"}))  # type: ignore[list-item]
    assert problem.detail == "no question 'Size?' in this ask"
    assert problem.extra == {"questions": ["Colour?"]}


@pytest.mark.parametrize("value,detail", [
    ("cheese", "'Toppings?' is multi-select: answer with a non-empty list"),
    ([], "'Toppings?' is multi-select: answer with a non-empty list"),
    (["cheese", "cheese"], "'Toppings?': an option is chosen twice"),
    (["cheese", {"other": "cheese"}], "'Toppings?': an option is chosen twice"),
])
def test_a_multi_select_takes_a_non_empty_list_of_distinct_options(value: Any, detail: str) -> None:
    assert _refused([TOPPINGS], _answer({"Toppings?": value})).detail == detail


def test_a_single_select_takes_one_label_not_a_list() -> None:
    problem = _refused([COLOUR], _answer({"Colour?": ["red"]}))
    assert problem.detail == "'Colour?' is single-select: answer with one label, not a list"


def test_a_question_left_unanswered_is_refused_unless_a_response_dismisses_the_ask() -> None:
    assert _refused(QUESTIONS, _answer({"Colour?": "blue"})).detail.startswith("unanswered: 'Toppings?'")
    assert normalise(QUESTIONS, _answer({"Colour?": "blue"}, response="later")) == {"Colour?": "blue"}
    assert normalise(QUESTIONS, _answer(response="not now")) == {}
