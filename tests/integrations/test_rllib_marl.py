"""RLlib, unmodified, trains simpop/PersuasionAct-v0: both seats, and the policy seat against a population, on the
real ``ray[rllib]`` in its own ``.venv-rllib`` (``make rllib-env``; RLlib pins gymnasium 1.2.2), run as a subprocess
with these sources on the path.

Decision rule, the TorchRL route's (``simpop.integrations.marl_ppo.gain``, 300 fixed seeds): a seat learned if it
beats a uniformly random seat by more than 2 SE, each facing a frozen opponent: the policy seat the frozen final user
of its run (alone: the reference persuadee); the user seat, facing a random persuader, by its
``KL(user || reference)`` per turn.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from simpop.integrations.marl_ppo import gain
from tests.integrations.conftest import doc_example, run_in


def test_the_rule_is_a_gain_of_more_than_two_standard_errors():
    better, worse = np.array([1.0, 1.0, 0.0, 1.0]), np.array([0.0, 0.0, 1.0, 0.0])
    small = gain(better, worse)
    assert small.difference == pytest.approx(0.5) and small.se == pytest.approx(np.sqrt(2 * 0.25 / 4))
    assert not small.learned and str(small) == "+0.500 (SE 0.354, NOT learned)"
    large = gain(np.tile(better, 25), np.tile(worse, 25))  # the same gain, a fifth of the SE
    assert large.difference == pytest.approx(0.5) and large.learned


VIEW_CHECK = """
import json, numpy as np, simpop
from simpop.integrations.marl import MarlView
from simpop.integrations.rllib_marl import RLlibView, _solo_env
from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv

kwargs = {"max_turns": 1}
raw = MarlView(simpop.make("simpop/PersuasionAct-v0", **kwargs), realism="persuadee")
env = ParallelPettingZooEnv(RLlibView(MarlView(simpop.make("simpop/PersuasionAct-v0", **kwargs), realism="persuadee")))
out = {"spaces": [str(env.observation_space["persuadee"]), str(env.observation_space["persuader"])], "steps": []}
raw_obs, raw_infos = raw.reset(seed=3)
obs, infos = env.reset(seed=3)
while True:
    seat = raw.dialogue.to_act
    action = int(np.flatnonzero(raw_infos[seat]["action_mask"])[0])
    user = obs["persuadee"]
    out["steps"].append({"mask_matches": bool(np.array_equal(user["action_mask"], raw_infos["persuadee"]["action_mask"])),
                         "obs_matches": bool(np.array_equal(user["observations"], raw_obs["persuadee"]))
                         and bool(np.array_equal(obs["persuader"], raw_obs["persuader"]))})
    actions = {s: (action if s == seat else 0) for s in raw.agents}
    raw_obs, _, raw_term, raw_trunc, raw_infos = raw.step(actions)
    obs, rewards, term, trunc, infos = env.step(actions)
    if raw_term["persuader"] or raw_trunc["persuader"]:
        out["end"] = {"raw": [raw_term["persuader"], raw_trunc["persuader"]], "rllib": [term["__all__"], trunc["__all__"]]}
        break
solo = _solo_env({"env_id": "simpop/PersuasionAct-v0", "env_kwargs": kwargs, "population": "persuadee"})
solo.reset(seed=3)
ends = []
for _ in range(4):
    _, _, terminated, truncated, _ = solo.step(0)
    ends.append([terminated, truncated])
    if terminated or truncated:
        break
out["solo"] = ends
"""

#: Bad command lines of ``python -m simpop.integrations.rllib_marl`` (its ``main``), and the word the one-line error
#: must name.
BAD_ARGUMENTS = {"iterations": (["both", "--iterations", "0"], "--iterations"),
                 "population": (["solo", "--population", "persuadee", "nonsense"], "nonsense")}

CLI_CHECK = """
import contextlib, io
from simpop.integrations.rllib_marl import main
out["cli"] = {}
for name, argv in BAD_ARGUMENTS.items():
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
    out["cli"][name] = {"code": code, "stderr": stderr.getvalue()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def checks(rllib_python) -> dict:
    """One interpreter in RLlib's environment (importing Ray takes seconds) for the view check and the command
    lines: ``VIEW_CHECK``'s figures and, under ``"cli"``, each bad command line's exit code and stderr."""
    script = VIEW_CHECK + f"BAD_ARGUMENTS = {json.dumps({k: v[0] for k, v in BAD_ARGUMENTS.items()})}\n" + CLI_CHECK
    result = run_in(rllib_python, "-c", script, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_rllib_reads_the_user_mask_from_its_observation_and_the_turn_cap_as_an_end(checks):
    out = checks
    user_space, policy_space = out["spaces"]
    assert user_space.startswith("Dict('action_mask': Box(0.0, 1.0, (161,)") and policy_space.startswith("Box(")
    assert out["steps"] and all(step["mask_matches"] and step["obs_matches"] for step in out["steps"])
    # One exchange (max_turns=1) ends undecided at the cap: MarlView truncates, RLlib sees a termination.
    assert out["end"] == {"raw": [False, True], "rllib": [True, False]}
    assert out["solo"][-1] == [True, False]


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_bad_arguments_get_one_line_and_exit_code_2(checks, case):
    result, named = checks["cli"][case], BAD_ARGUMENTS[case][1]
    assert result["code"] == 2 and named in result["stderr"].strip().splitlines()[-1]
    assert "Traceback" not in result["stderr"]


def test_the_documented_example_trains_both_seats_and_the_policy_seat_alone(rllib_python):
    report = "\nimport json\nprint(json.dumps({'policy': policy, 'realism': realism, 'alone': alone}))\n"
    result = run_in(rllib_python, "-c", "import torch; torch.set_num_threads(1)\n" + doc_example("rllib_marl import")
                    + report, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.splitlines()[-1])
    print(figures)
    for name, (difference, se) in figures.items():
        assert difference > 2 * se, f"{name}: {difference:+.3f} is not above 2 SE ({se:.3f})"
