"""Verbalized sampling with the embedded SmolLM2 (slow): constrained answers always parse."""

from __future__ import annotations

import numpy as np
import pytest

import simpop
from simpop.agents.base import SamplingParams
from simpop.evaluation.audit import HISTORIES, observation_for
from simpop.simulators.verbalized import FORMAT_REPAIRS, VerbalizedSimulator



@pytest.fixture(scope="module")
def setting(smollm2):
    env = simpop.make("simpop/Persuasion-v0")
    observations = [observation_for(env, h, env.scenario_ids()[0], seed=0) for h in HISTORIES[-2:]]
    return smollm2, env.scenario, observations


def run(backend, scenario, observations, **kwargs):
    sim = VerbalizedSimulator(backend, k=2, params=SamplingParams(max_new_tokens=64), fallback_max_new_tokens=8,
                              **kwargs)
    sim.reset_batch([scenario] * 4, [np.random.default_rng(i) for i in range(4)])
    replies = sim.act_batch([observations[0], observations[1]] * 2, [0, 1, 2, 3])
    return sim, replies


def test_constrained_answers_of_smollm2_parse_without_fallback_or_repair(setting):
    sim, replies = run(*setting)
    assert sim.stats["calls"] == 4 and sim.stats["fallbacks"] == 0 and sim.stats["format_repairs"] == 0
    assert not any(sim.stats.get(f"repair:{key}") for key in FORMAT_REPAIRS)
    assert all(isinstance(r, str) and 1 <= len(r) <= sim.schema["properties"]["responses"]["items"]["properties"]
               ["text"]["maxLength"] for r in replies)
    plain, _ = run(*setting, constrained=False)  # the same prompt without the schema: SmolLM2 writes prose
    assert plain.fallback_rate > sim.fallback_rate
