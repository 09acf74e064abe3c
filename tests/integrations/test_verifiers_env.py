"""simpop as a verifiers v1 environment, on the real ``verifiers`` package in its own ``.venv-verifiers``.

Both seats are verifiers agents on OpenAI-compatible endpoints served by ``simpop serve`` (loopback, one backend
behind two servers: the one-layer ``tiny_model``, since what is tested is the plumbing, not the replies); each
episode runs in the verifiers environment as a subprocess.
"""

from __future__ import annotations

import json

import pytest

from simpop.agents import load_backend
from simpop.envs.persuasion import SURVEY
from simpop.serve.server import make_server
from tests.integrations.conftest import doc_example, run_in


@pytest.fixture(scope="module")
def endpoints(one_torch_thread_module, tiny_model):
    backend = load_backend(f"transformers:{tiny_model}")
    with make_server(backend, port=0, model_name="policy").start() as policy, \
            make_server(backend, port=0, model_name="user").start() as user:
        yield policy.url, user.url


@pytest.fixture(scope="module")
def one_torch_thread_module():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def play(python, endpoints, *extra):
    policy_url, user_url = endpoints
    result = run_in(python, "-m", "simpop.integrations.verifiers_env", "--policy-url", policy_url, "--user-url",
                    user_url, "--env-kwargs",
                    '{"max_turns": 1}', "--max-tokens", "24", *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = result.stdout.splitlines()
    return json.loads(line)


def text(message):
    content = message["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


def test_both_seats_play_a_p4g_episode_through_verifiers(verifiers_python, endpoints):
    episode = play(verifiers_python, endpoints)
    assert episode["ok"] and not episode["errors"]
    policy, user = episode["traces"]["policy"], episode["traces"]["user"]
    info = policy["simpop"]
    assert info == {**user["simpop"], "seat": "persuader"} and user["simpop"]["seat"] == "persuadee"
    transcript = info["transcript"]
    # One exchange (max_turns=1), then the closing survey, unless the persuadee decided in the dialogue.
    assert [t["seat"] for t in transcript] == ["persuader", "persuadee"] and info["invalid_actions"] == 0
    assert info["outcome_source"] in ("survey", "decided_in_dialogue")
    # Each agent's chat is the env's view of its seat: its instructions, then the other seat's words.
    policy_chat, user_chat = policy["messages"], user["messages"]
    assert policy_chat[0]["role"] == "system" and "Save the Children" in text(policy_chat[0])
    assert text(policy_chat[1]).startswith("(The conversation starts now")
    assert text(policy_chat[2]).strip() == transcript[0]["text"]
    assert user_chat[0]["role"] == "system" and text(user_chat[1]) == transcript[0]["text"]
    assert text(user_chat[2]).strip() == transcript[1]["text"]
    if info["outcome_source"] == "survey":
        assert text(user_chat[3]) == SURVEY.question and len(user_chat) == 5
    # Rewards and metrics went through the traces; the frozen user is not trained.
    donated = float(info["donation"] > 0)
    assert policy["rewards"] == {"outcome": donated} and policy["reward"] == donated
    assert user["rewards"] == {"outcome": 0.0}
    assert policy["metrics"]["turns"] == 2 and policy["metrics"]["donated"] == donated
    assert policy["trainable"] is True and user["trainable"] is False


def test_a_trainable_simulator_kind_makes_the_user_agent_trainable(verifiers_python, endpoints, tiny_model):
    episode = play(verifiers_python, endpoints, "--user-simulator", f"trainable:{tiny_model}")
    assert episode["ok"] and episode["traces"]["user"]["trainable"] is True


def test_the_documented_python_example_runs(verifiers_python, endpoints):
    policy_url, user_url = endpoints
    code = doc_example("env_config(").replace("http://127.0.0.1:8001/v1", policy_url)
    result = run_in(verifiers_python, "-c", code.replace("http://127.0.0.1:8002/v1", user_url))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() in ("{'outcome': 0.0}", "{'outcome': 1.0}"), result.stdout


BAD = [
    (["--env-kwargs", "[1]"], "--env-kwargs must be a JSON object"),
    (["--env", "simpop/PersuasionAct-v0"], "is not a text env"),
    (["--env", "simpop/Nope-v0"], "unknown env id"),
    (["--env-kwargs", '{"bogus": 1}'], "unknown argument(s) bogus"),
    (["--user-simulator", "nonsense-kind"], "unknown simulator kind"),
]


def test_bad_input_is_one_line_and_exit_2(verifiers_python):
    code = f"""
import contextlib, io, json
from simpop.integrations.verifiers_env import main
results = []
for args in {[args for args, _ in BAD]!r}:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        results.append([main(["--policy-url", "http://127.0.0.1:9/v1", "--user-url", "http://127.0.0.1:9/v1", *args]),
                        err.getvalue()])
print(json.dumps(results))
"""
    result = run_in(verifiers_python, "-c", code, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for (args, message), (status, stderr) in zip(BAD, json.loads(result.stdout), strict=True):
        assert status == 2 and message in stderr and len(stderr.strip().splitlines()) == 1, (args, stderr)
