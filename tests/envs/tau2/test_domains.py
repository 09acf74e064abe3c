"""τ²'s domains, task sets and splits, as simpop exposes them: every split τ² defines works, nothing else does."""

from __future__ import annotations

import pytest
from tau2.registry import registry
from tau2.run import get_tasks, load_task_splits

import simpop
from simpop.envs.registration import spec
from simpop.envs.tau2 import domains as t2
from simpop.envs.tau2.env import Tau2Env

#: What τ² 26.3 defines (split -> number of tasks); the tests below check these against τ²'s own loaders.
SPLITS = {
    "mock": {"base": 9},
    "airline": {"base": 50, "train": 30, "test": 20},
    "retail": {"base": 114, "train": 74, "test": 40},
    "telecom": {"base": 114, "train": 74, "test": 40, "small": 20, "full": 2285},
    "telecom-workflow": {"base": 114, "train": 74, "test": 40, "small": 20, "full": 2285},
}


def test_simpop_exposes_every_domain_in_taus_registry():
    assert set(t2.DOMAINS) == {d for d in registry.get_domains() if not d.startswith("simpop-")}
    tau2_ids = [i for i in simpop.ids() if spec(i).entry_point == "simpop.envs.tau2.env:Tau2Env"]
    assert sorted(spec(i).kwargs["domain"] for i in tau2_ids) == sorted(t2.DOMAINS)
    assert spec("simpop/Tau2-telecom-workflow-v0").kwargs == {"domain": "telecom-workflow"}


@pytest.mark.parametrize("domain", list(SPLITS))
def test_each_domain_has_exactly_taus_splits(domain):
    d = t2.domain(domain)
    assert {name: len(ids) for name, ids in d.splits.items()} == SPLITS[domain]
    registered = load_task_splits(domain)  # None for mock: its split file is read by its task loader only
    assert registered is None if domain == "mock" else d.splits == registered


@pytest.mark.parametrize("domain", ["mock", "airline", "retail"])
def test_every_split_is_taus_task_loader_output_in_taus_order(domain):
    for split in SPLITS[domain]:
        assert Tau2Env(domain, split=split).scenario_ids() == [t.id for t in get_tasks(domain, split)], split
    # split=None is τ²'s default task set: what its loader returns given no split.
    assert Tau2Env(domain).scenario_ids() == [t.id for t in registry.get_tasks_loader(domain)()]


def test_telecom_small_and_full_are_taus_telecom_small_and_full_task_sets():
    # τ²'s extra task sets (τ² 26.3's `get_tasks("telecom_full")` itself fails: the loader takes no split).
    full = Tau2Env("telecom", split="full").scenario_ids()
    assert full == [t.id for t in registry.get_tasks_loader("telecom_full")()] and len(full) == 2285
    small = Tau2Env("telecom", split="small").scenario_ids()
    assert small == [t.id for t in registry.get_tasks_loader("telecom_small")()] and len(small) == 20
    base = Tau2Env("telecom").scenario_ids()
    assert base == Tau2Env("telecom", split="base").scenario_ids() and len(base) == 114
    assert not set(small) & set(base)  # small is not a subset of base: it needs every task loaded
    splits = load_task_splits("telecom")
    for split in ("train", "test"):
        ids = Tau2Env("telecom", split=split).scenario_ids()
        assert ids == [i for i in full if i in set(splits[split])] and set(ids) <= set(base)


def test_a_full_split_task_plays():
    env, base = Tau2Env("telecom", split="full"), set(Tau2Env("telecom").scenario_ids())
    task_id = next(i for i in reversed(env.scenario_ids()) if i not in base)
    env.reset(seed=0, options={"scenario_id": task_id})
    assert env.scenario.id == task_id and env.to_act == "user"


@pytest.mark.parametrize("domain, split", [("mock", "train"), ("airline", "small"), ("retail", "full"),
                                           ("telecom", "all"), ("telecom", "telecom_full"), ("airline", "Base")])
def test_unknown_splits_are_refused_with_what_exists(domain, split):
    with pytest.raises(ValueError) as error:
        Tau2Env(domain, split=split)
    message = str(error.value)
    assert f"no task split {split!r}" in message
    listed = ", ".join(f"{name} ({n} tasks)" for name, n in sorted(SPLITS[domain].items()))
    assert f"τ² defines: {listed}." in message and "split=None" in message


def test_unknown_domain_is_refused_with_the_domains():
    with pytest.raises(ValueError, match="unknown τ² domain 'banking'; choose one of mock, airline, retail, "
                                         "telecom, telecom-workflow"):
        Tau2Env("banking")


def test_telecom_workflow_is_taus_workflow_policy_on_telecoms_tasks():
    from tau2.domains.telecom.environment import get_environment_workflow_policy

    workflow, manual = Tau2Env("telecom-workflow"), Tau2Env("telecom")
    assert workflow.scenario_ids() == manual.scenario_ids()
    task = workflow.scenario_ids()[0]
    policy = workflow.load_scenario(task).policy
    assert policy == get_environment_workflow_policy().get_policy() != manual.load_scenario(task).policy
    assert t2.domain("telecom-workflow").new_environment().get_info().domain_name == "telecom-workflow"
    env = simpop.make("simpop/Tau2-telecom-workflow-v0")
    env.reset(seed=0)
    assert env.scenario.domain == "telecom-workflow" and env.scenario.user_tools
