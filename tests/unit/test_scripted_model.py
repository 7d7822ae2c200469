"""The scripted model's scenario (petal_dispatch/demo/scripted_model.py): which rule answers a request, which reply of
it for the turn, and the Messages API shapes it answers with. No server is started."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from petal_dispatch.demo import scripted_model as sm
from petal_dispatch.demo.scripted_model import Rule, Scenario

pytestmark = pytest.mark.unit


def _body(system: Any = "", *messages: dict[str, Any]) -> dict[str, Any]:
    return {"system": system, "messages": list(messages)}


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def _tool_result(tool_use_id: str = "t") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": "done"}


def test_a_scenario_is_a_rule_list_a_role_map_or_rules_with_a_default() -> None:
    listed = Scenario.from_data([{"replies": [{"text": "a"}], "role": "worker"}])
    assert listed.rules == [Rule(replies=[{"text": "a"}], role="worker")] and listed.default == {"text": "ok"}
    by_role = Scenario.from_data({"worker": [{"text": "w"}], "orchestrator": [{"text": "o"}]})
    assert [(r.role, r.replies) for r in by_role.rules] == [("worker", [{"text": "w"}]), ("orchestrator", [{"text": "o"}])]
    full = Scenario.from_data({"rules": [{"replies": [{"text": "r"}], "match": "hello"}], "default": {"text": "d"}})
    assert full.rules[0].match == "hello" and full.default == {"text": "d"}


REPLY_KEYS = {"text", "delay_s", "usage", "tool_use", "error", "stall"}


def test_the_built_in_demo_scenario_answers_each_role_with_replies_of_known_kinds() -> None:
    data = json.loads(resources.files("petal_dispatch.demo").joinpath("scenario.json").read_text())
    scenario = Scenario.from_data(data)
    assert {r.role for r in scenario.rules} >= {"orchestrator", "worker", "extractor"}
    replies = [reply for rule in scenario.rules for reply in rule.replies]
    assert replies and all(set(reply) <= REPLY_KEYS for reply in replies), replies
    assert all("name" in reply["tool_use"] for reply in replies if "tool_use" in reply)


def test_the_first_rule_of_the_role_whose_matches_hold_answers() -> None:
    scenario = Scenario(rules=[Rule([{"text": "worker"}], role="worker"),
                               Rule([{"text": "greeting"}], match="hello"),
                               Rule([{"text": "follow-up"}], match_last="again"),
                               Rule([{"text": "any"}])])
    assert scenario.choose("worker", "hello", 0) == {"text": "worker"}
    assert scenario.choose("orchestrator", "say hello", 0) == {"text": "greeting"}
    assert scenario.choose(None, "first", 0, last_user_text="once again") == {"text": "follow-up"}
    assert scenario.choose("extractor", "first", 0, last_user_text="later") == {"text": "any"}


def test_a_rules_reply_is_chosen_by_the_turn_and_the_last_repeats() -> None:
    scenario = Scenario.single({"text": "0"}, {"text": "1"})
    assert [scenario.choose(None, "", turn)["text"] for turn in range(4)] == ["0", "1", "1", "1"]


def test_no_rule_or_a_rule_without_replies_gives_the_default() -> None:
    assert Scenario(rules=[Rule([], role="*")], default={"text": "d"}).choose("x", "", 0) == {"text": "d"}
    assert Scenario(rules=[Rule([{"text": "w"}], role="worker")]).choose("orchestrator", "", 0) == {"text": "ok"}


def test_a_rule_limited_to_n_conversations_serves_only_the_first_n_and_them_again() -> None:
    scenario = Scenario(rules=[Rule([{"text": "fail"}], sessions=1), Rule([{"text": "succeed"}])])
    assert scenario.choose(None, "", 0, session="s1") == {"text": "fail"}
    assert scenario.choose(None, "", 0, session="s2") == {"text": "succeed"}
    assert scenario.choose(None, "", 1, session="s1") == {"text": "fail"}  # the same conversation goes on with it


def test_a_request_names_its_role_first_user_text_and_turn() -> None:
    body = _body([{"type": "text", "text": "You are x. [petal-role: worker-2]"}],
                 _user("Do the thing"), {"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]},
                 _user([_tool_result(), _tool_result("u")]), _user([{"type": "text", "text": "and more"}]))
    assert sm.analyse(body) == ("worker-2", "Do the thing", 2)
    assert sm.last_user_text(body) == "and more"
    assert sm.analyse(_body("no marker", _user([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]))) == (
        None, "a\nb", 0)
    assert sm.analyse({}) == (None, "", 0) and sm.last_user_text({}) == ""


def test_what_reached_the_model_is_every_user_block_in_order() -> None:
    image = {"type": "image", "source": {"type": "base64", "data": "AAAA"}}
    request = sm.Request("/v1/messages", {}, _body("", _user("hi"), {"role": "assistant", "content": "x"},
                                                   _user([image, "not a block", _tool_result()])), None, 1)
    assert request.user_blocks == [{"type": "text", "text": "hi"}, image, _tool_result()]


def test_a_reply_becomes_a_message_whose_stop_reason_follows_its_blocks() -> None:
    text = sm._message(sm._blocks({"text": "hello"}))  # noqa: SLF001
    assert text["content"] == [{"type": "text", "text": "hello"}] and text["stop_reason"] == "end_turn"
    assert text["model"] == sm.MODEL and text["usage"] == {"input_tokens": 10, "output_tokens": 5}
    tool = sm._message(sm._blocks({"text": "let me", "tool_use": {"name": "Bash", "input": {"command": "ls"}}}),  # noqa: SLF001
                       {"output_tokens": 9000})
    assert [b["type"] for b in tool["content"]] == ["text", "tool_use"] and tool["stop_reason"] == "tool_use"
    assert tool["content"][1]["id"].startswith("toolu_") and tool["usage"]["output_tokens"] == 9000
    given = sm._blocks({"tool_use": {"name": "Read", "id": "toolu_fixed"}})  # noqa: SLF001
    assert given == [{"type": "tool_use", "id": "toolu_fixed", "name": "Read", "input": {}}]
    assert sm._blocks({}) == [{"type": "text", "text": ""}]  # noqa: SLF001 - never a message without content
