"""The JSON action language: canonical forms, lenient forms, errors."""

from __future__ import annotations

import pytest

from simpop.envs.cooperbench.actions import Action, ActionError, find_action, parse_action


def test_canonical_forms_round_trip():
    for action in (Action("message", text="hi"), Action("view", path="a.py"),
                   Action("write", path="a.py", content="x = 1\n"), Action("delete", path="a.py"),
                   Action("test"), Action("submit")):
        assert parse_action(action.to_json()) == action


def test_lenient_forms():
    assert parse_action("  Submit \n") == Action("submit")
    assert parse_action("test") == Action("test")
    assert parse_action('{"action": "view", "file": "x.py"}') == Action("view", path="x.py")
    assert parse_action('{"type": "message", "message": "hello"}') == Action("message", text="hello")
    fenced = 'Sure!\n```json\n{"type": "write", "path": "a.py", "content": "pass"}\n```\nDone.'
    assert parse_action(fenced) == Action("write", path="a.py", content="pass")


@pytest.mark.parametrize("text, message", [
    ("hello there", "expected one JSON object"),
    ('{"type": "dance"}', "unknown action type"),
    ('{"type": "write", "path": "a.py"}', '"content" string'),
    ('{"type": "view"}', '"path" string'),
    ('{"type": "message", "text": "  "}', "non-empty"),
    ("[1, 2]", "expected one JSON object"),
])
def test_errors_say_what_was_expected(text, message):
    with pytest.raises(ActionError, match=message):
        parse_action(text)


def test_find_action_in_free_text():
    assert find_action('I think {"type": "view", "path": "a.py"} is next') == Action("view", path="a.py")
    assert find_action('{"broken": } then {"type": "submit"}') == Action("submit")
    assert find_action("no action here {not json}") is None
