"""Pool members' contributions, reweighting and pruning (simpop.simulators.population)."""

from __future__ import annotations

import numpy as np
import pytest

from simpop.simulators.population import Population
from tests.simulators.fakes import EchoSimulator


def pool(*names: str) -> Population:
    return Population([EchoSimulator(n) for n in names], window=40)


def feed(pop: Population, member: str, informative: bool, n_groups: int = 5, size: int = 4, win_rate: float = 0.5):
    """``n_groups`` groups driven by ``member``: rewards vary inside a group iff ``informative``."""
    for g in range(n_groups):  # one update per group (groups are judged within one record_groups call)
        rewards = [float(i < size * win_rate) for i in range(size)] if informative else [0.0] * size
        pop.record_groups([member] * size, [g] * size, rewards)


def test_contributions_count_informative_groups_and_improvement():
    pop = pool("a", "b")
    feed(pop, "a", informative=True)
    feed(pop, "b", informative=False)
    pop.record_groups(["zz"], [0], [1.0])  # not a member: ignored
    c = pop.contributions()
    assert c["a"].informative_share == 1.0 and c["a"].success == 0.5 and c["a"].dialogues == 20
    assert c["b"].informative_share == 0.0 and c["b"].success == 0.0
    late = pool("a")
    late.record_groups(["a"] * 8, [0, 0, 1, 1, 2, 2, 3, 3], [0, 0, 0, 0, 1, 1, 1, 1])
    assert late.contributions()["a"].improvement == 1.0


def test_mixed_groups_judge_each_dialogue_by_its_group():
    pop = pool("a", "b")
    pop.record_groups(["a", "b", "a", "b"], [0, 0, 1, 1], [1.0, 0.0, 0.0, 0.0])
    c = pop.contributions()
    assert c["a"].informative_share == 0.5 and c["b"].informative_share == 0.5


def test_reweight_follows_informative_share_with_a_floor():
    pop = pool("a", "b", "c")
    feed(pop, "a", informative=True)
    feed(pop, "b", informative=False)
    weights = pop.reweight(floor=0.1)
    assert weights == {"a": 1.0, "b": 0.1, "c": 1.0} and pop.rule == "weighted"
    assert pop.probabilities() == pytest.approx([1 / 2.1, 0.1 / 2.1, 1 / 2.1])


def test_prune_retires_silent_members_then_keeps_within_the_cap():
    pop = pool("a", "b", "c", "d", "e")
    feed(pop, "a", informative=True)
    feed(pop, "b", informative=False)  # no signal: retired
    for name in ("c", "d"):
        feed(pop, name, informative=True, n_groups=2)
        feed(pop, name, informative=False, n_groups=2)  # half informative
    removed = pop.prune(cap=3, min_informative=0.05, min_dialogues=16)
    assert removed[0] == "b" and len(pop.members) == 3
    assert "a" in [m.name for m in pop.members] and "e" in [m.name for m in pop.members]  # e: not judged yet


def test_prune_never_removes_the_last_member_or_a_protected_one():
    pop = pool("a")
    feed(pop, "a", informative=False)
    assert pop.prune(cap=1) == [] and [m.name for m in pop.members] == ["a"]
    pop = pool("a", "b", "c")
    for name in ("a", "b", "c"):
        feed(pop, name, informative=False)
    removed = pop.prune(cap=1, protected={"a"})
    assert [m.name for m in pop.members] == ["a"] and sorted(removed) == ["b", "c"]
    silent = pool("x", "y")
    feed(silent, "x", informative=False)
    feed(silent, "y", informative=False)
    assert len(silent.prune(cap=5)) == 1 and len(silent.members) == 1  # the last silent member stays


@pytest.mark.parametrize("seed", range(5))
def test_random_pools_stay_within_the_cap(seed):
    rng = np.random.default_rng(seed)
    pop = pool(*[f"m{i}" for i in range(int(rng.integers(1, 9)))])
    for m in pop.members:
        feed(pop, m.name, informative=bool(rng.random() < 0.5), n_groups=int(rng.integers(1, 8)))
    cap = int(rng.integers(1, 5))
    pop.prune(cap=cap)
    assert 1 <= len(pop.members) <= cap


def test_remove_and_bad_arguments_raise():
    pop = pool("a", "b")
    with pytest.raises(KeyError, match="no member"):
        pop.remove("zz")
    pop.remove("b")
    with pytest.raises(ValueError, match="last member"):
        pop.remove("a")
    with pytest.raises(ValueError, match="cap"):
        pop.prune(cap=0)
    with pytest.raises(ValueError, match="one member, group and reward"):
        pop.record_groups(["a"], [0, 1], [1.0])


def test_pool_state_round_trip_rebuilds_missing_members():
    pop = pool("a", "b")
    feed(pop, "b", informative=True)
    pop.reweight()
    state = pop.pool_state()
    other = pool("a")
    other.load_pool_state(state, build=lambda name: EchoSimulator(name))
    assert [m.name for m in other.members] == ["a", "b"] and other.pool_state() == state

