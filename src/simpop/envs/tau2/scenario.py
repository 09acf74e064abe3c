"""A τ² scenario: one τ² task, with the system prompts of both seats."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simpop.envs.tau2.domains import (AGENT_INSTRUCTION, AGENT_SYSTEM_PROMPT, USER_SYSTEM_PROMPT, Domain, Task,
                                      user_guidelines)
from simpop.envs.tau2.tool_calls import tools_prompt


@dataclass(frozen=True)
class Tau2Scenario:
    """One τ² task as a simpop scenario.

    Attributes:
        id: The τ² task id.
        domain: The τ² domain name.
        task: The τ² task (user scenario, initial state, evaluation criteria).
        persona: The user's persona; defaults to the task's own. Populations may replace it
            (``dataclasses.replace(scenario, persona=...)``) to play the same task as another person.
        policy: The agent's domain policy.
        agent_tools: OpenAI function schemas of the agent's tools.
        user_tools: Schemas of the user's tools (telecom), or None.
    """

    id: str
    domain: str
    task: Task
    persona: str | None
    policy: str
    agent_tools: list[dict[str, Any]]
    user_tools: list[dict[str, Any]] | None

    @classmethod
    def from_task(cls, d: Domain, task: Task) -> Tau2Scenario:
        """The scenario of τ² task ``task`` in domain ``d`` (its user scenario, the domain's policy and tools)."""
        return cls(id=task.id, domain=d.name, task=task, persona=task.user_scenario.persona, policy=d.policy,
                   agent_tools=d.agent_tools, user_tools=d.user_tools)

    def user_instructions(self) -> str:
        """The user simulator's system prompt: τ²'s user guidelines and this task's user scenario.

        Exactly τ²'s ``UserSimulator.system_prompt``; where the user has tools, followed by a section
        that lists them and says how to call them as text (:func:`~simpop.envs.tau2.tool_calls.tools_prompt`).
        """
        scenario = self.task.user_scenario.model_copy(update={"persona": self.persona})
        prompt = USER_SYSTEM_PROMPT.format(global_user_sim_guidelines=user_guidelines(self.user_tools is not None),
                                           instructions=str(scenario))
        return prompt if self.user_tools is None else prompt + "\n\n" + tools_prompt(self.user_tools)

    def policy_instructions(self) -> str:
        """The agent's system prompt: τ²'s agent instruction and domain policy, then its tools as text."""
        prompt = AGENT_SYSTEM_PROMPT.format(agent_instruction=AGENT_INSTRUCTION, domain_policy=self.policy)
        return prompt + "\n\n" + tools_prompt(self.agent_tools)
