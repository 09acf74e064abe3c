"""Train with TRL's ``GRPOTrainer`` against any simpop env and simulator (or population).

TRL (``pip install simpop[trl]``) lets a ``rollout_func(prompts, trainer)`` produce the completions;
:func:`make_rollout_func` plays whole dialogues there with the :class:`~simpop.rollout.RolloutEngine`
and hands TRL, per dialogue:

- ``prompt_ids``: the policy's first prompt (system prompt and anything said before its first turn);
- ``completion_ids``: everything after it (every policy turn, and the template, env and simulator
  tokens in between), token for token as the policy saw and generated them;
- ``env_mask``: 1 for tokens the policy generated, 0 for the rest, so TRL's loss (and its completion
  length statistics) count the policy's own tokens only;
- ``logprobs``: the sampling log-probs (0 where ``env_mask`` is 0);
- extra fields ``env_reward``, ``success`` and ``simulator`` for reward functions (:func:`env_reward`).

The dataset's prompts are scenario ids (:func:`scenario_dataset`); TRL repeats each one
``num_generations`` times, which makes the GRPO groups. Example::

    from trl import GRPOConfig, GRPOTrainer
    backend = TransformersBackend("smollm2", trainable=True)
    trainer = GRPOTrainer(model=backend.model, processing_class=backend.tokenizer, reward_funcs=env_reward,
                          train_dataset=scenario_dataset("simpop/Persuasion-v1"),
                          rollout_func=make_rollout_func("simpop/Persuasion-v1", simulator, backend),
                          args=GRPOConfig(num_generations=4, ...))
    trainer.train()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from simpop.agents.base import Generation, SamplingParams
from simpop.seat import Simulator
from simpop.rollout import Job, RolloutEngine

if TYPE_CHECKING:
    from simpop.agents.transformers_backend import TransformersBackend


class _TrainerPolicy:
    """A TokenPolicy that generates with the TRL trainer's current model through a simpop backend."""

    def __init__(self, backend: TransformersBackend, sampling: SamplingParams, system_prompt: str | None):
        self.backend = backend
        self.sampling = sampling
        self._system_prompt = system_prompt

    def system_prompt(self, observation: dict[str, Any]) -> str | None:
        return self._system_prompt if self._system_prompt is not None else observation.get("instructions")

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        return self.backend.generate_ids(prompts, params)


def make_rollout_func(env_id: str, simulator: Simulator, backend: TransformersBackend,
                      env_kwargs: dict[str, Any] | None = None, max_new_tokens: int = 48, n_envs: int | None = None,
                      system_prompt: str | None = None, seed: int = 0) -> Callable[[list[Any], Any], dict[str, list]]:
    """A TRL ``rollout_func`` that plays ``env_id`` dialogues against ``simulator``.

    Args:
        env_id: A registered text env id.
        simulator: The user seat's simulator or population.
        backend: Supplies the chat template and generation; before every rollout its ``model`` is pointed
            at the trainer's current (unwrapped) model, so pass the same model to TRL's trainer.
        env_kwargs: Env constructor arguments.
        max_new_tokens: Token limit of each policy turn (TRL's ``max_completion_length`` bounds nothing
            here: a dialogue's completion spans several turns).
        n_envs: Dialogues run side by side (None: all prompts of a call at once).
        system_prompt: A fixed system message for the policy (default: the env's instructions).
        seed: Base seed; each call's dialogues get seeds from it and TRL's global step.

    Returns:
        ``rollout_func(prompts, trainer) -> dict`` for ``trl.GRPOTrainer(rollout_func=...)``.
    """

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list]:
        backend.model = trainer.accelerator.unwrap_model(trainer.model)
        args = trainer.args
        sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=args.temperature,
                                  top_p=args.top_p if args.top_p is not None else 1.0)
        engine = RolloutEngine(env_id, _TrainerPolicy(backend, sampling, system_prompt), simulator,
                               n_envs=n_envs, env_kwargs=env_kwargs)
        step = int(trainer.state.global_step)
        scenario_ids = [_scenario_id(p) for p in prompts]
        # TRL repeats each prompt num_generations times in a row: consecutive equal ids form a group.
        groups = np.cumsum([i == 0 or s != scenario_ids[i - 1] for i, s in enumerate(scenario_ids)]) - 1
        jobs = [Job(s, int(g), int(np.random.SeedSequence([seed, step, i]).generate_state(1)[0]))
                for i, (s, g) in enumerate(zip(scenario_ids, groups))]
        was_training = backend.model.training
        backend.model.eval()
        try:
            trajectories = engine.run(jobs, np.random.default_rng([seed, step]))
        finally:
            backend.model.train(was_training)
        return {
            "prompt_ids": [t.token_ids[:t.prompt_length] for t in trajectories],
            "completion_ids": [t.token_ids[t.prompt_length:] for t in trajectories],
            "logprobs": [t.logprobs[t.prompt_length:] for t in trajectories],
            "env_mask": [t.mask[t.prompt_length:] for t in trajectories],
            "env_reward": [t.total_reward for t in trajectories],
            "success": [float(t.success) for t in trajectories],
            "simulator": [t.simulator for t in trajectories],
        }

    return rollout_func


def env_reward(completions: list[Any], env_reward: list[float], **kwargs: Any) -> list[float]:
    """TRL reward function: the env's reward of each dialogue (from :func:`make_rollout_func`)."""
    return [float(r) for r in env_reward]


def scenario_dataset(env_id: str, n: int | None = None, env_kwargs: dict[str, Any] | None = None, seed: int = 0):
    """A ``datasets.Dataset`` with one row ``{"prompt": scenario_id}`` per scenario (or ``n`` drawn ones)."""
    try:
        from datasets import Dataset
    except ImportError as error:
        raise ImportError("the TRL adapter needs datasets and trl: pip install simpop[trl]") from error
    from simpop.envs.registration import make

    ids = make(env_id, **(env_kwargs or {})).scenario_ids()
    if n is not None:
        ids = [ids[int(i)] for i in np.random.default_rng(seed).choice(len(ids), size=n, replace=n > len(ids))]
    return Dataset.from_dict({"prompt": ids})


def _scenario_id(prompt: Any) -> str:
    """Prompts are scenario ids (strings), or chats whose last message holds one."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        return str(prompt[-1]["content"])
    raise TypeError(f"simpop's rollout_func expects scenario ids as prompts (see scenario_dataset), got {prompt!r}")
