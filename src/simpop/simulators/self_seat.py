"""The policy in the user seat (self-play): the simulators behind the user-seat kinds ``self`` and ``self@pool``.

- :class:`PolicySeat`: a text policy (:class:`~simpop.agents.policy.LLMPolicy`) playing the user seat: the same LLM,
  prompted like every LLM simulator with the user seat's own brief (the env's text format: the scenario's
  ``user_instructions()``, CooperBench's teammate brief and JSON actions). It keeps the prompt ids, generated ids
  and sampling log-probs of its own turns per dialogue (:attr:`PolicySeat.episodes`, start order), which the
  self-play trainer scores (:mod:`simpop.train.selfplay`). Closing surveys are answered by generation, so the
  answer is a recorded turn too.
- :class:`HeadSeat`: an act-level policy head (:class:`~simpop.agents.policy.ActPolicy` sized for the user seat)
  playing the user seat, each dialogue sampling with its slot's generator. At the act level the two seats' action
  spaces differ, so "the policy plays the user seat" means this second head, trained by the same trainer.

``PolicySeat.snapshot()`` is a frozen copy (a LoRA copy of the policy's adapter) for a
:class:`~simpop.simulators.population.CheckpointPool` (``self@pool``, fictitious self-play); snapshots record nothing.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np

from simpop.agents.base import Chat, SamplingParams
from simpop.agents.policy import ActPolicy, LLMPolicy
from simpop.seat import Simulator, SimulatorSpec, TextFormat
from simpop.simulators.llm import LLMSimulator
from simpop.simulators.trainable import LLMEpisode, LLMTurn


class PolicySeat(LLMSimulator):
    """A text policy in the user seat (module docstring).

    Args:
        policy: The policy (its backend, sampling settings and adapter; the seat samples like the policy does).
        text_format: The env's text format (``env.text_format``; default: the scenario's user instructions + the
            dialogue).
        name: Name in logs and populations.
        frozen: A snapshot: records nothing.
    """

    kind = "self"

    def __init__(self, policy: LLMPolicy, text_format: TextFormat | None = None, name: str = "self",
                 frozen: bool = False):
        if policy.sampling.greedy:
            raise ValueError("self-play needs a sampling policy (temperature > 0): the user seat's turns are scored")
        super().__init__(policy.backend, policy.sampling, name=name, text_format=text_format)
        self.policy, self.frozen = policy, frozen
        self.episodes: list[LLMEpisode] = []
        self._slot_episode: list[LLMEpisode] = []
        self._last: list[LLMTurn] = []

    @property
    def spec(self) -> SimulatorSpec:
        adapter = f"+lora:{self.policy.adapter}" if self.policy.adapter else ""
        return SimulatorSpec(self.kind, f"{self.backend.name}{adapter}", decoding=tuple(self._decoding().items()))

    def clear(self) -> None:
        """Forget the recorded dialogues (before each collection)."""
        self.episodes = []

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        super().reset_batch(scenarios, rngs)
        self._slot_episode = [LLMEpisode() for _ in scenarios]
        if not self.frozen:
            self.episodes.extend(self._slot_episode)

    def raw_generate(self, chats: list[Chat], params: SamplingParams) -> list[str]:
        """Generate with the policy (its adapter active), keeping ids and log-probs of every reply."""
        self.stats["backend_calls"] += 1
        prompts = [self.policy.backend.encode_chat(chat) for chat in chats]  # the seat's backend: a token one
        generations = self.policy.generate_ids(prompts, dataclasses.replace(params, logprobs=True))
        self._last = [LLMTurn(p, g.token_ids, list(g.logprobs or [])) for p, g in zip(prompts, generations)]
        return [g.text for g in generations]

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        replies = self.reply_batch(observations, slots)  # a closing survey too: its answer is a generated turn
        for slot, turn in zip(slots, self._last, strict=True):
            if turn.token_ids:
                self._slot_episode[slot].turns.append(turn)
        return replies

    def snapshot(self) -> PolicySeat:
        """A frozen copy: the policy with a LoRA copy of its adapter (``<adapter>_s<n>``) holding the current weights,
        generating in torch."""
        lora = self.policy.lora
        if lora is None:
            raise ValueError("self@pool keeps snapshots as LoRA adapter copies: train the policy with LoRA (--lora)")
        frozen = copy.copy(self.policy)
        frozen.lora = lora.copy(f"{lora.name}_s{len(list(lora.copies()))}")
        frozen.generator = None
        return PolicySeat(frozen, self.text_format, name=self.name, frozen=True)


class HeadSeat(Simulator):
    """An act-level policy head in the user seat (module docstring).

    Args:
        head: The head (observation and action sizes of the user seat).
        name: Name in logs and populations.
    """

    kind = "self"

    def __init__(self, head: ActPolicy, name: str = "self"):
        self.head, self.name = head, name

    @classmethod
    def for_env(cls, env: Any, hidden_size: int = 64, seed: int = 0, name: str = "self") -> HeadSeat:
        """A new head sized for ``env``'s user seat (``Box`` observations, ``Discrete`` actions)."""
        from gymnasium import spaces

        obs, act = env.observation_space(env.user_seat), env.action_space(env.user_seat)
        if not isinstance(obs, spaces.Box) or not isinstance(act, spaces.Discrete):
            raise TypeError(f"an act-level user-seat head needs Box observations and Discrete actions; "
                            f"{type(env).__name__}'s user seat has {obs} / {act}")
        return cls(ActPolicy(int(np.prod(obs.shape)), int(act.n), hidden_size, seed), name)

    @property
    def spec(self) -> SimulatorSpec:
        return SimulatorSpec(self.kind, f"act-head-{self.head.obs_dim}x{self.head.n_actions}",
                             decoding=(("temperature", 1.0),))

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        self.head.reset_batch(scenarios, rngs)

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[int]:
        return self.head.act_batch(observations, slots)  # each dialogue samples with its own generator
