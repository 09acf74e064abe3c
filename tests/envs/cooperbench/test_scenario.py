"""CooperBench scenarios: a feature pair gives each seat its feature and instructions."""

from __future__ import annotations

import pytest

from simpop.envs.cooperbench.dataset import load_dataset


def test_scenario_instructions_name_the_seat_and_feature():
    pair = {p.id: p for p in load_dataset("mini").pairs()}["kvstore/task2/f1-f3"]
    assert pair.feature("agent1").id == 1 and pair.feature("agent2").id == 3
    text = pair.user_instructions()
    assert "You are agent2" in text and "expiring keys" in text and '"type": "submit"' in text
    with pytest.raises(KeyError):
        pair.feature("agent3")
