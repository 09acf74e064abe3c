"""Tau2Env: turn flow, tool calls, both seats' views, termination rules and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from simpop.envs.dialogue import parse_observation
from simpop.envs.tau2.env import Tau2Env
from simpop.envs.tau2.simulators import TRANSFER_MESSAGE, ScriptedUser

CREATE = '{"name": "create_task", "arguments": {"user_id": "user_1", "title": "Important Meeting"}}'


def start(task_id: str, domain: str = "mock", **kwargs) -> Tau2Env:
    env = Tau2Env(domain=domain, **kwargs)
    env.reset(seed=0, options={"scenario_id": task_id})
    return env


def act(env: Tau2Env, action: str):
    """Step the seat whose turn it is; return (its observation, reward, terminated, truncated, its info)."""
    seat = env.to_act
    obs, rewards, terms, truncs, infos = env.step({seat: action})
    return parse_observation(obs[seat]), rewards[seat], terms[seat], truncs[seat], infos[seat]


def test_registering_ids_does_not_import_tau2():
    code = "import sys, simpop; assert 'simpop/Tau2-airline-v0' in simpop.ids(); assert 'tau2' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_user_opens_after_greeting_and_agent_tool_calls_stay_private():
    env = start("create_task_1")
    assert env.to_act == "user" and env.transcript[0].text == "Hi! How can I help you today?"
    act(env, "Please create a task called 'Important Meeting' for user_1.")
    view, *_ = act(env, CREATE)
    assert env.to_act == "agent"  # a tool call keeps the turn
    assert view["messages"][-1]["role"] == "tool" and '"title": "Important Meeting"' in view["messages"][-1]["content"]
    assert view["messages"][-2] == {"role": "assistant", "content": CREATE}
    assert view["instructions"].startswith("<instructions>") and "create_task" in view["instructions"]
    assert {t["function"]["name"] for t in view["tools"]} >= {"create_task", "transfer_to_human_agents", "done"}
    act(env, "Your task has been created.")
    user_view = parse_observation(env._observe("user"))
    assert [m["role"] for m in user_view["messages"]] == ["user", "assistant", "user"]
    assert user_view["messages"][-1]["content"] == "Your task has been created." and user_view["tools"] == []
    assert user_view["instructions"] == env.scenario.user_instructions()
    _, reward, terminated, _, info = act(env, "Thanks! ###STOP###")
    assert terminated and reward == 1.0 and info["success"]
    assert info["termination_reason"] == "user_stop" and info["reward_breakdown"] == {"DB": 1.0, "COMMUNICATE": 1.0}
    assert info["db_match"] is True and info["actions_matched"] == [True]


def test_wrong_tool_arguments_change_the_reward_not_the_flow():
    env = start("create_task_1")
    act(env, "Create a task please.")
    act(env, '{"name": "create_task", "arguments": {"user_id": "user_1", "title": "Other"}}')
    act(env, "Done.")
    _, reward, terminated, _, info = act(env, "###STOP###")
    assert terminated and reward == 0.0 and info["db_match"] is False and not info["success"]


def test_user_sees_its_greeting_and_task_history_turns():
    env = start("update_task_with_message_history")
    assert env.to_act == "user" and env.transcript[1].data["tool_calls"][0]["name"] == "create_task"
    agent_view = parse_observation(env._observe("agent"))
    assert [m["role"] for m in agent_view["messages"]] == ["user", "assistant", "tool", "assistant"]
    user_view = parse_observation(env._observe("user"))
    assert [m["role"] for m in user_view["messages"]] == ["assistant", "user"]


@pytest.mark.parametrize("action, why", [
    ('{"name": "create_task", "arguments": "{title: x}"}', "not valid JSON"),
    ('{"name": "create_task", "arguments": ["user_1"]}', "must be a JSON object"),
    ('{"name": "create_task", "arguments": {"user_id": ', "not valid JSON"),
    ("<tool_call>create_task(user_id='user_1')</tool_call>", "not valid JSON"),
    ("", "empty"),
    ("   ", "empty"),
    ("x" * 9000, "too long"),
])
def test_bad_agent_actions_are_rejected_and_the_agent_acts_again(action, why):
    env = start("create_task_1")
    act(env, "Hello")
    view, reward, terminated, truncated, info = act(env, action)
    assert why in info["invalid_action"] and why in view["error"]
    assert env.to_act == "agent" and not (terminated or truncated) and len(env.transcript) == 2
    view, *_ = act(env, "How can I help?")
    assert view["error"] is None and env.to_act == "user"


def test_unknown_tool_and_bad_arguments_return_tau2_errors_and_end_at_max_errors():
    env = start("create_task_1", max_errors=3)
    act(env, "Hello")
    view, _, terminated, _, info = act(env, '{"name": "fly_to_moon", "arguments": {}}')
    assert view["messages"][-1] == {"role": "tool", "name": "fly_to_moon",
                                    "content": "Error: Tool 'fly_to_moon' not found."}
    assert info["tool_errors"] == ["Error: Tool 'fly_to_moon' not found."] and not terminated
    view, _, terminated, _, info = act(env, '{"name": "create_task", "arguments": {"color": "red"}}')
    assert view["messages"][-1]["content"].startswith("Error:") and not terminated
    _, reward, terminated, _, info = act(env, '{"name": "get_users", "arguments": {"x": 1}}')
    assert terminated and reward == 0.0
    assert info["termination_reason"] == "too_many_errors" and info["num_tool_errors"] == 3


def test_openai_style_message_with_two_calls_runs_both():
    env = start("create_task_1")
    act(env, "Hello")
    call = {"type": "function", "function": {"name": "create_task",
                                             "arguments": json.dumps({"user_id": "user_1", "title": "A"})}}
    view, *_ = act(env, json.dumps({"role": "assistant", "content": None, "tool_calls": [call, call]}))
    assert [m["role"] for m in view["messages"][-2:]] == ["tool", "tool"]
    assert [json.loads(m["content"])["task_id"] for m in view["messages"][-2:]] == ["task_2", "task_3"]


def test_empty_user_replies_end_the_episode_with_user_error():
    env = start("create_task_1", max_user_errors=3)
    for _ in range(2):
        _, _, terminated, _, info = act(env, "")
        assert "empty" in info["invalid_action"] and not terminated and env.to_act == "user"
    _, reward, terminated, _, info = act(env, " ")
    assert terminated and reward == 0.0 and info["termination_reason"] == "user_error" and info["user_errors"] == 3


def test_repeated_user_replies_end_the_episode_with_user_error():
    env = start("create_task_1", max_user_repeats=3)
    for _ in range(2):
        act(env, "I need a task.")
        _, _, terminated, _, _ = act(env, "Could you say more?")
        assert not terminated
    _, reward, terminated, _, info = act(env, "I need a task.")
    assert terminated and reward == 0.0
    assert info["user_repeats"] == 3 and info["termination_reason"] == "user_error"


def test_varied_user_replies_do_not_end_the_episode():
    env = start("create_task_1", max_user_repeats=2, max_steps=9)
    for i in range(4):
        act(env, f"Message {i}")
        act(env, "Go on.")
    _, _, terminated, truncated, info = act(env, "Message 4")
    assert truncated and not terminated and info["termination_reason"] == "max_steps" and info["reward"] == 0.0


@pytest.mark.parametrize("action", ['{"name": "done", "arguments": {}}', "All set. ###STOP###"])
def test_agent_ends_with_done_or_stop_token(action):
    env = start("create_task_1")
    act(env, "Hello")
    act(env, CREATE)
    _, reward, terminated, _, info = act(env, action)
    assert terminated and info["termination_reason"] == "agent_stop" and reward == 1.0


def test_transfer_ends_through_the_users_transfer_token():
    env = start("impossible_task_1")
    user = ScriptedUser()
    user.reset(env.scenario, env.user_rng())
    act(env, user.act(env._observe("user")))
    act(env, '{"name": "transfer_to_human_agents", "arguments": {"summary": "Wants to delete all tasks."}}')
    act(env, TRANSFER_MESSAGE)
    _, reward, terminated, _, info = act(env, user.act(env._observe("user")))
    assert env.transcript[-1].text == "###TRANSFER###"
    assert terminated and reward == 1.0 and info["reward_breakdown"] == {"DB": 1.0, "ACTION": 1.0}


def test_telecom_user_tools_run_on_the_users_device_and_stay_private():
    env = start(Tau2Env(domain="telecom").scenario_ids()[0], domain="telecom")
    view = parse_observation(env._observe("user"))
    assert "toggle_airplane_mode" in {t["function"]["name"] for t in view["tools"]}
    assert "toggle_airplane_mode" in view["instructions"] and "<tool_call>" in view["instructions"]
    act(env, "My mobile data does not work.")
    act(env, "Please check your status bar.")
    view, *_ = act(env, '<tool_call>{"name": "check_status_bar", "arguments": {}}</tool_call>')
    assert env.to_act == "user" and view["messages"][-1]["role"] == "tool"
    assert "Status Bar" in view["messages"][-1]["content"] or "status" in view["messages"][-1]["content"].lower()
    act(env, "It shows airplane mode.")
    agent_view = parse_observation(env._observe("agent"))
    assert "check_status_bar" not in json.dumps(agent_view["messages"])
    assert agent_view["messages"][-1] == {"role": "user", "content": "It shows airplane mode."}


def test_users_without_tools_send_json_as_text():
    env = start("create_task_1")
    act(env, '{"name": "create_task", "arguments": {}}')
    assert env.to_act == "agent" and "tool_calls" not in env.transcript[-1].data


def test_splits_come_from_tau2_split_files():
    train, test = Tau2Env("airline", split="train").scenario_ids(), Tau2Env("airline", split="test").scenario_ids()
    assert len(train) == 30 and len(test) == 20 and not set(train) & set(test)
    assert sorted(train + test, key=int) == sorted(Tau2Env("airline").scenario_ids(), key=int)
    with pytest.raises(ValueError, match="no task split 'train'.*split=None"):
        Tau2Env("mock", split="train")
    with pytest.raises(ValueError, match="unknown τ² domain"):
        Tau2Env("banking")


def test_bad_constructor_arguments_say_what_to_pass():
    with pytest.raises(ValueError, match="max_user_repeats must be >= 2"):
        Tau2Env("mock", max_user_repeats=1)
    with pytest.raises(ValueError, match="max_errors must be >= 1"):
        Tau2Env("mock", max_errors=0)
