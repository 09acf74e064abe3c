"""Claim verdicts from synthetic summaries, the markdown report, and the PNG curves."""

from __future__ import annotations

import numpy as np
import pytest

from simpop.experiments.collapse_report import (CONTRADICTS, INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED,
                                                SAME_DIRECTION, SUPPORTS, Comparison, ablation, ablation_section,
                                                choose_objective, collapse_curve, convergence_note, curve_section,
                                                curves, judge_claims, judged, plot_curves, plot_per_seed,
                                                render_report, stat, summary_table)

CONDITIONS = ("frozen", "verbalized", "cotrain", "population")


def _summary(per_condition: dict[str, dict[str, list[float]]]) -> dict:
    return {name: {"description": f"how {name} is built", "metrics": {k: stat(v) for k, v in metrics.items()}}
            for name, metrics in per_condition.items()}


def _metrics(train, heldout, entropy, zero_var, initial_train=0.3, initial_entropy=2.6, noise=0.0, n=5):
    rng = np.random.default_rng(int(1000 * (train + heldout + entropy + zero_var)))
    jitter = lambda v: list(v + noise * rng.standard_normal(n))  # noqa: E731
    return {"train_success": jitter(train), "heldout_success": jitter(heldout),
            "collapse_gap": jitter(train - heldout), "policy_entropy": jitter(entropy),
            "zero_var_frac": jitter(zero_var), "initial_train_success": jitter(initial_train),
            "initial_heldout_success": jitter(initial_train), "initial_policy_entropy": jitter(initial_entropy)}


def _paper_like(noise: float) -> dict:
    return _summary({"frozen": _metrics(0.95, 0.40, 0.1, 0.7, noise=noise),
                     **{c: _metrics(0.55, 0.55, 1.5, 0.1, noise=noise) for c in CONDITIONS[1:]}})


def test_comparison_status():
    assert Comparison("x", [0.2, 0.25, 0.3]).status == SUPPORTS
    assert Comparison("x", [0.5, -0.4, 0.1]).status == SAME_DIRECTION
    assert Comparison("x", [-0.2, -0.1, -0.3]).status == CONTRADICTS
    assert Comparison("x", [0.3]).status == SAME_DIRECTION  # one seed: no interval, never significant


def test_one_seed_compares_dialogue_by_dialogue_with_a_bootstrap_interval():
    rng = np.random.default_rng(0)
    n = 64

    def one_seed(train: float, initial: float, heldout: float, zero_var: float, entropy: float) -> dict:
        draw = lambda p: [int(x) for x in rng.random(n) < p]  # noqa: E731 - one evaluation's dialogues
        train_o, initial_o, held_o = draw(train), draw(initial), draw(heldout)
        return {"train_success": stat([np.mean(train_o)], [train_o]),
                "initial_train_success": stat([np.mean(initial_o)], [initial_o]),
                "heldout_success": stat([np.mean(held_o)], [held_o]),
                "collapse_gap": stat([np.mean(train_o) - np.mean(held_o)], [train_o, held_o],
                                     lambda a, b: float(a.mean() - b.mean())),
                "initial_heldout_success": stat([0.3]), "policy_entropy": stat([entropy]),
                "initial_policy_entropy": stat([2.0]),
                "zero_var_frac": stat([zero_var], [list(zero_var + 0.05 * rng.standard_normal(20))])}

    summary = {"frozen": {"description": "", "metrics": one_seed(0.9, 0.3, 0.3, 0.7, 0.3)},
               "verbalized": {"description": "", "metrics": one_seed(0.5, 0.3, 0.7, 0.1, 1.5)}}
    frozen = summary["frozen"]["metrics"]
    assert frozen["train_success"]["unit"] == "unit" and frozen["train_success"]["ci_low"] < frozen["train_success"]["mean"]
    assert frozen["collapse_gap"]["ci_low"] < frozen["collapse_gap"]["mean"] < frozen["collapse_gap"]["ci_high"]
    assert "per_unit" not in frozen["collapse_gap"] and frozen["policy_entropy"]["unit"] == "seed"
    a, b, c = judge_claims(summary)
    assert [x.unit for x in a.comparisons] == ["dialogue", "dialogue"] and a.verdict == REPRODUCED
    assert len(a.comparisons[0].differences) == n and a.comparisons[0].ci_low > 0
    assert {x.unit for x in b.comparisons} == {"seed"} and b.verdict == INCONCLUSIVE  # no per-dialogue entropy
    assert c.comparisons[0].unit == "update" and c.verdict == REPRODUCED
    unpaired = dict(summary, verbalized={"description": "", "metrics": {**one_seed(0.5, 0.3, 0.7, 0.1, 1.5),
                                                                       "heldout_success": stat([0.7])}})
    assert judge_claims(unpaired)[0].comparisons[1].unit == "seed"  # no units on one side: per seed


def test_paper_like_data_reproduces_every_claim():
    verdicts = judge_claims(_paper_like(noise=0.01))
    assert [v.claim for v in verdicts] == ["a", "b", "c"]
    assert [v.verdict for v in verdicts] == [REPRODUCED] * 3
    assert len(verdicts[0].comparisons) == 1 + 3  # rise of training success + one per fix


def test_opposite_data_is_not_reproduced():
    summary = _summary({"frozen": _metrics(0.5, 0.7, 2.0, 0.05, noise=0.01),
                        **{c: _metrics(0.6, 0.5, 1.0, 0.5, noise=0.01) for c in CONDITIONS[1:]}})
    assert [v.verdict for v in judge_claims(summary)] == [NOT_REPRODUCED] * 3


def test_noisy_right_direction_is_inconclusive():
    summary = _paper_like(noise=0.0)
    for name in CONDITIONS[1:]:  # fixes barely better, with spread that straddles zero
        summary[name]["metrics"]["heldout_success"] = stat([0.9, 0.0, 0.5, 0.1, 0.6])
    a = judge_claims(summary)[0]
    assert a.verdict == INCONCLUSIVE
    assert {c.status for c in a.comparisons[1:]} == {SAME_DIRECTION}


def test_entropy_must_fall_toward_zero():
    summary = _paper_like(noise=0.01)
    summary["frozen"]["metrics"]["policy_entropy"] = stat([2.0, 2.05, 1.95, 2.0, 2.0])  # fell, not near 0
    for name in CONDITIONS[1:]:
        summary[name]["metrics"]["policy_entropy"] = stat([2.3, 2.35, 2.25, 2.3, 2.3])
    b = judge_claims(summary)[1]
    assert b.verdict == NOT_REPRODUCED
    assert [c.status for c in b.comparisons][:2] == [SUPPORTS, CONTRADICTS]


def test_missing_frozen_condition_is_an_error():
    with pytest.raises(ValueError, match="frozen"):
        judge_claims({"verbalized": _paper_like(0.01)["verbalized"]})


def test_markdown_report_has_tables_verdicts_and_plots():
    conditions = _paper_like(noise=0.01)
    summary = {"conditions": conditions, "wall_time_s": 12.3,
               "setup": {"level": "act", "env_id": "simpop/PersuasionAct-v0", "seeds": [0, 1, 2, 3, 4], "updates": 10,
                         "batch_size": 16, "eval_every": 5, "eval_episodes": 8, "panel": "three held-out models"}}
    text = render_report(summary, judge_claims(conditions), ["/x/heldout_success.png"])
    assert summary_table(conditions) in text
    assert "### Claim (a): REPRODUCED" in text and "how population is built" in text
    assert "![heldout_success](heldout_success.png)" in text


def test_curves_and_plots(tmp_path):
    records = [{"condition": c, "seed": s, "step": step, "kind": "eval", "heldout_success": 0.1 * step + s,
                "train_success": 0.5, "policy_entropy": 1.0}
               for c in ("frozen", "cotrain") for s in (0, 1) for step in (0, 5, 10)]
    records += [{"condition": "frozen", "seed": 0, "step": 15, "kind": "eval", "heldout_success": 9.0}]  # seed 1 lacks it
    records += [{"condition": c, "seed": s, "step": step, "kind": "train", "zero_var_frac": 0.25}
                for c in ("frozen", "cotrain") for s in (0, 1) for step in (1, 2)]
    steps, mean, lo, hi = curves(records, "eval", "heldout_success")["frozen"]
    assert list(steps) == [0, 5, 10]  # step 15 was not reached by every seed
    assert np.allclose(mean, [0.5, 1.0, 1.5]) and (lo <= mean).all() and (hi >= mean).all()
    paths = plot_curves(records, tmp_path, order=("frozen", "cotrain"))
    assert sorted(p.name for p in paths) == ["heldout_success.png", "policy_entropy.png", "train_success.png",
                                             "zero_var_frac.png"]  # no robustness-panel values: no such plot
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def _ablation_conditions(diffs: dict[str, tuple[float, float]], noise: float = 0.01, n: int = 10) -> dict:
    """``cotrain`` at 0.5 on both panels and ``cotrain+<objective>`` shifted by (held-out, robust) differences."""
    rng = np.random.default_rng(7)
    per_condition = {"cotrain": {"heldout_success": [0.5] * n, "robust_success": [0.4] * n}}
    for objective, (held, robust) in diffs.items():
        per_condition[f"cotrain+{objective}"] = {
            "heldout_success": list(0.5 + held + noise * rng.standard_normal(n)),
            "robust_success": list(0.4 + robust + noise * rng.standard_normal(n))}
    return _summary(per_condition)


@pytest.mark.parametrize("diffs, chosen", [
    ({"persona": (0.05, 0.0)}, "persona"),  # better on the project panel, not worse on the robustness panel
    ({"persona": (0.05, -0.05)}, "target"),  # ... but significantly worse on the robustness panel
    ({"persona": (0.0, 0.1)}, "target"),  # the robustness panel alone decides nothing
    ({"realism": (0.2, 0.2)}, "target"),  # needs a corpus: never the default
    ({"persona": (0.050, 0.0), "diverse": (0.052, 0.0)}, "persona"),  # a tie goes to the simpler objective
    ({"persona": (0.05, 0.0), "diverse": (0.10, 0.0)}, "diverse"),
])
def test_default_objective_follows_the_stated_rule(diffs, chosen):
    conditions = _ablation_conditions(diffs, noise=0.0 if len(diffs) > 1 else 0.01)
    rows = ablation(conditions)
    assert [r["condition"] for r in rows] == [f"cotrain+{o}" for o in diffs]
    assert choose_objective(rows)[0] == chosen
    section = ablation_section(conditions)
    assert f"**{chosen}**" in section and "| cotrain+" in section


def _curve_records(heldout, entropy, zero_var, seeds=range(6), step=10):
    records = []
    for s in seeds:
        for i, (h, e) in enumerate(zip(heldout, entropy)):
            records.append({"condition": "frozen", "seed": s, "kind": "eval", "step": i * step,
                            "heldout_success": h + 0.01 * s, "policy_entropy": e - 0.001 * s})
        records += [{"condition": "frozen", "seed": s, "kind": "train", "step": u, "zero_var_frac": z}
                    for u, z in enumerate(zero_var, start=1)]
    return records


def test_collapse_curve_split_half_peak_then_decline():
    rise_fall = _curve_records([0.2, 0.6, 0.7, 0.5, 0.4], [2.0, 1.5, 1.0, 0.6, 0.3], [0.1] * 15 + [0.95] * 25)
    curve = collapse_curve(rise_fall)
    assert (curve["peak_step"], curve["peak_seeds"], curve["test_seeds"]) == (20, [0, 1, 2], [3, 4, 5])
    assert curve["peaks_then_declines"] and curve["decline"]["mean"] == pytest.approx(-0.3)
    saturation = curve["entropy_after_saturation"]
    assert saturation["from_step"] == 20 and saturation["keeps_falling"]  # zero-var >= 0.9 from update 16
    assert "Peaks then declines: yes" in curve_section(curve) and "Keeps falling: yes" in curve_section(curve)
    plateau = collapse_curve(_curve_records([0.2, 0.6, 0.6, 0.6, 0.6], [2.0, 1.0, 1.0, 1.0, 1.0], [0.1] * 40))
    assert not plateau["peaks_then_declines"] and plateau["entropy_after_saturation"] is None
    assert "not tested" in curve_section(plateau)
    assert collapse_curve(_curve_records([0.2, 0.6, 0.5], [1, 1, 1], [0.1], seeds=range(3))) is None  # < 4 seeds


def test_convergence_note_names_conditions_still_moving():
    flat = _summary({"frozen": {"late_change": [0.01, -0.01, 0.0]}, "cotrain": {"late_change": [0.1, 0.08, 0.09]}})
    note = convergence_note(flat)
    assert "not converged: cotrain +0.090" in note and "frozen +0.000" in note
    assert "every condition converged" in convergence_note({"frozen": flat["frozen"]})


def test_per_seed_plots(tmp_path):
    records = _curve_records([0.2, 0.5, 0.6], [1, 1, 1], [0.1], seeds=range(3))
    records += [{**r, "condition": "cotrain"} for r in records]
    paths = plot_per_seed(records, tmp_path, order=("frozen", "cotrain"))
    assert [p.name for p in paths] == ["heldout_success_per_seed.png"]  # no robustness-panel values: no plot
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_claims_need_frozen_and_a_fix():
    conditions = _paper_like(noise=0.01)
    assert judged(conditions) and not judged({"frozen": conditions["frozen"]})
    assert not judged({c: conditions[c] for c in CONDITIONS[1:]})
    summary = {"conditions": {"frozen": conditions["frozen"]}, "wall_time_s": 1.0,
               "setup": {"level": "act", "env_id": "simpop/PersuasionAct-v0", "seeds": [0, 1], "updates": 10,
                         "batch_size": 16, "eval_every": 5, "eval_episodes": 8, "panel": "p"}}
    assert "Not judged: the claims compare frozen with the fixes" in render_report(summary, [], [])
