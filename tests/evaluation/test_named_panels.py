"""Shipped named panels: pinned members, every spec parses and builds, env checks, bad files, the card."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import simpop
from simpop.envs.registration import ids
from simpop.evaluation.panels import env_ids_of, load_named_panel, named_panels, panel_card, panel_definition
from simpop.seat import SimulatorSpec
from tests.envs.registry_kwargs import kwargs_for
from tests.simulators.fakes import FakeBackend

_HELDOUT = {f"heldout-{i}-T{t}": f"persuadee:heldout-{i}?temperature={t}&personas=heldout-300-4242&jitter=0.35"
                                 f"&model_seed=4242" for i, t in enumerate(("0.8", "0.9", "1.2"))}
_TAU2 = {"scripted": "native", "smollm2-greedy": "frozen:smollm2?temperature=0.0",
         "smollm2-T1.0": "frozen:smollm2?temperature=1.0", "smollm2-verbalized-k5": "verbalized:smollm2?k=5"}

#: Every shipped panel, pinned: a shipped panel never changes (a changed panel is a new -vN file).
PINNED: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "p4g-act-v1": (("simpop/PersuasionAct-v0",), _HELDOUT),
    "p4g-act-human-v1": (("simpop/PersuasionAct-v0",), {
        f"fitted-{i}-T{t}": f"persuadee:fitted-{i}?temperature={t}&personas=human-300-2019"
        for i, t in enumerate(("0.9", "1.1", "1.3"))}),
    "p4g-text-v1": (("simpop/Persuasion-v1", "simpop/Persuasion-v0"), {
        **_HELDOUT,
        "smollm2-T0.7": "frozen:smollm2?temperature=0.7&personas=heldout-300-4242",
        "smollm2-verbalized-k5": "verbalized:smollm2?k=5&personas=heldout-300-4242"}),
    **{f"tau2-{d}-v1": ((f"simpop/Tau2-{d}-v0",), _TAU2) for d in ("mock", "airline", "retail", "telecom")},
    "cooperbench-mini-v1": (("simpop/CooperBench-mini-v0", "simpop/CooperBench-v0"), {
        "native": "native", "smollm2-greedy": "frozen:smollm2?max_new_tokens=256",
        "smollm2-T1.0": "frozen:smollm2?temperature=1.0&max_new_tokens=256"}),
}


def test_shipped_panels_are_the_pinned_ones():
    assert sorted(named_panels()) == sorted(PINNED)
    for name, (envs, members) in PINNED.items():
        definition = panel_definition(name)
        assert (definition.name, definition.env, definition.members) == (name, envs, members), (
            f"shipped panel {name} changed: ship the new one as the next version instead")
        assert len(named_panels()[name]) > 80  # a real description, printed on the card


def test_every_shipped_spec_parses_and_names_a_registered_env():
    for name in named_panels():
        definition = panel_definition(name)
        assert set(definition.env) <= set(ids()), f"{name} names an unregistered env"
        specs = [SimulatorSpec.parse(s) for s in definition.members.values()]
        assert len(set(specs)) == len(specs) == len(definition.members)  # distinct members, distinct simulators


def test_act_panel_is_the_collapse_experiments_and_runs():
    from simpop.agents.policy import ActPolicy
    from simpop.evaluation.panel import evaluate
    from simpop.experiments.conditions import CollapseConfig, build_panel

    env = simpop.make("simpop/PersuasionAct-v0")
    panel = load_named_panel("p4g-act-v1", env)  # built for real: native persuadees, no model
    collapse = build_panel(CollapseConfig(), env)
    assert {n: str(m.spec) for n, m in panel} == {n: str(m.spec) for n, m in collapse}
    assert panel.name == "p4g-act-v1" and all(len(m.personas) > 200 for _, m in panel)
    result = evaluate("simpop/PersuasionAct-v0", ActPolicy.for_env(env, 8), panel, episodes=2, seed=0)
    assert set(result.per_member) == set(PINNED["p4g-act-v1"][1]) and result.episodes == 6


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_shipped_panel_builds_on_every_env_it_names(name):
    for env_id in PINNED[name][0]:
        env = simpop.make(env_id, **kwargs_for(env_id))
        fake = FakeBackend(name="smollm2")
        backends = {"smollm2": fake}
        panel = load_named_panel(name, env, backends, env_id=env_id)
        assert list(backends) == ["smollm2"]  # every LLM member took the shared (fake) backend: nothing loaded
        assert [n for n, _ in panel] == list(PINNED[name][1])
        for member_name, simulator in panel:
            written = SimulatorSpec.parse(PINNED[name][1][member_name])
            if written.kind == "native":
                continue  # the env's own simulator reports its own spec
            assert simulator.spec == written, member_name
            if written.model == "smollm2":
                assert simulator.backend is fake


def test_the_env_is_worked_out_and_checked():
    tau2_mock, persuasion_text = simpop.make("simpop/Tau2-mock-v0"), simpop.make("simpop/Persuasion-v0")
    assert env_ids_of(tau2_mock) == ["simpop/Tau2-mock-v0"]
    assert env_ids_of(persuasion_text) == ["simpop/Persuasion-v0"]
    with pytest.raises(ValueError, match=r"'tau2-airline-v1' is for simpop/Tau2-airline-v0, not simpop/Tau2-mock-v0; "
                                         r"named panels for simpop/Tau2-mock-v0: tau2-mock-v1"):
        load_named_panel("tau2-airline-v1", tau2_mock, {"smollm2": FakeBackend(name="smollm2")})
    with pytest.raises(ValueError, match="is for simpop/PersuasionAct-v0, not simpop/Persuasion-v0"):
        load_named_panel("p4g-act-v1", persuasion_text)
    with pytest.raises(ValueError, match="is for simpop/PersuasionAct-v0, not simpop/Persuasion-v0"):
        load_named_panel("p4g-act-v1", "simpop/Persuasion-v0")  # an env id works too

    class Unregistered:
        pass

    with pytest.raises(ValueError, match="cannot tell which registered env Unregistered is; pass env_id"):
        load_named_panel("p4g-act-v1", Unregistered())


def test_unknown_names_list_the_shipped_panels():
    listing = ", ".join(sorted(PINNED))
    with pytest.raises(ValueError, match=f"unknown panel 'p4g-act-v9'; named panels: {listing}"):
        load_named_panel("p4g-act-v9", "simpop/PersuasionAct-v0")
    with pytest.raises(ValueError, match="unknown panel 'nope'; named panels: cooperbench-mini-v1, "):
        panel_definition("nope")
    with pytest.raises(ValueError, match="panel file .*missing.yaml does not exist"):
        panel_definition("missing.yaml")


@pytest.mark.parametrize("text, message", [
    ("members:\n  a: native\n  a: frozen:smollm2\n", "duplicate key 'a' at line 3"),
    ("members:\n  a: frozen:smollm2?temprature=1\n", "member 'a': unknown parameter"),
    ("members:\n  a: nokind:x\n", "member 'a': .*nokind"),
    ("members:\n  a: frozen:smollm2\n  b: frozen:smollm2?temperature=0.0\n", "members 'a' and 'b' are the same"),
    ("members: {}\n", "'members' must be a non-empty mapping"),
    ("name: x\nmembrs:\n  a: native\n", r"unknown field\(s\) \['membrs'\]"),
    ("members: [native, native]\n", "members repeat a spec"),
    ("members:\n  a: [native]\n", "member 'a': write member-name: spec-string"),
    ("env: 3\nmembers:\n  a: native\n", "'env' must be an env id"),
    ("members: {a: native\n", "not valid YAML"),
])
def test_malformed_panel_files_are_refused_with_the_cause(tmp_path, text, message):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        panel_definition(path)


def test_a_user_file_needs_only_members(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("members:\n  h0: persuadee:heldout-0?temperature=0.8\n")
    definition = panel_definition(path)
    assert (definition.name, definition.env, definition.members) == ("mine", (), {"h0": definition.members["h0"]})
    definition.check_env("simpop/Tau2-mock-v0")  # no env named: fits any


def test_panel_card_shows_every_member_and_its_spec():
    panel = load_named_panel("p4g-text-v1", "simpop/Persuasion-v0", {"smollm2": FakeBackend(name="smollm2")})
    card = panel_card(panel)
    lines = card.splitlines()
    assert lines[0] == "panel p4g-text-v1: 5 members"
    assert "realised as text" in " ".join(card.split())  # the shipped description (wrapped)
    for member_name, simulator in panel:
        assert any(line.split() == [member_name, str(simulator.spec)] for line in lines), member_name
    assert "my words" in panel_card(panel, description="my words")


def test_panel_yaml_files_are_package_data():
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert "**/*.yaml" in pyproject["tool"]["setuptools"]["package-data"]["simpop"]
