"""Failure-driven simulator generation (simpop.simulators.generation) on P4G at both levels."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pytest

import simpop
from simpop.seat import SimulatorSpec
from simpop.simulators.generation import DescriptionWriter, Proposal, check, failure_model, generate
from simpop.simulators.population import Population
from simpop.simulators.registry import build_simulator, load_panel
from tests.simulators.fakes import FakeBackend

PANEL = {"name": "heldout", "members": {"h0": "persuadee:heldout-0?temperature=0.8&personas=heldout-300-4242"}}


@dataclass
class Rec:
    member: str
    scenario: str
    success: bool
    transcript: list = field(default_factory=list)


def p4g_records(env, lost_if) -> list[Rec]:
    """One probe record per scenario: lost where ``lost_if(persona)``."""
    out = []
    for sid in env.scenario_ids()[:120]:
        lost = lost_if(env.load_scenario(sid).persona)
        reply = "No thanks, I'll pass." if lost else "Sure, I'll give $1."
        turns = [{"seat": "persuader", "text": "Hi"}, {"seat": "persuadee", "text": reply}]
        out.append(Rec("probe", sid, not lost, turns))
    return out


@pytest.fixture(scope="module")
def act_env():
    return simpop.make("simpop/PersuasionAct-v0")


def test_act_level_regions_target_the_failing_personas_and_round_trip(act_env):
    panel = load_panel(PANEL, act_env)
    records = p4g_records(act_env, lambda p: p.agreeable < 3.6)
    pool = Population([build_simulator("persuadee?temperature=1.0", act_env)])
    result = generate(failure_model(act_env), records, pool, act_env, count=2, panel=panel,
                      rng=np.random.default_rng(0))
    assert len(result.added) == 2 and len(pool.members) == 3 and not result.rejected
    first = result.proposals[0]
    assert first.reason["region"][0]["attribute"] == "agreeable" and first.reason["region"][0]["op"] == "<"
    assert first.reason["reply_patterns"][0]["reply"] == "No thanks, I'll pass."
    for simulator in result.added:
        spec = simulator.spec
        assert SimulatorSpec.parse(str(spec)) == spec
        assert build_simulator(str(spec), act_env).spec == spec  # registered: the registry rebuilds it
        panel.check_disjoint([simulator])
        region = [c for c in result.proposals[result.added.index(simulator)].reason["region"]
                  if c["attribute"] == "agreeable"]
        if region:  # every persona of the set lies in the failing region
            assert all(p.agreeable < region[0]["value"] for p in simulator.personas)
    assert "agreeable<" in result.record()["added_specs"][0].replace("%3C", "<")


def test_copies_of_panel_members_are_rejected_and_counted(act_env):
    panel = load_panel(PANEL, act_env)

    class Copier:
        def propose(self, lost, won, count, rng, stats):
            return [Proposal("same", PANEL["members"]["h0"]),  # the panel member itself
                    Proposal("same-people", "persuadee?temperature=1.0&personas=heldout-5-4242"),  # its first 5 people
                    Proposal("broken", "persuadee?temperature=1.0&personas=region-64-1:nosuch<3"),
                    Proposal("ok", "persuadee?temperature=1.0&personas=region-64-1:care<4")]

    pool = Population([build_simulator("persuadee?temperature=1.0", act_env)])
    result = generate(Copier(), [Rec("p", "p4g-0000", False)], pool, act_env, count=4, panel=panel)
    assert dict(result.rejected) == {"not_held_out": 1, "copies_panel_persona": 1, "build_error": 1}
    assert [s.name for s in result.added] == ["ok"]
    again = generate(Copier(), [Rec("p", "p4g-0000", False)], pool, act_env, count=4, panel=panel)
    assert again.rejected["duplicate_name"] == 1 and not again.added
    nothing = generate(Copier(), [Rec("p", "p4g-0000", True)], pool, act_env, panel=panel)
    assert nothing.rejected == {"no_lost_dialogues": 1}


def test_check_accepts_a_fresh_simulator_without_a_panel(act_env):
    simulator = build_simulator("persuadee?temperature=1.0&personas=region-8-3:care>4", act_env)
    assert check(simulator, act_env, None) is None


def test_failure_model_is_found_by_env_package():
    class Elsewhere:
        pass

    with pytest.raises(ValueError, match="no failure model"):
        failure_model(Elsewhere())


# ------------------------------------------------------------------------------------------ the writer
@pytest.mark.parametrize("text,path,n", [
    ('["You are a retired nurse who distrusts charities.", "You are a student with no spare money at all."]',
     "parsed_json", 2),
    ('Sure! Here they are: ["You are a retired nurse who distrusts charities."] Hope it helps.',
     "parsed_embedded_json", 1),
    ('{"descriptions": ["You are a retired nurse who distrusts charities."]}', "parsed_json", 1),
    ("1. You are a retired nurse who distrusts charities.\n2) You are a busy parent of three kids.\n- short",
     "parsed_lines", 2),
    ("I cannot help with that.", "unparsed", 0),
])
def test_writer_parses_robustly_and_counts_each_path(text, path, n):
    writer = DescriptionWriter(FakeBackend(respond=lambda chat, params, rng: text))
    out = writer.write([[{"seat": "persuader", "text": "Please donate"}, {"seat": "persuadee", "text": "No"}]], 3)
    assert len(out) == n and writer.stats[path] == 1 and writer.stats["calls"] == 1
    assert all(o.startswith("You are") for o in out)
    prompt = writer.backend.calls[0][0][0][0]["content"]
    assert "persuadee: No" in prompt and "JSON list of 3 strings" in prompt


def test_writer_drops_short_and_cuts_long_descriptions():
    writer = DescriptionWriter(FakeBackend(), max_chars=40)
    assert writer.parse(json.dumps(["tiny", "You are " + "very " * 30 + "tired."])) == [
        "You are very very very very very very"]
    assert writer.stats["dropped_short"] == 1 and writer.stats["truncated_long"] == 1


@pytest.fixture(scope="module")
def text_env():
    return simpop.make("simpop/Persuasion-v1")


def written_backend(chat, params, rng):
    return json.dumps([f"You are a skeptical person number {i} who thinks charities waste money." for i in range(8)])


def test_text_level_written_personas_are_registered_specs_that_round_trip(text_env, tmp_path):
    from simpop.envs.persuasion import PersuasionScenario, failures

    backends = {"smollm2": FakeBackend(name="smollm2")}
    panel = load_panel(PANEL, text_env)
    records = p4g_records(text_env, lambda p: p.care < 4.4)
    model = failure_model(text_env, DescriptionWriter(FakeBackend(respond=written_backend)))
    pool = Population([build_simulator("persuadee?temperature=1.0", text_env)])
    result = generate(model, records, pool, text_env, count=2, panel=panel, backends=backends,
                      rng=np.random.default_rng(1))
    assert len(result.added) == 2 and not result.rejected
    for simulator in result.added:
        spec = simulator.spec
        assert spec.kind == "frozen" and spec.personas.startswith("written-")
        assert build_simulator(str(spec), text_env, backends).spec == spec
        personas = text_env.persona_set(spec.personas)
        assert all(p.describe().startswith("You are a skeptical person") for p in personas)
        assert "skeptical person" in PersuasionScenario("x", personas[0]).user_instructions()
    failures.save_written(tmp_path / "written.json")
    assert set(failures.load_written(tmp_path / "written.json")) >= {s.spec.personas for s in result.added}


def test_text_level_falls_back_to_regions_when_the_writer_fails(text_env):
    model = failure_model(text_env, DescriptionWriter(FakeBackend(respond=lambda c, p, r: "no idea")))
    pool = Population([build_simulator("persuadee?temperature=1.0", text_env)])
    result = generate(model, p4g_records(text_env, lambda p: p.care < 4.4), pool, text_env, count=1,
                      panel=load_panel(PANEL, text_env))
    assert result.stats["writer_fallback"] == 1 and result.added[0].spec.personas.startswith("region-")


def test_real_smollm2_writer_answers_through_the_backend_interface(smollm2):
    writer = DescriptionWriter(smollm2, max_new_tokens=32)
    out = writer.write([[{"seat": "persuader", "text": "Would you donate $1 to Save the Children?"},
                         {"seat": "persuadee", "text": "No, I don't trust charities with my money."}]], 2)
    parsed = sum(writer.stats[k] for k in ("parsed_json", "parsed_embedded_json", "parsed_lines", "unparsed"))
    assert writer.stats["calls"] == 1 and parsed == 1  # exactly one parse path taken, counted
    assert all(isinstance(o, str) and 20 <= len(o) <= 400 for o in out)
