"""The P4G corpus loader and fitting, on a small corpus written in the real file schema."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from simpop.envs.persuasion.acts import PERSUADEE_ACTS, PERSUADER_ACTS, STRATEGIES
from simpop.envs.persuasion.corpus import (CorpusError, Dialogue, Utterance, fit_params, load_corpus,
                                           response_counts, strategy_effects)
from simpop.envs.persuasion.env import PersuasionActEnv
from simpop.envs.persuasion.model import AMOUNT_LEVELS, PersuadeeParams, asked_inclinations, expected_outcomes
from simpop.envs.persuasion.personas import PERSONA_FIELDS, modal_persona

from tests.envs.persuasion.p4g_fixture import write_p4g_corpus, write_xlsx


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    return write_p4g_corpus(tmp_path_factory.mktemp("p4g"))


def read_csv(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return list(csv.reader(f))


def write_csv(path: Path, rows: list[list[str]]) -> None:
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(rows)


def copy_corpus(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_loads_dialogues_personas_and_outcomes(corpus_dir):
    corpus = load_corpus(corpus_dir)
    assert len(corpus.dialogues) == 20 and corpus.skipped == 0 and len(corpus.annotated) == 12
    info = read_csv(corpus_dir / "full_info.csv")
    header, rows = info[0], {(r[0], r[2]): r for r in info[1:]}
    first = corpus.dialogues[0]
    persuadee_row = rows[(first.id, "1")]
    for name in ("care", "income", "sex", "ideology", "age"):
        value = persuadee_row[header.index(f"{name}.x")]
        got = getattr(first.persuadee_persona, name)
        assert (got == value) if isinstance(got, str) else got == pytest.approx(float(value))
    assert first.donation == pytest.approx(float(persuadee_row[3])) and first.n_turns == int(persuadee_row[4])
    assert first.persuader_persona is not None and first.persuader_persona != first.persuadee_persona
    assert first.intended == pytest.approx(first.donation)
    assert corpus.dialogues[-1].intended is None and not corpus.dialogues[-1].annotated
    assert first.utterances[0].role == "persuader" and first.utterances[0].labels == ("greeting",)
    assert 0 < corpus.donor_rate < 1 and corpus.mean_donation == pytest.approx(
        np.mean([d.donation for d in corpus.dialogues]))
    assert corpus.persona_sampler().sample(np.random.default_rng(0)) in corpus.personas()


def test_plain_persona_column_names_are_accepted(tmp_path):
    corpus = load_corpus(write_p4g_corpus(tmp_path, n_dialogues=4, n_annotated=0, suffix=""))
    assert len(corpus.dialogues) == 4 and not corpus.annotated


def test_annotated_files_are_optional(tmp_path, corpus_dir):
    d = copy_corpus(corpus_dir, tmp_path / "c")
    (d / "300_dialog.xlsx").unlink()
    (d / "300_info.xlsx").unlink()
    corpus = load_corpus(d)
    assert len(corpus.dialogues) == 20 and not corpus.annotated and corpus.dialogues[0].intended is None


def test_response_counts_follow_the_annotations(corpus_dir):
    counts = response_counts(load_corpus(corpus_dir).annotated)
    greeting = counts[PERSUADER_ACTS.index("greeting")]
    assert greeting.sum() == 12 and PERSUADEE_ACTS[int(np.argmax(greeting))] == "greeting"
    ask = counts[PERSUADER_ACTS.index("proposition-of-donation")]
    assert ask.sum() == 12 and set(np.nonzero(ask)[0]) <= {PERSUADEE_ACTS.index(a) for a in
                                                            ("agree-donation", "disagree-donation")}


def test_unmodelled_persuader_labels_break_the_chain():
    who = modal_persona()
    utts = (Utterance(0, "persuader", "hi", ("greeting",)), Utterance(0, "persuadee", "hi", ("greeting",)),
            Utterance(1, "persuader", "nice", ("comment-partner",)), Utterance(1, "persuadee", "ok", ("thank",)),
            Utterance(2, "persuader", "thanks", ("thank",)), Utterance(2, "persuadee", "bye", ("closing",)))
    counts = response_counts([Dialogue("d", utts, who, None, 0.0, None, 3)])
    assert counts.sum() == 2
    assert counts[PERSUADER_ACTS.index("closing"), PERSUADEE_ACTS.index("closing")] == 1


def test_strategy_effects_follow_the_evidence_and_shrink_to_the_prior():
    who, prior = modal_persona(), np.full(len(STRATEGIES), 0.2)
    dialogues = []
    for i in range(60):
        uses = i % 4  # emotion-appeal uses; donors are those who heard it at least twice
        utts = tuple(Utterance(t, "persuader", "x", ("emotion-appeal",)) for t in range(uses))
        dialogues.append(Dialogue(str(i), utts, who, None, 1.0 if uses >= 2 else 0.0, None, 10))
    emotion = STRATEGIES.index("emotion-appeal")
    loose = strategy_effects(dialogues, prior, ridge=0.1)
    tight = strategy_effects(dialogues, prior, ridge=1e4)
    assert loose[emotion] > 1.0
    assert np.allclose(np.delete(loose, emotion), 0.2, atol=1e-6)
    assert tight[emotion] == pytest.approx(0.2, abs=0.05)


def test_fit_params_reproduces_the_corpus(corpus_dir):
    corpus = load_corpus(corpus_dir)
    params = fit_params(corpus)
    assert isinstance(params, PersuadeeParams) and params != PersuadeeParams()
    table = np.array(params.response_logits).reshape(len(PERSUADER_ACTS), len(PERSUADEE_ACTS))
    assert np.allclose(np.exp(table).sum(axis=1), 1.0)
    assert np.exp(params.amount_logits).sum() == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    rate, mean = expected_outcomes(params, asked_inclinations(params, corpus.personas() * 100, rng))
    assert rate == pytest.approx(corpus.donor_rate, abs=0.04)
    assert mean == pytest.approx(corpus.mean_donation, abs=0.04)
    donors = [d.donation for d in corpus.dialogues if d.donated]
    most_common = max(set(donors), key=donors.count)
    assert AMOUNT_LEVELS[int(np.argmax(params.amount_logits))] == pytest.approx(most_common)


def test_envs_take_corpus_personas(corpus_dir):
    env = PersuasionActEnv(corpus_dir=corpus_dir)
    corpus = load_corpus(corpus_dir)
    assert env.scenario_ids() == [f"p4g-corpus-{d.id}" for d in corpus.dialogues]
    env.reset(seed=0, options={"scenario_id": env.scenario_ids()[3]})
    assert env.scenario.persona == corpus.dialogues[3].persuadee_persona


# ------------------------------------------------------------------ malformed input
def test_missing_directory_and_files(tmp_path, corpus_dir):
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus(tmp_path / "nowhere")
    d = copy_corpus(corpus_dir, tmp_path / "c")
    (d / "full_info.csv").unlink()
    with pytest.raises(CorpusError, match="full_info.csv: not found"):
        load_corpus(d)


@pytest.mark.parametrize("file, column", [("full_dialog.csv", "Unit"), ("full_dialog.csv", "B2"),
                                          ("full_info.csv", "B6"), ("full_info.csv", "B3")])
def test_missing_column_is_named(tmp_path, corpus_dir, file, column):
    d = copy_corpus(corpus_dir, tmp_path / "c")
    rows = read_csv(d / file)
    rows[0] = ["renamed" if h == column else h for h in rows[0]]
    write_csv(d / file, rows)
    with pytest.raises(CorpusError, match=rf"{file}: missing column '{column}'"):
        load_corpus(d)


def test_missing_persona_column_names_both_spellings(tmp_path, corpus_dir):
    d = copy_corpus(corpus_dir, tmp_path / "c")
    rows = read_csv(d / "full_info.csv")
    rows[0] = ["carefulness" if h == "care.x" else h for h in rows[0]]
    write_csv(d / "full_info.csv", rows)
    with pytest.raises(CorpusError, match=r"full_info.csv: missing column 'care' or 'care.x'"):
        load_corpus(d)


@pytest.mark.parametrize("column, value, message", [
    ("B6", "lots", r"full_info.csv: row 3, column 'B6' has 'lots'; expected a number"),
    ("B6", "-1", r"full_info.csv: row 3, column 'B6' has -1.0; a donation cannot be negative"),
    ("care.x", "9", r"full_info.csv: row 3: care=9.0 is outside its scale"),
    ("B4", "x", r"full_info.csv: row 3, column 'B4' has 'x'"),
])
def test_malformed_values_are_located(tmp_path, corpus_dir, column, value, message):
    d = copy_corpus(corpus_dir, tmp_path / "c")
    rows = read_csv(d / "full_info.csv")
    rows[2][rows[0].index(column)] = value  # row 3 of the file: the first dialogue's persuadee
    write_csv(d / "full_info.csv", rows)
    with pytest.raises(CorpusError, match=message):
        load_corpus(d)


def test_bad_role_in_dialog_file(tmp_path, corpus_dir):
    d = copy_corpus(corpus_dir, tmp_path / "c")
    rows = read_csv(d / "full_dialog.csv")
    rows[1][3] = "7"
    write_csv(d / "full_dialog.csv", rows)
    with pytest.raises(CorpusError, match=r"full_dialog.csv: row 2, column 'B4' has '7'; expected 0 or 1"):
        load_corpus(d)


def test_incomplete_dialogues_are_skipped_and_counted(tmp_path, corpus_dir):
    d = copy_corpus(corpus_dir, tmp_path / "c")
    rows = read_csv(d / "full_info.csv")
    rows[2][rows[0].index("open.x")] = "NA"          # first dialogue: persona cell missing
    rows[6][rows[0].index("B6")] = ""                # third dialogue: donation missing
    rows[8][rows[0].index("B7")] = ""                # fourth dialogue: turns counted instead
    rows = [r for r in rows if r[0] != rows[4][0]]   # second dialogue: no info rows at all
    write_csv(d / "full_info.csv", rows)
    corpus = load_corpus(d)
    assert corpus.skipped == 2 and len(corpus.dialogues) == 18  # the empty persona cell is imputed, not skipped
    assert corpus.dialogues[0].imputed == ("open",) and [x.id for x in corpus.imputed] == [corpus.dialogues[0].id]
    fourth = corpus.dialogues[1]
    assert fourth.n_turns == len({u.turn for u in fourth.utterances}) == load_corpus(corpus_dir).dialogues[3].n_turns


def test_annotated_workbook_needs_labels(tmp_path, corpus_dir):
    d = copy_corpus(corpus_dir, tmp_path / "c")
    write_xlsx(d / "300_dialog.xlsx", ["Unit", "Turn", "B4", "B2", "er_label_1"], [["hi", 0, 0, "x", "greeting"]])
    with pytest.raises(CorpusError, match=r"300_dialog.xlsx: missing column 'ee_label_1'"):
        load_corpus(d)


def test_damaged_workbook(tmp_path, corpus_dir):
    d = copy_corpus(corpus_dir, tmp_path / "c")
    (d / "300_info.xlsx").write_bytes(b"not a zip file")
    with pytest.raises(CorpusError, match=r"300_info.xlsx: not a readable .xlsx"):
        load_corpus(d)


def test_empty_and_undecodable_csv(tmp_path, corpus_dir):
    d = copy_corpus(corpus_dir, tmp_path / "c")
    (d / "full_dialog.csv").write_text("")
    with pytest.raises(CorpusError, match="full_dialog.csv: empty file"):
        load_corpus(d)
    (d / "full_dialog.csv").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(CorpusError, match="full_dialog.csv: not a readable UTF-8"):
        load_corpus(d)


def test_persona_fields_cover_the_info_header(corpus_dir):
    header = read_csv(corpus_dir / "full_info.csv")[0]
    assert [h.removesuffix(".x") for h in header[5:]] == list(PERSONA_FIELDS)
