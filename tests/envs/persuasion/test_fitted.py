"""Corpus-fitted persuadees: the fit recovers known parameters, the release is deterministic and held out, and the
shipped fit builds ``persuadee:fitted-<i>`` and ``human-<n>-<seed>`` personas with no corpus on the machine."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import simpop
from simpop.envs.persuasion.acts import PERSUADER_ACTS
from simpop.envs.persuasion.corpus import fit_params, load_corpus
from simpop.envs.persuasion.fitted import CORPUS_COMMIT, CORPUS_REPOSITORY, fit_release, predicted_donations, split
from simpop.envs.persuasion.model import PersuadeeModel, PersuadeeParams
from simpop.envs.persuasion.personas import PersonaSampler
from simpop.envs.persuasion.release import FIT_VERSION, human_sampler, load_release, params_of, shipped_params
from simpop.simulators.registry import build_simulator

from tests.envs.persuasion.p4g_fixture import write_p4g_corpus

#: Strategy effects of the known persuadee: far from the hand-set ones (0.1 .. 0.35) and of both signs.
EFFECTS = (0.8, -0.4, 0.0, 0.5, -0.2, 0.3, 0.6, -0.3, 0.1, 0.4)


def _truth() -> PersuadeeParams:
    base = PersuadeeParams()
    rng = np.random.default_rng(7)
    table = np.array(base.response_logits).reshape(len(PERSUADER_ACTS), -1)
    table = np.array([row[rng.permutation(len(row))] for row in table])  # other replies than the hand-set model's
    return dataclasses.replace(
        base, act_effects=EFFECTS + base.act_effects[len(EFFECTS):], sentiment_slope=0.0,
        response_logits=tuple(table.ravel()),
        amount_logits=tuple(math.log(w) for w in (0.3, 0.2, 0.1, 0.1, 0.15, 0.05, 0.1)), amount_slope=0.0,
        amount_shift=0.0, intercept=-0.5)


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    """A corpus of 400 annotated dialogues played by a persuadee with known parameters."""
    truth = _truth()
    return truth, write_p4g_corpus(tmp_path_factory.mktemp("known"), n_dialogues=400, n_annotated=400, seed=3,
                                   params=truth)


def test_the_fit_recovers_known_parameters(known):
    truth, directory = known
    fitted = fit_params(load_corpus(directory))
    effects = np.array(fitted.act_effects[:len(EFFECTS)])
    assert np.corrcoef(effects, EFFECTS)[0, 1] > 0.9
    assert np.sign(effects[[0, 1, 3, 6, 7]]).tolist() == [1, -1, 1, 1, -1]  # the strong ones, sign for sign
    model, true = PersuadeeModel(fitted), PersuadeeModel(truth)
    for act in ("credibility-appeal", "logical-appeal", "emotion-appeal", "greeting"):  # the frequent ones
        tv = 0.5 * np.abs(model.response_probabilities(0.0, act) - true.response_probabilities(0.0, act)).sum()
        assert tv < 0.1, act
    personas = PersonaSampler().sample_many(200, np.random.default_rng(1))
    (p_fit, amounts_fit), (p_true, amounts_true) = (predicted_donations(p, personas, draws=8)
                                                    for p in (fitted, truth))
    assert abs(p_fit.mean() - p_true.mean()) < 0.05
    donors_fit, donors_true = ((p[:, None] * a).sum(0) / p.sum() for p, a in ((p_fit, amounts_fit),
                                                                                (p_true, amounts_true)))
    assert 0.5 * np.abs(donors_fit - donors_true).sum() < 0.1


def test_release_is_deterministic_held_out_and_better_than_hand_set(tmp_path):
    directory = write_p4g_corpus(tmp_path, n_dialogues=150, n_annotated=100, seed=4, params=_truth())
    corpus = load_corpus(directory)
    train, held = split(corpus)
    assert not {d.id for d in train.dialogues} & {d.id for d in held.dialogues}
    assert (len(held.dialogues), len(held.annotated), len(train.dialogues)) == (30, 20, 120)
    first = fit_release(str(directory), resamples=2, command="cmd")
    assert first == fit_release(str(directory), resamples=2, command="cmd")
    assert first["corpus"]["repository"] == CORPUS_REPOSITORY and first["corpus"]["commit"] == CORPUS_COMMIT
    assert set(first["corpus"]["sha256"]) == {"full_dialog.csv", "full_info.csv", "300_dialog.xlsx", "300_info.xlsx"}
    assert params_of(first["point"]) == fit_params(train)  # fitted on the training split only
    assert params_of(first["resamples"][0]) != params_of(first["resamples"][1])
    quality = first["quality"]
    assert quality["heldout_dialogues"] == 30 and quality["heldout_scored_dialogues"] == 20
    nll = quality["nll_per_dialogue"]
    assert nll["fitted"] < nll["hand_set"] and nll["ci95"][1] < 0  # the truth is far from the hand-set model
    rate = quality["calibration"]["fitted"]["donor_rate"]
    assert abs(rate["predicted"] - rate["observed"]) < 0.2  # 30 held-out dialogues


def test_the_shipped_fit_needs_no_corpus():
    release = load_release()
    assert release["version"] == FIT_VERSION and release["corpus"]["commit"] == CORPUS_COMMIT
    assert release["command"].startswith("simpop fit-p4g --corpus DIR")
    assert len(release["resamples"]) == 20 and release["split"]["heldout"] > 150
    nll = release["quality"]["nll_per_dialogue"]
    assert nll["fitted"] < nll["hand_set"] and nll["ci95"][1] < 0
    env = simpop.make("simpop/PersuasionAct-v0")
    simulator = build_simulator("persuadee:fitted-1?temperature=1.1&personas=human-300-2019", env=env)
    assert simulator.model.params == shipped_params(1) != shipped_params(0)
    assert len(simulator.personas) > 250 and not set(simulator.personas) & {env.load_scenario(i).persona
                                                                           for i in env.scenario_ids()}
    drawn = human_sampler().sample_many(500, np.random.default_rng(0))
    assert {p.sex for p in drawn} >= {"Male", "Female"}
    with pytest.raises(ValueError, match="fitted-0 .. fitted-19"):
        shipped_params(20)
