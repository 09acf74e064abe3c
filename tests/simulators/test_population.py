"""Populations, checkpoint pools and held-out panels."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from simpop.simulators.population import CheckpointPool, Panel, PanelOverlapError, Population, leaf_simulators
from tests.simulators.fakes import EchoSimulator


def rngs(n: int, seed: int = 0) -> list[np.random.Generator]:
    return [np.random.default_rng([seed, i]) for i in range(n)]


def start(pop: Population, n: int, seed: int = 0) -> list[str]:
    """Reset ``n`` slots and return which member drives each."""
    pop.reset_batch([None] * n, rngs(n, seed))
    return [pop.member(i).name for i in range(n)]


def test_uniform_and_weighted_rules():
    members = [EchoSimulator("a"), EchoSimulator("b"), EchoSimulator("c")]
    counts = Counter(start(Population(members), 3000))
    assert all(c / 3000 == pytest.approx(1 / 3, abs=0.04) for c in counts.values())
    weighted = Population([EchoSimulator("a"), EchoSimulator("b")], weights=[3, 1], rule="weighted")
    assert weighted.probabilities() == pytest.approx([0.75, 0.25])
    assert Counter(start(weighted, 2000))["a"] / 2000 == pytest.approx(0.75, abs=0.04)


def test_choices_are_reproducible_from_the_slot_generators():
    pop = Population([EchoSimulator("a"), EchoSimulator("b")])
    assert start(pop, 50, seed=4) == start(pop, 50, seed=4) != start(pop, 50, seed=5)


def test_act_batch_makes_one_call_per_member_and_maps_slots():
    a, b = EchoSimulator("a"), EchoSimulator("b")
    pop = Population([a, b])
    drivers = start(pop, 20)
    actions = pop.act_batch(["obs"] * 20, list(range(20)))
    assert len(a.calls) == 1 and len(b.calls) == 1
    assert [x.split(":")[0] for x in actions] == drivers
    # Member slots are numbered 0..m-1 in population-slot order.
    assert sorted(a.calls[0]) == list(range(drivers.count("a")))
    subset = [3, 7, 1]
    assert pop.act_batch(["obs"] * 3, subset) == [actions[i] for i in subset]


def test_feedback_reaches_the_driving_member_and_prioritises_failures():
    a, b = EchoSimulator("a"), EchoSimulator("b")
    pop = Population([a, b], rule="prioritised", window=10, min_probability=0.1)
    assert pop.probabilities() == pytest.approx([0.5, 0.5])
    drivers = start(pop, 40)
    # The policy always fails against "a" and always succeeds against "b".
    pop.feedback(list(range(40)), [0.0 if d == "a" else 1.0 for d in drivers])
    assert [r for _, r in a.rewards] == [0.0] * drivers.count("a")
    assert pop.failure_rates() == pytest.approx([11 / 12, 1 / 12])  # window of 10, Beta(1, 1) smoothing
    p = pop.probabilities()
    assert p[0] > 0.8 and p[1] >= 0.1 and sum(p) == pytest.approx(1.0)
    assert Counter(start(pop, 2000))["b"] / 2000 == pytest.approx(p[1], abs=0.03)


def test_prioritised_never_starves_a_member():
    pop = Population([EchoSimulator(c) for c in "abcd"], rule="prioritised", window=5, min_probability=0.05)
    drivers = start(pop, 200)
    pop.feedback(list(range(200)), [0.0 if d == "a" else 1.0 for d in drivers])
    assert min(pop.probabilities()) >= 0.05
    with pytest.raises(ValueError, match="min_probability"):
        Population([EchoSimulator(c) for c in "abc"], rule="prioritised", min_probability=0.4)


def test_nested_populations_resolve_the_concrete_member():
    inner = Population([EchoSimulator("x"), EchoSimulator("y")], name="inner")
    outer = Population([inner, EchoSimulator("z")], weights=[1, 0], rule="weighted")
    names = start(outer, 30)
    assert set(names) == {"x", "y"}
    assert [a.split(":")[0] for a in outer.act_batch(["o"] * 30, list(range(30)))] == names
    assert [s.name for s in leaf_simulators([outer])] == ["x", "y", "z"]


def test_population_errors_are_clear():
    a = EchoSimulator("a")
    with pytest.raises(ValueError, match="rule"):
        Population([a], rule="random")
    with pytest.raises(ValueError, match="already a member"):
        Population([a, a])
    with pytest.raises(ValueError, match="unique name"):
        Population([a, EchoSimulator("a")])
    with pytest.raises(ValueError, match="weights"):
        Population([a], weights=[1, 2])
    with pytest.raises(ValueError, match="weights"):
        Population([a], weights=[-1])
    with pytest.raises(ValueError, match="no members"):
        Population([]).probabilities()
    with pytest.raises(IndexError, match="reset_batch"):
        Population([a]).act_batch(["o"], [0])


def test_checkpoint_pool_is_bounded_recent_and_frozen():
    trainable = EchoSimulator("sim")
    pool = CheckpointPool(max_size=3, recency=0.5)
    for step in range(5):
        trainable.level += 1
        pool.add_snapshot(trainable, step)
    assert [s.name for s in pool.members] == ["sim@2", "sim@3", "sim@4"]
    assert [float(s.level[0]) for s in pool.members] == [3.0, 4.0, 5.0]  # deep copies, frozen
    assert pool.probabilities() == pytest.approx([1 / 7, 2 / 7, 4 / 7])
    assert Counter(start(pool, 2100))["sim@4"] / 2100 == pytest.approx(4 / 7, abs=0.04)


def test_checkpoint_pool_uses_the_simulators_own_snapshot():
    class Light(EchoSimulator):
        def snapshot(self):
            clone = Light(self.name)
            clone.level = self.level.copy()
            clone.light = True
            return clone

    pool = CheckpointPool(max_size=2)
    frozen = pool.add_snapshot(Light("lora"), step=10)
    assert frozen.light and frozen.name == "lora@10"

    class Broken(EchoSimulator):
        def snapshot(self):
            return self

    with pytest.raises(ValueError, match="frozen copy"):
        pool.add_snapshot(Broken("b"), step=1)


def held_out(name="held", model="other", personas="heldout", decoding=None):
    return EchoSimulator(name, model, personas, decoding or {"temperature": 1.0})


def test_panel_accepts_a_held_out_member():
    training = Population([EchoSimulator("t1"), EchoSimulator("t2", decoding={"temperature": 0.5})])
    panel = Panel([held_out()], training=training)
    assert len(panel) == 1 and panel["held"].name == "held" and [n for n, _ in panel] == ["held"]


@pytest.mark.parametrize(("member", "message"), [
    (lambda train: train[0], "is also a training simulator"),
    (lambda train: EchoSimulator("twin"), "is also a training simulator"),
    (lambda train: held_out(personas="p"), "shares persona set 'p'"),
    (lambda train: held_out(decoding={"temperature": 0.0}), "shares decoding settings"),
    (lambda train: held_out(model="m"), "the model of every training simulator"),
])
def test_strict_panel_rejects_each_overlap(member, message):  # the default rule: tests/test_heldout_rule.py
    train = [EchoSimulator("t1")]
    with pytest.raises(PanelOverlapError, match=message):
        Panel([member(train)], training=train, strict=True)
    panel = Panel([member(train)])
    with pytest.raises(PanelOverlapError, match=message):
        panel.check_disjoint(Population(train), strict=True)


def test_panel_model_rule_allows_sharing_one_of_several_training_models():
    train = [EchoSimulator("t1", model="m"), EchoSimulator("t2", model="n", decoding={"temperature": 0.5})]
    Panel([held_out(model="m")], training=train, strict=True)
    with pytest.raises(PanelOverlapError, match="no training simulators"):
        Panel([held_out()], training=[])
