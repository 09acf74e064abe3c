"""Simulator specs (:mod:`simpop.seat`) and the one builder (:mod:`simpop.simulators.registry`).

The string syntax, validation and defaults of :class:`SimulatorSpec`; registering kinds; building single
simulators, lists and mappings (populations) and YAML panels. P4G's own ``persuadee`` kinds are tested in
``tests/envs/persuasion/test_kinds.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import simpop.seat as seat
from simpop.seat import KINDS, Kind, SimulatorSpec, kind, register_simulator_kind
from simpop.simulators.llm import LLMSimulator
from simpop.simulators.population import Panel, Population
from simpop.simulators.registry import build_many, build_simulator, load_panel
from simpop.simulators.trainable import TrainableLLMSimulator
from simpop.simulators.verbalized import VerbalizedSimulator
from tests.simulators.fakes import FakeBackend, FakeScenario, FakeTrainableBackend, SpecEcho, observation

CUSTOM = "spec-echo-test"


# ================================================================================ SimulatorSpec
def test_parse_fills_defaults_and_round_trips():
    spec = SimulatorSpec.parse("verbalized:smollm2?k=3&temperature=0.7&personas=p4g-heldout")
    assert spec.kind == "verbalized" and spec.model == "smollm2" and spec.personas == "p4g-heldout"
    assert spec.params == {"k": 3, "temperature": 0.7, "tau": 1.0, "floor": 0.01, "top_p": 1.0,
                           "max_new_tokens": 256, "constrained": True, "fallback_temperature": 1.0,
                           "fallback_max_new_tokens": 64}
    assert SimulatorSpec.parse(str(spec)) == spec
    assert SimulatorSpec.parse("frozen:smollm2") == SimulatorSpec.parse("frozen:smollm2?temperature=0")
    assert str(SimulatorSpec.parse("frozen:smollm2")) == (
        "frozen:smollm2?max_new_tokens=64&personas=scenario&temperature=0.0&top_p=1.0")
    trainable = SimulatorSpec.parse("trainable:smollm2?lora_r=4")
    assert trainable.params == {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 48, "lora_r": 4, "lora_alpha": 16}
    assert dict(trainable.extra) == {"lora_r": 4, "lora_alpha": 16}  # LoRA settings do not define the distribution


def test_models_with_separators_round_trip():
    spec = SimulatorSpec.parse("frozen:openai:qwen3@http%3A//127.0.0.1:8000/v1%3Fx%3D1%26y")
    assert spec.model == "openai:qwen3@http://127.0.0.1:8000/v1?x=1&y"
    assert SimulatorSpec.parse(str(spec)) == spec


def _not_a_kind(model: str) -> bool:
    """Models whose head names a kind make a wrapper spec (``verbalized:persuadee``), tested on their own."""
    return model.partition(":")[0] not in KINDS


@given(kind_name=st.sampled_from(["frozen", "verbalized", "trainable"]),
       model=st.text(min_size=1, max_size=20).filter(_not_a_kind), personas=st.text(min_size=1, max_size=10),
       temperature=st.floats(0, 5), k=st.integers(1, 9))
def test_any_spec_round_trips(kind_name, model, personas, temperature, k):
    decoding = {**KINDS[kind_name].decoding, "temperature": temperature,
                **({"k": k} if kind_name == "verbalized" else {})}
    spec = SimulatorSpec(kind_name, model, personas, decoding, KINDS[kind_name].extra)
    assert SimulatorSpec.parse(str(spec)) == spec


@pytest.mark.parametrize(("text", "message"), [
    ("greedy:smollm2", "unknown simulator kind 'greedy'; valid kinds: frozen .*verbalized .*trainable .*native "
                       ".*persuadee"),
    ("frozen", "needs a model: frozen:MODEL"),
    ("frozen:smollm2?k=5", "unknown parameter.* k for simulator kind 'frozen'; valid: max_new_tokens, personas, "
                           "temperature, top_p"),
    ("verbalized:smollm2?k=five", "'k' expects int, got 'five'"),
    ("frozen:smollm2?temperature", "write key=value"),
    ("frozen:smollm2?top_p=0.5&top_p=0.9", "given twice"),
    ("trainable:smollm2?k=5", "unknown parameter.* k for simulator kind 'trainable'; valid: lora_alpha, lora_r, "
                              "max_new_tokens, personas, temperature, top_p"),
    # A wrapper over a kind takes the inner kind's settings (and, for verbalized, tau and floor) only.
    ("verbalized:persuadee?k=5", "unknown parameter.* k for simulator kind 'verbalized' over persuadee; valid: "
                                 "corpus, decoding, floor, jitter, model_seed, personas, tau, temperature"),
    ("trainable:persuadee?lora_r=4", "unknown parameter.* lora_r .*valid: corpus, decoding, jitter, model_seed, "
                                     "personas, temperature"),
    ("verbalized:native", "kind 'native' cannot be wrapped by 'verbalized'"),
    ("trainable:frozen:smollm2", "kind 'frozen' cannot be wrapped by 'trainable'"),
])
def test_bad_specs_say_what_is_valid(text, message):
    with pytest.raises(ValueError, match=message):
        SimulatorSpec.parse(text)


def test_wrapper_specs_name_their_inner_spec():
    spec = SimulatorSpec.parse("verbalized:persuadee:heldout-1?temperature=0.5&floor=0.02&personas=modal")
    assert spec.inner() == SimulatorSpec.parse("persuadee:heldout-1?temperature=0.5&personas=modal")
    assert SimulatorSpec.parse(str(spec)) == spec
    with pytest.raises(ValueError, match="wraps no simulator kind"):
        SimulatorSpec.parse("verbalized:smollm2").inner()


# ================================================================================ kinds
@pytest.fixture
def custom_kind():
    """Kind ``spec-echo-test`` (a :class:`SpecEcho`), registered for one test."""
    register_simulator_kind(CUSTOM, Kind("tests.simulators.fakes:SpecEcho.from_spec", "a test kind",
                                         decoding={"level": 1, "loud": False}, extra={"note": "none"},
                                         needs_model=False))
    yield KINDS[CUSTOM]
    seat._KINDS.pop(CUSTOM)


def test_a_registered_kind_builds_through_build_simulator(custom_kind):
    assert kind(CUSTOM) is custom_kind and CUSTOM in KINDS
    env = object()
    sim = build_simulator(f"{CUSTOM}?level=3&loud=true&personas=anyone", env=env)
    assert isinstance(sim, SpecEcho) and sim.env is env and sim.name == f"{CUSTOM}?level=3&loud=true&personas=anyone"
    assert sim.spec == SimulatorSpec(CUSTOM, "", "anyone", {"level": 3, "loud": True}, {"note": "none"})
    assert SimulatorSpec.parse(str(sim.spec)) == sim.spec
    assert build_simulator(CUSTOM).spec.params == {"level": 1, "loud": False, "note": "none"}  # defaults filled in
    with pytest.raises(ValueError, match="'loud' expects true or false, got 'maybe'"):
        build_simulator(f"{CUSTOM}?loud=maybe")
    with pytest.raises(ValueError, match="unknown parameter.* k .*valid: level, loud, note, personas"):
        build_simulator(f"{CUSTOM}?k=2")
    # Without a stated distribution or a trainable form it cannot be wrapped.
    with pytest.raises(ValueError, match="no stated distribution"):
        build_simulator(f"verbalized:{CUSTOM}")
    with pytest.raises(ValueError, match="no trainable form"):
        build_simulator(f"trainable:{CUSTOM}")


def test_kind_registration_rejects_duplicates_bad_names_and_reserved_keys(custom_kind):
    with pytest.raises(ValueError, match="already registered"):
        register_simulator_kind(CUSTOM, custom_kind)
    with pytest.raises(ValueError, match="already registered"):
        register_simulator_kind("frozen", custom_kind)
    for bad in ["", "two words", "a:b", "x?y", "p&q"]:
        with pytest.raises(ValueError, match="letters, digits, '-' and '_'"):
            register_simulator_kind(bad, custom_kind)
    with pytest.raises(ValueError, match="'personas' is valid for every kind"):
        register_simulator_kind("with-personas", Kind("m:f", "h", extra={"personas": "x"}))
    assert "with-personas" not in KINDS and "" not in KINDS
    with pytest.raises(TypeError):
        KINDS["sneaky"] = custom_kind  # type: ignore[index]  # read-only: only register_simulator_kind adds
    with pytest.raises(ValueError, match="unknown simulator kind 'nope'; valid kinds: frozen"):
        kind("nope")


# ================================================================================ building
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
    assert build_simulator(SimulatorSpec.parse("frozen:fake"), backends=backends).spec == SimulatorSpec.parse(
        "frozen:fake")  # a parsed spec builds like its string
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        build_simulator("frozen:fake?temperature=-1", backends=backends)


def test_trainable_model_specs_add_one_adapter_per_simulator_on_a_shared_model():
    backend = FakeTrainableBackend()
    backends = {"trainable:fake": backend}
    first = build_simulator("trainable:fake?lora_r=4&lora_alpha=8", backends=backends)
    second = build_simulator("trainable:fake?temperature=0.7", backends=backends)
    assert isinstance(first, TrainableLLMSimulator) and first.backend is second.backend is backend
    assert backend.adapters == {"sim0": (4, 8), "sim1": (8, 16)} and (first.adapter, second.adapter) == ("sim0", "sim1")
    assert first.params.temperature == 1.0 and second.params.temperature == 0.7
    assert first.spec.model == "fake+lora:sim0" and dict(first.spec.extra) == {"lora_r": 4, "lora_alpha": 8}
    assert SimulatorSpec.parse(str(first.spec)) == first.spec
    with pytest.raises(ValueError, match="must sample"):
        build_simulator("trainable:fake?temperature=0", backends=backends)


def test_named_persona_sets_come_from_the_env():
    class Env:
        def persona_set(self, name):
            return {"heldout": ["a nurse", "a judge"]}[name]

    sim = build_simulator("frozen:fake?personas=heldout", env=Env(), backends={"fake": FakeBackend()})
    assert sim.personas == ["a nurse", "a judge"] and sim.spec.personas == "heldout"
    with pytest.raises(ValueError, match="persona_set"):
        build_simulator("frozen:fake?personas=heldout", backends={"fake": FakeBackend()})


def test_native_needs_an_env_and_plays_the_scenarios_persona():
    with pytest.raises(ValueError, match="native simulators need the env"):
        build_simulator("native")
    with pytest.raises(ValueError, match="play the scenario's persona"):
        build_simulator("native:simpop/PersuasionAct-v0?personas=modal")


def test_text_simulators_use_the_envs_text_format():
    class Format:
        counters = ("shouted",)

        def chat(self, observation, scenario, instructions_suffix=""):
            return [{"role": "user", "content": "formatted" + instructions_suffix}]

        def to_action(self, text, stats):
            stats["shouted"] += 1
            return text.upper()

    class Env:
        text_format = Format()

    backends = {"fake": FakeBackend()}
    for spec in ["frozen:fake", "verbalized:fake"]:
        sim = build_simulator(spec, env=Env(), backends=backends)
        sim.reset(FakeScenario(), np.random.default_rng(0))
        reply = sim.act(observation("hi"))
        assert sim.text_format is Env.text_format and reply == reply.upper() and sim.stats["shouted"] == 1
        assert backends["fake"].calls[-1][0][0][0]["content"].startswith("formatted")


# ================================================================================ many, populations, panels
def test_build_many_shares_backends_and_names_members():
    backends = {"fake": FakeBackend()}
    listed = build_many(["frozen:fake", "frozen:fake?temperature=1.0"], backends=backends)
    assert [s.name for s in listed] == ["frozen:fake", "frozen:fake?temperature=1.0"]
    named = build_many({"greedy": "frozen:fake", "hot": "frozen:fake?temperature=1.5"}, backends=backends)
    assert [s.name for s in named] == ["greedy", "hot"]
    assert all(s.backend is backends["fake"] for s in listed + named)


def test_a_list_of_specs_is_a_uniform_population():
    backends = {"fake": FakeBackend()}
    pop = build_simulator(["frozen:fake", "verbalized:fake?k=3"], backends=backends)
    assert isinstance(pop, Population) and pop.rule == "uniform" and pop.name == "population"
    assert [m.name for m in pop.members] == ["frozen:fake", "verbalized:fake?k=3"]
    assert isinstance(pop.members[1], VerbalizedSimulator) and pop.members[0].backend is pop.members[1].backend
    assert pop.probabilities() == pytest.approx([0.5, 0.5])
    assert build_simulator(["frozen:fake"], backends=backends, name="solo").name == "solo"


def test_a_population_mapping_names_members_weights_and_rule():
    backends = {"fake": FakeBackend()}
    pop = build_simulator({"members": {"greedy": "frozen:fake", "hot": "frozen:fake?temperature=1.5"},
                           "weights": [3, 1], "rule": "weighted", "name": "mix"}, backends=backends)
    assert pop.name == "mix" and [m.name for m in pop.members] == ["greedy", "hot"]
    assert pop.probabilities() == pytest.approx([0.75, 0.25])
    assert pop.members[1].params.temperature == 1.5
    listed = build_simulator({"members": ["frozen:fake", "frozen:fake?top_p=0.9"], "rule": "prioritised"},
                             backends=backends)
    assert listed.rule == "prioritised" and listed.name == "population"


@pytest.mark.parametrize(("spec", "message"), [
    ({"members": ["frozen:fake"], "weight": [1]}, r"unknown population field\(s\) \['weight'\]; valid: members"),
    ({"members": []}, "non-empty 'members'"),
    ({"rule": "uniform"}, "non-empty 'members'"),
    ([], "non-empty 'members'"),
    ({"members": ["frozen:fake"], "rule": "roulette"}, "unknown population rule 'roulette'"),
    ({"members": ["frozen:fake", "frozen:fake"]}, "two members are named 'frozen:fake'"),
    ({"members": ["frozen:fake"], "weights": [1, 2]}, "2 weights for 1 members"),
    (["frozen:fake", "frozen"], "needs a model"),
])
def test_bad_populations_error(spec, message):
    with pytest.raises(ValueError, match=message):
        build_simulator(spec, backends={"fake": FakeBackend()})


def test_load_panel_from_a_yaml_file(tmp_path):
    path = tmp_path / "panel.yaml"
    path.write_text("name: my-panel\nmembers:\n  hot: frozen:fake?temperature=1.5\n"
                    "  verbal: verbalized:fake?k=3&personas=heldout\n")

    class Env:
        def persona_set(self, name):
            return {"heldout": ["a nurse", "a judge"]}[name]

    backends = {"fake": FakeBackend()}
    panel = load_panel(path, env=Env(), backends=backends)
    assert isinstance(panel, Panel) and panel.name == "my-panel" and len(panel) == 2
    assert [name for name, _ in panel] == ["hot", "verbal"]
    assert panel["hot"].params.temperature == 1.5 and panel["verbal"].personas == ["a nurse", "a judge"]
    assert panel["hot"].backend is panel["verbal"].backend is backends["fake"]
    # A list of specs names members by their spec strings; the panel's name defaults to "heldout".
    listed = tmp_path / "listed.yaml"
    listed.write_text("members:\n  - frozen:fake?temperature=0.5\n")
    panel = load_panel(listed, backends=backends)
    assert panel.name == "heldout" and [name for name, _ in panel] == ["frozen:fake?temperature=0.5"]
    assert load_panel({"members": ["frozen:fake"]}, backends=backends)["frozen:fake"].spec.kind == "frozen"
    bad = tmp_path / "bad.yaml"
    for text in ["- frozen:fake\n", "name: only-a-name\n"]:
        bad.write_text(text)
        with pytest.raises(ValueError, match="a panel is a mapping with 'members'"):
            load_panel(bad, backends=backends)


# ================================================================================ round trips
@pytest.mark.parametrize("text", ["frozen:fake", "frozen:fake?temperature=0.9&top_p=0.8&max_new_tokens=12",
                                  "verbalized:fake?k=3&tau=0.5&floor=0.0&fallback_temperature=0.7",
                                  "trainable:fake?temperature=0.8&lora_r=2", f"{CUSTOM}?level=2"])
def test_every_built_simulator_has_a_spec_that_round_trips(text, custom_kind):
    backends = {"fake": FakeBackend(), "trainable:fake": FakeTrainableBackend()}
    sim = build_simulator(text, backends=backends)
    assert SimulatorSpec.parse(str(sim.spec)) == sim.spec
    assert sim.spec.kind == text.partition(":")[0].partition("?")[0]
