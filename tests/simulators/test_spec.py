"""Simulator specs: the string syntax, validation and the builder."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simpop.simulators.llm import LLMSimulator
from simpop.simulators.spec import KINDS, SimulatorSpec, build_simulator
from simpop.simulators.verbalized import VerbalizedSimulator
from tests.simulators.fakes import FakeBackend


def test_parse_fills_defaults_and_round_trips():
    spec = SimulatorSpec.parse("verbalized:smollm2?k=3&temperature=0.7&personas=p4g-heldout")
    assert spec.kind == "verbalized" and spec.model == "smollm2" and spec.personas == "p4g-heldout"
    assert spec.params == {"k": 3, "temperature": 0.7, "tau": 1.0, "floor": 0.01, "top_p": 1.0,
                           "max_new_tokens": 256, "fallback_temperature": 1.0,
                           "fallback_max_new_tokens": 64}
    assert SimulatorSpec.parse(str(spec)) == spec
    assert SimulatorSpec.parse("frozen:smollm2") == SimulatorSpec.parse("frozen:smollm2?temperature=0")
    assert str(SimulatorSpec.parse("frozen:smollm2")) == (
        "frozen:smollm2?max_new_tokens=64&personas=scenario&temperature=0.0&top_p=1.0")


def test_models_with_separators_round_trip():
    spec = SimulatorSpec.parse("frozen:openai:qwen3@http%3A//127.0.0.1:8000/v1%3Fx%3D1%26y")
    assert spec.model == "openai:qwen3@http://127.0.0.1:8000/v1?x=1&y"
    assert SimulatorSpec.parse(str(spec)) == spec


@given(kind=st.sampled_from(["frozen", "verbalized"]), model=st.text(min_size=1, max_size=20),
       personas=st.text(min_size=1, max_size=10), temperature=st.floats(0, 5), k=st.integers(1, 9))
def test_any_spec_round_trips(kind, model, personas, temperature, k):
    decoding = {**KINDS[kind].decoding, "temperature": temperature, **({"k": k} if kind == "verbalized" else {})}
    spec = SimulatorSpec(kind, model, personas, decoding, KINDS[kind].extra)
    assert SimulatorSpec.parse(str(spec)) == spec


@pytest.mark.parametrize(("text", "message"), [
    ("greedy:smollm2", "unknown simulator kind 'greedy'; valid kinds: frozen .*verbalized .*native"),
    ("frozen", "needs a model: frozen:MODEL"),
    ("frozen:smollm2?k=5", "unknown parameter.* k for simulator kind 'frozen'; valid: max_new_tokens, personas, "
                           "temperature, top_p"),
    ("verbalized:smollm2?k=five", "'k' expects int, got 'five'"),
    ("frozen:smollm2?temperature", "write key=value"),
    ("frozen:smollm2?top_p=0.5&top_p=0.9", "given twice"),
])
def test_bad_specs_say_what_is_valid(text, message):
    with pytest.raises(ValueError, match=message):
        SimulatorSpec.parse(text)


def test_build_reuses_one_backend_per_model():
    backends = {"fake": FakeBackend()}
    frozen = build_simulator("frozen:fake?temperature=1.0", backends=backends)
    verbal = build_simulator("verbalized:fake?k=4&tau=0.5", backends=backends, name="vs")
    assert isinstance(frozen, LLMSimulator) and isinstance(verbal, VerbalizedSimulator)
    assert frozen.backend is verbal.backend is backends["fake"]
    assert frozen.name == "frozen:fake?temperature=1.0" and verbal.name == "vs"
    assert frozen.params.temperature == 1.0 and verbal.k == 4 and verbal.tau == 0.5
    assert frozen.spec == SimulatorSpec.parse("frozen:fake?temperature=1.0")
    assert verbal.spec == SimulatorSpec.parse("verbalized:fake?k=4&tau=0.5")
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        build_simulator("frozen:fake?temperature=-1", backends=backends)


def test_named_persona_sets_come_from_the_env():
    class Env:
        def persona_set(self, name):
            return {"heldout": ["a nurse", "a judge"]}[name]

    sim = build_simulator("frozen:fake?personas=heldout", env=Env(), backends={"fake": FakeBackend()})
    assert sim.personas == ["a nurse", "a judge"] and sim.spec.personas == "heldout"
    with pytest.raises(ValueError, match="persona_set"):
        build_simulator("frozen:fake?personas=heldout", backends={"fake": FakeBackend()})


def test_native_needs_an_env():
    with pytest.raises(ValueError, match="native simulators need the env"):
        build_simulator("native")
