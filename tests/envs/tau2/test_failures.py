"""τ² user personas written from lost dialogues (simpop.envs.tau2.failures) as registered simulator specs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pytest

from simpop.envs.tau2 import failures
from simpop.envs.tau2.env import Tau2Env
from simpop.simulators.generation import DescriptionWriter, failure_model, generate
from simpop.simulators.population import Population
from simpop.simulators.registry import build_simulator, load_panel
from tests.simulators.fakes import FakeBackend


@dataclass
class Rec:
    member: str
    scenario: str
    success: bool
    transcript: list = field(default_factory=lambda: [{"seat": "agent", "text": "How can I help?"},
                                                      {"seat": "user", "text": "Cancel it NOW."}])


def writes(chat, params, rng):
    return json.dumps([f"You are an impatient customer #{i} who interrupts and demands a manager." for i in range(6)])


def test_written_user_personas_are_registered_specs_that_round_trip_and_stay_held_out(tmp_path):
    env = Tau2Env(domain="mock")
    backends = {"smollm2": FakeBackend(name="smollm2")}
    tasks = env.scenario_ids()
    records = [Rec("probe", tasks[0], False), Rec("probe", tasks[-1], True)]
    panel = load_panel({"name": "heldout", "members": {"u": "frozen:other-llm?temperature=0.7"}}, env,
                       {"other-llm": FakeBackend(name="other-llm")})
    pool = Population([build_simulator("frozen:smollm2?temperature=1.0", env, backends)])
    model = failure_model(env, DescriptionWriter(FakeBackend(respond=writes)))
    result = generate(model, records, pool, env, count=2, panel=panel, backends=backends, rng=np.random.default_rng(0))
    assert len(result.added) == 2 and not result.rejected and result.stats["written"] == 4
    for simulator in result.added:
        spec = simulator.spec
        assert build_simulator(str(spec), env, backends).spec == spec
        personas = env.persona_set(spec.personas)
        assert len(personas) == 2 and all("impatient customer" in p for p in personas)
        simulator.reset_batch([env.load_scenario(tasks[0])], [np.random.default_rng(0)])
        assert "impatient customer" in simulator.scenario(0).user_instructions()
    failures.save_written(tmp_path / "w.json")
    assert set(failures.load_written(tmp_path / "w.json")) >= {s.spec.personas for s in result.added}


def test_no_writer_or_an_unparsable_answer_proposes_nothing_and_counts_it():
    env = Tau2Env(domain="mock")
    backends = {"smollm2": FakeBackend(name="smollm2")}
    pool = Population([build_simulator("frozen:smollm2?temperature=1.0", env, backends)])
    lost = [Rec("probe", env.scenario_ids()[0], False)]
    assert generate(failure_model(env), lost, pool, env).stats == {"no_writer": 1}
    bad = failure_model(env, DescriptionWriter(FakeBackend(respond=lambda c, p, r: "??")))
    assert generate(bad, lost, pool, env).stats == {"writer_unparsed": 1}


def test_unknown_sets_raise_clearly():
    with pytest.raises(ValueError, match="not registered"):
        failures.persona_set("written-000000000000")
    with pytest.raises(ValueError, match="unknown τ² persona set"):
        failures.persona_set("modal")
