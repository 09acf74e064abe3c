"""Upstream's evaluation semantics: stripping, apply status, merge, conflict rules."""

from __future__ import annotations

import pytest

from simpop.envs.cooperbench.dataset import load_dataset
from simpop.envs.cooperbench.evaluator import Evaluator, patched_files


@pytest.fixture(scope="module")
def textkit():
    return load_dataset("mini").tasks["textkit/task1"]


@pytest.fixture(scope="module")
def lead():
    return Evaluator()


def test_lead_rule_lets_an_integrating_agent1_win(lead, textkit):
    # agent1 implemented both slug features; agent2's gold patch for feature 2 conflicts with it.
    both = lead.diff(textkit, {"textkit/slug.py": patched_files(textkit, textkit.combined_patch)["textkit/slug.py"]})
    result = lead.evaluate(textkit, 1, 2, both, textkit.features[2].patch)
    assert result.merge.status == "conflicts" and result.merge.strategy == "solo-agent1"
    assert result.both_passed and result.merge.merged_patch == ""


def test_union_rule_tests_the_union_merge(textkit):
    kvstore = load_dataset("mini").tasks["kvstore/task2"]
    union = Evaluator(conflict_rule="union")
    # Both features append methods at the end of the class: the union keeps both and works.
    result = union.evaluate(kvstore, 1, 2, kvstore.features[1].patch, kvstore.features[2].patch)
    assert result.merge.status == "conflicts" and result.merge.strategy == "union" and result.both_passed
    assert "def keys" in result.merge.merged_patch and "def __len__" in result.merge.merged_patch
    # Both change slugify's signature: the union has two signatures and fails.
    result = union.evaluate(textkit, 1, 2, textkit.features[1].patch, textkit.features[2].patch)
    assert result.merge.strategy == "union" and not result.both_passed
    with pytest.raises(ValueError, match="conflict_rule"):
        Evaluator(conflict_rule="ours")


def test_identical_patches_skip_the_merge(lead, textkit):
    result = lead.evaluate(textkit, 3, 4, textkit.combined_patch, textkit.combined_patch)
    assert result.merge.status == "identical" and result.merge.strategy == "skip-merge-identical"
    assert result.both_passed


def test_agent_test_files_are_stripped_and_bad_patches_reported(lead, textkit):
    # agent1 also rewrote the test file (which tests.patch must find intact): stripped before grading.
    sabotage = lead.diff(textkit, {
        "textkit/slug.py": patched_files(textkit, textkit.features[1].patch)["textkit/slug.py"],
        "tests/test_textkit.py": "def test_nothing():\n    pass\n"})
    assert "tests/test_textkit.py" in sabotage
    assert lead.test_feature(textkit, 1, sabotage).passed
    garbage = "diff --git a/textkit/wrap.py b/textkit/wrap.py\n--- a/textkit/wrap.py\n+++ b/textkit/wrap.py\n" \
              "@@ -1,1 +1,1 @@\n-no such line\n+x\n"
    result = lead.evaluate(textkit, 1, 3, sabotage, garbage)
    assert result.merge.apply_status == {"agent1": "applied", "agent2": "failed"}
    assert result.merge.status == "missing_input" and not result.both_passed
    assert result.feature1.error == result.feature2.error
    assert "did not apply" in result.feature1.error and "alone does not pass both" in result.feature1.error
    summary = result.to_dict()
    assert set(summary) == {"features", "both_passed", "conflict_rule", "apply_status", "rejected", "merge",
                            "feature1", "feature2", "duration_s"}
    assert summary["features"] == [1, 3] and summary["merge"]["status"] == "missing_input"


def test_empty_patches_are_skipped_and_fail(lead, textkit):
    result = lead.evaluate(textkit, 1, 3, "", "")
    assert result.merge.apply_status == {"agent1": "skipped", "agent2": "skipped"}
    assert result.merge.status == "clean" and not result.feature1.passed and not result.feature2.passed
    assert result.feature1.tests_passed == 4 and result.feature1.tests_failed == 1 and result.feature1.exit_code == 1


def test_a_test_run_already_made_is_answered_from_the_store(textkit):
    from simpop.envs.cooperbench import evaluator as module

    module.VERDICTS.clear()
    fresh, again = Evaluator(), Evaluator()  # the store is the process's, not one evaluator's
    first = fresh.test_feature(textkit, 1, textkit.features[1].patch)
    assert first.passed and module.VERDICTS.hits == 0
    second = again.test_feature(textkit, 1, textkit.features[1].patch)
    assert second == first and second is not first and module.VERDICTS.hits == 1
    # Another patch, another feature or other limits are other runs; an evaluator may opt out.
    assert not again.test_feature(textkit, 1, "").passed and module.VERDICTS.hits == 1
    tighter = Evaluator(limits=module.sandbox.Limits(timeout_s=100.0))
    assert tighter.test_feature(textkit, 1, textkit.features[1].patch).passed and module.VERDICTS.hits == 1
    kept = len(module.VERDICTS)
    assert Evaluator(reuse_verdicts=False).test_feature(textkit, 1, textkit.features[1].patch).passed
    assert module.VERDICTS.hits == 1 and len(module.VERDICTS) == kept  # neither read nor written

