"""``simpop eval`` and the rollout engine under abuse and carelessness: wrong-length policy batches, torn and odd
records on resume, shared and foreign --out folders, panel specs checked at setup, one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

import simpop
from simpop.rollout import Job, RolloutEngine
from simpop.simulators.registry import build_simulator

ENV = "simpop/PersuasionAct-v0"
KWARGS = {"max_turns": 4}


class Miscounting:
    """An act-level policy returning ``extra`` more (or fewer) actions than it was asked for."""

    def __init__(self, extra: int):
        self.extra = extra

    def act_batch(self, observations, rng):
        return [0] * max(0, len(observations) + self.extra)


@pytest.mark.parametrize("extra", [1, -1])
def test_a_policy_batch_of_the_wrong_length_is_an_error_not_truncated(extra):
    env = simpop.make(ENV, **KWARGS)
    engine = RolloutEngine(lambda: simpop.make(ENV, **KWARGS), Miscounting(extra), build_simulator("native", env),
                           n_envs=2)
    with pytest.raises(ValueError, match=rf"returned {2 + extra} action\(s\) for 2 observation"):
        engine.run([Job(s, 0, i) for i, s in enumerate(env.scenario_ids()[:2])], np.random.default_rng(0))


def test_resume_drops_a_line_torn_inside_a_multibyte_character_and_records_of_the_wrong_types(tmp_path):
    from simpop.evaluation.eval_run import EPISODES, read_records
    from tests.evaluation.test_eval_run import run

    whole = run(tmp_path, episodes=3)
    path = tmp_path / EPISODES
    lines = path.read_bytes().splitlines(keepends=True)
    record = lines[-1].decode()
    bad_reward = record.replace('"reward": ', '"reward": "lots", "was": ', 1).encode()
    torn = "é".encode() + "€ …".encode()[:2]  # ends inside the euro sign's three bytes
    path.write_bytes(b"".join(lines[:-1]) + bad_reward + b'{"member": "native", "text": "' + torn)
    assert len(read_records(path)) == len(lines) - 1
    resumed = run(tmp_path, episodes=3, resume=True)
    assert resumed == whole and len(read_records(path)) == len(lines)
