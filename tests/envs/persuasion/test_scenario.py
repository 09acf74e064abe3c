"""P4G scenarios: the seeded default set, and the prompts of both seats."""

from __future__ import annotations

from simpop.envs.persuasion.env import PersuasionActEnv, PersuasionEnv


def test_default_scenarios_are_fixed_and_seeded():
    env = PersuasionActEnv()
    ids = env.scenario_ids()
    assert ids[0] == "p4g-0000" and ids[-1] == "p4g-0199" and len(ids) == 200
    assert [env.load_scenario(i).persona for i in ids[:5]] == [PersuasionEnv().load_scenario(i).persona
                                                                for i in ids[:5]]
    assert PersuasionActEnv(n_scenarios=5, scenario_seed=1).load_scenario("p4g-0000").persona != \
        env.load_scenario("p4g-0000").persona


def test_scenario_prompts():
    scenario = PersuasionEnv().load_scenario("p4g-0007")
    user = scenario.user_instructions()
    assert scenario.persona.describe() in user and "[DONATE $N]" in user and "$2" in user
    policy = scenario.policy_instructions(max_turns=6)
    assert "6 messages" in policy and "Save the Children" in policy
    assert scenario.persona.describe() not in policy and "Personality" not in policy
