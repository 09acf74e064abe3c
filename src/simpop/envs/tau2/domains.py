"""The ``tau2`` package, imported on first use, and each τ² domain's data cached once per process.

Importing this module imports τ² (4–7 s, mostly litellm); registering the env ids does not. Before the
import it sets ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (litellm would otherwise try to download its cost
map) and silences τ²'s loguru output (``loguru.logger.enable("tau2")`` turns it back on).

A :class:`Domain` loads the domain's tasks, split file, policy and database once; every episode gets
a fresh database validated from the pristine one's cached JSON instead of re-reading the data file
(about twice as fast as τ²'s loader, and faster than a deep copy; airline: ~0.15 s). τ²'s evaluator builds its environments through τ²'s registry; we register the same
constructor, fed from the cache, under :attr:`Domain.evaluator_domain`, so the evaluator itself runs
unchanged.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
try:
    from loguru import logger

    logger.disable("tau2")
    from tau2.agent.llm_agent import AGENT_INSTRUCTION
    from tau2.agent.llm_agent import SYSTEM_PROMPT as AGENT_SYSTEM_PROMPT
    from tau2.agent.base import BaseAgent
    from tau2.config import DEFAULT_LLM_NL_ASSERTIONS
    from tau2.data_model.message import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
    from tau2.data_model.simulation import RewardInfo, SimulationRun, TerminationReason
    from tau2.data_model.tasks import Task
    from tau2.environment.environment import Environment
    from tau2.environment.tool import as_tool
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.gym.gym_agent import GymAgent
    from tau2.metrics.agent_metrics import is_successful
    from tau2.gym.gym_agent import done as done_tool
    from tau2.orchestrator.orchestrator import Orchestrator, Role
    from tau2.registry import registry
    from tau2.user.base import BaseUser
    from tau2.user.user_simulator import SYSTEM_PROMPT as USER_SYSTEM_PROMPT
    from tau2.user.user_simulator import UserSimulator
    from tau2.user.user_simulator import get_global_user_sim_guidelines
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"the τ²-bench envs need the `tau2` package ({e}); install it with: "
                      "pip install simpop[tau2]") from e

#: The domains simpop exposes (τ²'s registry names; telecom uses its "manual" tech-support policy).
DOMAINS = ("mock", "airline", "retail", "telecom")

__all__ = [
    "AGENT_INSTRUCTION", "AGENT_SYSTEM_PROMPT", "DEFAULT_LLM_NL_ASSERTIONS", "DOMAINS", "USER_SYSTEM_PROMPT",
    "AssistantMessage", "BaseAgent", "BaseUser", "Domain", "EvaluationType", "GymAgent", "Message", "Orchestrator",
    "RewardInfo", "Role", "Task", "TerminationReason", "ToolCall", "ToolMessage", "UserMessage", "UserSimulator",
    "domain", "evaluate", "is_successful", "user_guidelines",
]


@dataclass(eq=False)
class Domain:
    """One τ² domain's data, loaded once per process.

    Attributes:
        name: τ²'s domain name.
        tasks: Task id -> τ² task, in τ²'s order (the domain's default task set).
        splits: τ²'s split file (split name -> task ids); empty where τ² ships none (mock).
        policy: The agent's domain policy.
        agent_tools: OpenAI function schemas of the agent's tools, plus τ²'s gym ``done`` tool.
        user_tools: Schemas of the user's tools (telecom's dual control), or None.
        evaluator_domain: The name under which the cached constructor is registered for τ²'s evaluator.
    """

    name: str
    tasks: dict[str, Task]
    splits: dict[str, list[str]]
    policy: str
    agent_tools: list[dict[str, Any]]
    user_tools: list[dict[str, Any]] | None
    evaluator_domain: str
    _databases: dict[str, tuple[type, str]]

    def new_environment(self, solo_mode: bool = False) -> Environment:
        """A fresh τ² environment (τ²'s constructor) on fresh copies of the pristine database(s)."""
        kwargs = {arg: db_type.model_validate_json(data) for arg, (db_type, data) in self._databases.items()}
        return registry.get_env_constructor(self.name)(solo_mode=solo_mode, **kwargs)

    def task_ids(self, split: str | None) -> list[str]:
        """Task ids of ``split`` (None: all tasks), in τ²'s order."""
        if split is None:
            return list(self.tasks)
        if split not in self.splits:
            available = ", ".join(sorted(self.splits)) or "none"
            raise ValueError(f"τ² domain {self.name!r} has no task split {split!r}; its split file has: "
                             f"{available}. Pass split=None for all tasks.")
        wanted = set(self.splits[split])
        return [i for i in self.tasks if i in wanted]


@functools.cache
def domain(name: str) -> Domain:
    """The cached :class:`Domain` ``name`` (one of :data:`DOMAINS`)."""
    if name not in DOMAINS:
        raise ValueError(f"unknown τ² domain {name!r}; choose one of {', '.join(DOMAINS)}")
    pristine = registry.get_env_constructor(name)()
    # The constructors' keyword names for the agent's and (telecom) the user's database.
    databases = {"db": pristine.tools.db}
    if pristine.user_tools is not None:
        databases["user_db"] = pristine.user_tools.db
    split_loader = registry.get_task_splits_loader(name)
    d = Domain(
        name=name,
        tasks={t.id: t for t in registry.get_tasks_loader(name)()},
        splits=dict(split_loader()) if split_loader is not None else {},
        policy=pristine.get_policy(),
        agent_tools=[t.openai_schema for t in pristine.get_tools()] + [as_tool(done_tool).openai_schema],
        user_tools=[t.openai_schema for t in pristine.get_user_tools()] if pristine.user_tools else None,
        evaluator_domain=f"simpop-{name}",
        _databases={arg: (type(db), db.model_dump_json()) for arg, db in databases.items()},
    )
    if d.evaluator_domain not in registry.get_domains():
        registry.register_domain(d.new_environment, d.evaluator_domain)
    return d


@functools.cache
def user_guidelines(with_tools: bool) -> str:
    """τ²'s global user-simulation guidelines (the variant for users with tools when ``with_tools``)."""
    return get_global_user_sim_guidelines(use_tools=with_tools)


def evaluate(d: Domain, task: Task, messages: list, termination: TerminationReason,
             evaluation_type: EvaluationType = EvaluationType.ALL) -> RewardInfo:
    """τ²'s own evaluation of a finished trajectory (``evaluate_simulation``, unchanged)."""
    run = SimulationRun(id=f"{d.name}:{task.id}", task_id=task.id, start_time="", end_time="", duration=0.0,
                        termination_reason=termination, messages=messages)
    return evaluate_simulation(simulation=run, task=task, evaluation_type=evaluation_type, solo_mode=False,
                               domain=d.evaluator_domain)
