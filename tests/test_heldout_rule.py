"""The held-out rule (issue 48): a panel member that is a training simulator is refused; a look-alike that shares
an axis is evaluated and named; ``strict`` refuses any shared axis."""

from __future__ import annotations

import json

import pytest
import yaml

import simpop
from simpop.cli import main
from simpop.seat import SimulatorSpec
from simpop.simulators.population import Panel, PanelOverlapError, Population, model_key
from simpop.simulators.registry import build_simulator
from tests.simulators.fakes import EchoSimulator

TRAIN = {"model": "m", "personas": "train", "decoding": {"temperature": 0.8}}


def training() -> EchoSimulator:
    return EchoSimulator("t", **TRAIN)


@pytest.mark.parametrize("member", [
    lambda t: t,  # the same object
    lambda t: EchoSimulator("twin", **TRAIN),  # the same simulator built twice
    lambda t: EchoSimulator("resampled", "m", "train", {"temperature": 1.5}),  # same model and personas
])
def test_a_leak_is_refused_by_both_rules(member):
    t = training()
    for strict in (False, True):
        with pytest.raises(PanelOverlapError, match="is also a training simulator|only its decoding differs"):
            Panel([member(t)]).check_disjoint(Population([t]), strict=strict)


def test_a_decoding_only_look_alike_is_evaluated_and_named():
    alike = Panel([EchoSimulator("p", "other", "heldout", {"temperature": 0.8})]).check_disjoint([training()])
    assert [(a.member, a.training, a.shared) for a in alike] == [
        ("p", "t", ("decoding settings {'temperature': 0.8}",))]
    assert str(alike[0]) == "shares decoding settings {'temperature': 0.8} with training simulator 't'"


@pytest.mark.parametrize(("member", "shared"), [
    (EchoSimulator("p", "m", "heldout", {"temperature": 1.2}), ("model 'm'",)),  # model only
    (EchoSimulator("p", "other", "train", {"temperature": 1.2}), ("persona set 'train'",)),  # personas only
    (EchoSimulator("p", "other", "train", {"temperature": 0.8}),
     ("persona set 'train'", "decoding settings {'temperature': 0.8}")),  # another model: not the simulator
])
def test_other_look_alikes_are_evaluated_with_every_shared_axis(member, shared):
    panel = Panel([member], training=[training()])
    assert [a.shared for a in panel.look_alikes] == [shared]


@pytest.mark.parametrize(("member", "message"), [
    (EchoSimulator("p", "other", "heldout", {"temperature": 0.8}), "shares decoding settings"),
    (EchoSimulator("p", "m", "heldout", {"temperature": 1.2}), "the model of every training simulator"),
    (EchoSimulator("p", "other", "train", {"temperature": 1.2}), "shares persona set 'train'"),
])
def test_strict_refuses_any_shared_axis(member, message):
    with pytest.raises(PanelOverlapError, match=message):
        Panel([member], training=[training()], strict=True)
    Panel([EchoSimulator("p", "other", "heldout", {"temperature": 1.2})], training=[training()], strict=True)


def test_a_held_out_member_is_no_look_alike():
    assert Panel([EchoSimulator("p", "other", "heldout", {"temperature": 1.2})], training=[training()]).look_alikes == []


def test_same_model_parameters_across_kinds():
    env = simpop.make("simpop/PersuasionAct-v0")
    base = {model_key(build_simulator(s, env).spec) for s in
            ("native", "persuadee?decoding=greedy", "trainable:persuadee", "verbalized:persuadee:base")}
    assert len(base) == 1  # wrappers and decodings play the base parameters
    heldout = build_simulator("persuadee:heldout-0", env).spec
    assert model_key(heldout) not in base
    assert model_key(heldout) != model_key(build_simulator("persuadee:heldout-0?model_seed=7", env).spec)
    # An LLM: frozen, verbalized and a trainable LoRA adapter over it play its weights.
    assert model_key(SimulatorSpec("trainable", "smollm2+lora:sim0")) == model_key(SimulatorSpec("frozen", "smollm2"))
    # The trainable persuadee starts from the base model: sampling the base on its personas leaks it.
    with pytest.raises(PanelOverlapError, match="plays the model and persona set of training simulator"):
        Panel([build_simulator("persuadee?temperature=0.5", env)],
              training=[build_simulator("trainable:persuadee", env)])


ACT = ["--env", "simpop/PersuasionAct-v0", "--env-arg", "max_turns=3", "--no-progress", "--threads", "1"]


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """``--threads`` sets torch's thread count for the process: put it back for the other tests."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_train_at_t08_then_eval_on_p4g_act_v1_names_the_look_alike(tmp_path, capsys):
    run, ev = tmp_path / "run", tmp_path / "eval"
    assert main(["train", "grpo", *ACT, "--simulator", "persuadee?temperature=0.8", "--updates", "1",
                 "--group-size", "2", "--scenarios-per-update", "2", "--out", str(run), "--panel", "p4g-act-v1",
                 "--eval-episodes", "2", "--report-to", "none", "--no-export"]) == 0
    shared = "shares decoding settings {'decoding': 'sample', 'temperature': 0.8} with training simulator"
    assert f"heldout-0-T0.8 (look-alike, evaluated): {shared}" in capsys.readouterr().out
    check = json.loads((run / "run.json").read_text())["heldout_check"]
    assert not check["strict"] and list(check["look_alikes"]) == ["heldout-0-T0.8"]

    common = ["eval", *ACT, "--policy", f"run:{run}", "--panel", "p4g-act-v1", "--episodes", "2"]
    assert main([*common, "--out", str(ev)]) == 0
    assert f"heldout-0-T0.8 (look-alike, evaluated): {shared}" in capsys.readouterr().out
    summary = json.loads((ev / "summary.json").read_text())
    assert list(summary["heldout_check"]["look_alikes"]) == ["heldout-0-T0.8"]
    report = (ev / "report.md").read_text()
    assert "| member | spec | shared with training |" in report and shared in report
    assert "| heldout-1-T0.9 |" in report and report.count(shared) == 1

    assert main([*common, "--out", str(tmp_path / "strict"), "--strict-heldout"]) == 2
    assert "heldout-0-T0.8" in capsys.readouterr().err
    assert main(["train", "grpo", *ACT, "--simulator", "persuadee?temperature=0.8", "--updates", "1",
                 "--out", str(tmp_path / "strict-run"), "--panel", "p4g-act-v1", "--strict-heldout"]) == 2
    assert "shares decoding settings" in capsys.readouterr().err


def test_a_panel_holding_the_training_simulator_is_refused(tmp_path, capsys):
    panel = tmp_path / "panel.yaml"
    panel.write_text(yaml.safe_dump({"name": "leaky", "members": {
        "held": "persuadee:heldout-1?temperature=1.2&personas=heldout-60-7",
        "itself": "persuadee?temperature=1.3"}}))  # the training model on its personas, resampled
    assert main(["train", "grpo", *ACT, "--simulator", "persuadee?temperature=0.8", "--updates", "1",
                 "--out", str(tmp_path / "run"), "--panel", str(panel)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "itself: 'itself' plays the model and persona set of training simulator" in err[0]
    run = tmp_path / "trained"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"trainer": "grpo", "simulator": "persuadee?temperature=0.8"}))
    assert main(["eval", *ACT, "--policy", "reference", "--panel", str(panel), "--episodes", "2",
                 "--out", str(tmp_path / "eval"), "--run", str(run)]) == 2
    assert "only its decoding differs" in capsys.readouterr().err
