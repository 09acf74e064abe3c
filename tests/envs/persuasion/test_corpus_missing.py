"""Issue 18 item 6: an empty persona cell is imputed and named, never costs the dialogue or its outcome."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import numpy as np
import pytest

from simpop.envs.persuasion.corpus import fit_params, load_corpus
from simpop.envs.persuasion.personas import PERSONA_FIELDS, modal_persona

from tests.envs.persuasion.p4g_fixture import write_p4g_corpus


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return list(csv.reader(f))


def _write(path: Path, rows: list[list[str]]) -> None:
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(rows)


def _persuadee_row(rows: list[list[str]], dialogue_id: str) -> list[str]:
    return next(r for r in rows[1:] if r[0] == dialogue_id and r[2] == "1")


@pytest.fixture
def small(tmp_path) -> Path:
    return write_p4g_corpus(tmp_path / "p4g", n_dialogues=8, n_annotated=0, seed=3)


def test_one_empty_persona_cell_keeps_the_dialogue_and_its_outcome(small, caplog):
    complete = load_corpus(small)
    assert complete.skipped == 0 and 0 < complete.donor_rate < 1
    non_donor = next(d for d in complete.dialogues if not d.donated)
    info = small / "full_info.csv"
    rows = _rows(info)
    column = rows[0].index("open.x")
    _persuadee_row(rows, non_donor.id)[column] = ""   # the original input: one empty cell
    _write(info, rows)

    with caplog.at_level(logging.WARNING, logger="simpop.envs.persuasion.corpus"):
        corpus = load_corpus(small)
    assert corpus.skipped == 0 and len(corpus.dialogues) == len(complete.dialogues)
    kept = next(d for d in corpus.dialogues if d.id == non_donor.id)
    assert kept.donation == non_donor.donation == 0.0 and kept.n_turns == non_donor.n_turns
    assert kept.utterances == non_donor.utterances
    assert kept.imputed == ("open",) and kept.persuader_imputed == ()
    others = [float(_persuadee_row(rows, d.id)[column]) for d in complete.dialogues if d.id != non_donor.id]
    assert kept.persuadee_persona.open == pytest.approx(float(np.median(others)))
    for name in PERSONA_FIELDS:  # every other attribute is read as before
        if name != "open":
            assert getattr(kept.persuadee_persona, name) == getattr(non_donor.persuadee_persona, name)
    assert corpus.donor_rate == complete.donor_rate and corpus.mean_donation == complete.mean_donation
    assert [d.id for d in corpus.imputed] == [non_donor.id]
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert non_donor.id in warning and "'open.x'" in warning and "persuadee" in warning


def test_small_corpus_still_fits_when_every_non_donor_has_a_hole(small):
    """Skipping these dialogues made the donor rate 100% and fit_params refuse."""
    complete = load_corpus(small)
    info = small / "full_info.csv"
    rows = _rows(info)
    for i, dialogue in enumerate(d for d in complete.dialogues if not d.donated):
        column = rows[0].index(f"{('age', 'ideology', 'care')[i % 3]}.x")
        _persuadee_row(rows, dialogue.id)[column] = "NA"
    _write(info, rows)
    corpus = load_corpus(small)
    assert corpus.donor_rate == complete.donor_rate < 1
    assert {d.id for d in corpus.imputed} == {d.id for d in complete.dialogues if not d.donated}
    fit_params(corpus)  # raised CorpusError("corpus donor rate is 100% ...") before the fix


def test_categorical_cell_takes_the_most_frequent_value_and_persuader_holes_are_marked(small, caplog):
    complete = load_corpus(small)
    info = small / "full_info.csv"
    rows = _rows(info)
    first = complete.dialogues[0]
    sex = rows[0].index("sex.x")
    _persuadee_row(rows, first.id)[sex] = "nan"
    persuader_row = next(r for r in rows[1:] if r[0] == first.id and r[2] == "0")
    persuader_row[rows[0].index("income.x")] = ""
    _write(info, rows)
    with caplog.at_level(logging.WARNING, logger="simpop.envs.persuasion.corpus"):
        corpus = load_corpus(small)
    kept = corpus.dialogues[0]
    values = [_persuadee_row(rows, d.id)[sex] for d in complete.dialogues[1:]]
    assert kept.imputed == ("sex",) and kept.persuadee_persona.sex == max(sorted(set(values)), key=values.count)
    assert kept.persuader_persona is not None and kept.persuader_imputed == ("income",)
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "persuader" in warning and "'income.x'" in warning and first.id in warning


def test_a_column_empty_everywhere_falls_back_to_the_default_mode(small):
    info = small / "full_info.csv"
    rows = _rows(info)
    column = rows[0].index("religion.x")
    for row in rows[1:]:
        row[column] = ""
    _write(info, rows)
    corpus = load_corpus(small)
    assert len(corpus.dialogues) == 8 and all(d.imputed == ("religion",) for d in corpus.dialogues)
    assert {d.persuadee_persona.religion for d in corpus.dialogues} == {modal_persona().religion}


def test_skipped_dialogues_are_named(small, caplog):
    complete = load_corpus(small)
    info = small / "full_info.csv"
    rows = _rows(info)
    gone = complete.dialogues[2].id
    _persuadee_row(rows, gone)[rows[0].index("B6")] = ""   # the outcome itself is missing: cannot be imputed
    _write(info, rows)
    with caplog.at_level(logging.WARNING, logger="simpop.envs.persuasion.corpus"):
        corpus = load_corpus(small)
    assert corpus.skipped == 1 and gone not in {d.id for d in corpus.dialogues}
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert gone in warning and "'B6'" in warning


def test_donations_above_the_task_payment_are_skipped_and_named(small, caplog):
    """The real full_info.csv has 35 persuadees with B6 above the $2 task payment (50, 100, up to 700)."""
    complete = load_corpus(small)
    info = small / "full_info.csv"
    rows = _rows(info)
    donors = [d.id for d in complete.dialogues if d.donated]
    outliers = donors[:2]
    for dialogue_id, value in zip(outliers, ("50", "700")):
        _persuadee_row(rows, dialogue_id)[rows[0].index("B6")] = value
    _persuadee_row(rows, donors[2])[rows[0].index("B6")] = "2"  # the whole payment is allowed
    _write(info, rows)
    with caplog.at_level(logging.WARNING, logger="simpop.envs.persuasion.corpus"):
        corpus = load_corpus(small)
    assert corpus.skipped == 2 and not set(outliers) & {d.id for d in corpus.dialogues}
    assert max(d.donation for d in corpus.dialogues) == 2.0
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert all(i in warning for i in outliers) and "more than the task's $2" in warning
    fit_params(corpus)  # fits: the mean donation per donor is within the amount levels again


def test_strategy_effects_converge_without_overflow_on_separable_data():
    """Donors are exactly those who heard more credibility than logical appeals: the undamped Newton iteration
    (before the fix) overflowed here, as on the real corpus; the damped one stays finite and finds the sign."""
    from types import SimpleNamespace

    from simpop.envs.persuasion.acts import STRATEGIES
    from simpop.envs.persuasion.corpus import Utterance, strategy_effects
    from simpop.envs.persuasion.model import PersuadeeParams

    rng = np.random.default_rng(0)
    dialogues = []
    for _ in range(60):
        counts = rng.integers(0, 16, size=len(STRATEGIES)) * (rng.random(len(STRATEGIES)) < 0.3)
        utterances = tuple(Utterance(t, "persuader", "", (s,)) for s, n in zip(STRATEGIES, counts) for t in range(n))
        dialogues.append(SimpleNamespace(utterances=utterances, donated=bool(counts[2] > counts[0])))
    with np.errstate(over="raise", invalid="raise"):
        effects = strategy_effects(dialogues, np.array(PersuadeeParams().act_effects[:len(STRATEGIES)]))
    assert np.all(np.isfinite(effects)) and effects[2] > 1.0 and effects[0] < 0
