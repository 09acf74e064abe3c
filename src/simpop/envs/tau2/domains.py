"""The ``tau2`` package, imported on first use, and each τ² domain's data cached once per process.

Importing this module imports τ² (4–7 s, mostly litellm); registering the env ids does not. Before the
import it sets ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (litellm would otherwise try to download its cost
map) and silences τ²'s loguru output (``loguru.logger.enable("tau2")`` turns it back on).

A :class:`Domain` loads the domain's tasks, task splits, policy and database once; every episode gets
a fresh database validated from the pristine one's cached JSON instead of re-reading the data file
(about twice as fast as τ²'s loader, and faster than a deep copy; airline: ~0.15 s). τ²'s evaluator builds its environments through τ²'s registry; we register the same
constructor, fed from the cache, under :attr:`Domain.evaluator_domain`, so the evaluator itself runs
unchanged.

**Task splits** are τ²'s own: the split file its task loader reads (``split_tasks.json``: split name ->
task ids; τ² 26.3 defines ``base``, ``train``, ``test`` for airline and retail, ``base``, ``train``,
``test``, ``small``, ``full`` for telecom and telecom-workflow, and ``base`` for mock, whose registry
entry has no split loader but whose task loader reads the same file). τ²'s extra telecom task sets
``telecom_full`` and ``telecom_small`` are the ``full`` and ``small`` splits. Split None is τ²'s
default task set, what its task loader returns when given no split: ``base`` (every task for mock,
which is also its ``base``).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
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
    from tau2.data_model.simulation import Results, RewardInfo, SimulationRun, TerminationReason
    from tau2.data_model.tasks import Task
    from tau2.environment.environment import Environment
    from tau2.environment.tool import as_tool
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.gym.gym_agent import GymAgent
    from tau2.metrics.agent_metrics import is_successful
    from tau2.gym.gym_agent import done as done_tool
    from tau2.orchestrator.orchestrator import Orchestrator, Role
    from tau2.registry import registry
    from tau2.utils.utils import get_now
    from tau2.user.base import BaseUser
    from tau2.user.user_simulator import SYSTEM_PROMPT as USER_SYSTEM_PROMPT
    from tau2.user.user_simulator import UserSimulator
    from tau2.user.user_simulator import get_global_user_sim_guidelines
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"the τ²-bench envs need the `tau2` package ({e}); install it with: "
                      "pip install simpop[tau2]") from e

#: The domains simpop exposes (τ²'s registry names: each is both a τ² domain and a τ² task set). ``telecom``
#: uses τ²'s "manual" tech-support policy, ``telecom-workflow`` its "workflow" policy, on the same tasks.
DOMAINS = ("mock", "airline", "retail", "telecom", "telecom-workflow")

__all__ = [
    "AGENT_INSTRUCTION", "AGENT_SYSTEM_PROMPT", "DEFAULT_LLM_NL_ASSERTIONS", "DOMAINS", "USER_SYSTEM_PROMPT",
    "AssistantMessage", "BaseAgent", "BaseUser", "Domain", "EvaluationType", "GymAgent", "Message", "Orchestrator",
    "RewardInfo", "Role", "Task", "TerminationReason", "ToolCall", "ToolMessage", "UserMessage", "UserSimulator",
    "Results", "SimulationRun", "domain", "evaluate", "get_now", "is_successful", "user_guidelines",
]


@dataclass(eq=False)
class Domain:
    """One τ² domain's data, loaded once per process.

    Attributes:
        name: τ²'s domain name (also the name of its task set in τ²'s registry).
        tasks: Task id -> τ² task, every task of the task set (all splits), in τ²'s order.
        splits: τ²'s task splits (split name -> task ids), from the split file τ²'s task loader reads.
        default_split: The split τ²'s task loader uses when given none (``"base"``), or None where that
            is every task (mock).
        policy: The agent's domain policy.
        agent_tools: OpenAI function schemas of the agent's tools, plus τ²'s gym ``done`` tool.
        user_tools: Schemas of the user's tools (telecom's dual control), or None.
        evaluator_domain: The name under which the cached constructor is registered for τ²'s evaluator.
    """

    name: str
    tasks: dict[str, Task]
    splits: dict[str, list[str]]
    default_split: str | None
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
        """Task ids of τ²'s task split ``split``, in τ²'s order (None: τ²'s default task set, see the module).

        Raises:
            ValueError: ``split`` is not one of the splits τ² defines for this domain (the message lists them).
        """
        if split is None:
            split = self.default_split
            if split is None:
                return list(self.tasks)
        if split not in self.splits:
            raise ValueError(f"τ² domain {self.name!r} has no task split {split!r}; τ² defines: "
                             f"{self.describe_splits()}. Pass one of these, or split=None for τ²'s default "
                             f"({self.default_split or 'every task'}).")
        wanted = set(self.splits[split])
        return [i for i in self.tasks if i in wanted]

    def describe_splits(self) -> str:
        """``"base (50 tasks), test (20 tasks), ..."``: every split τ² defines for this domain."""
        return ", ".join(f"{name} ({len(ids)} tasks)" for name, ids in sorted(self.splits.items())) or "no splits"


def _split_loader(task_loader: Any, name: str) -> Any:
    """The function that reads τ²'s split file for task set ``name``.

    τ²'s registry records it for airline, retail and telecom; for mock it records none, although mock's
    task loader reads a split file through its module's ``get_tasks_split`` (so ``tau2 run --domain mock``,
    whose default split is ``base``, works). Either way it is the file τ²'s own loader filters by.
    """
    registered = registry.get_task_splits_loader(name)
    if registered is not None:
        return registered
    return getattr(sys.modules.get(task_loader.__module__), "get_tasks_split", None)


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
    task_loader = registry.get_tasks_loader(name)
    split_loader = _split_loader(task_loader, name)
    splits = {str(k): list(v) for k, v in (split_loader() if split_loader is not None else {}).items()}
    # What τ²'s loader returns when called with no split: its signature's default.
    parameter = inspect.signature(task_loader).parameters.get("task_split_name")
    default_split = None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default
    d = Domain(
        name=name,
        tasks={t.id: t for t in task_loader(task_split_name=None)},
        splits=splits,
        default_split=default_split,
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


def evaluate(d: Domain, task: Task, simulation: SimulationRun,
             evaluation_type: EvaluationType = EvaluationType.ALL) -> RewardInfo:
    """τ²'s own evaluation of a finished trajectory (``evaluate_simulation``, unchanged)."""
    return evaluate_simulation(simulation=simulation, task=task, evaluation_type=evaluation_type, solo_mode=False,
                               domain=d.evaluator_domain)
