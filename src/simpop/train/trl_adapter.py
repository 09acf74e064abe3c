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
- extra fields ``env_reward``, ``success``, ``expected_success`` and ``simulator`` for reward functions
  (:func:`env_reward`, :func:`expected_reward`).

:func:`collapse_callback` runs the collapse early warning (:mod:`simpop.train.monitor`) inside TRL.

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

from simpop.agents.base import SamplingParams
from simpop.agents.policy import ServedPolicy
from simpop.seat import Simulator
from simpop.rollout import Job, RolloutEngine

if TYPE_CHECKING:
    from simpop.agents.transformers_backend import TransformersBackend


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
        engine = RolloutEngine(env_id, ServedPolicy(backend, sampling, system_prompt), simulator,
                               n_envs=n_envs, env_kwargs=env_kwargs)
        step = int(trainer.state.global_step)
        scenario_ids = [scenario_id_of(p) for p in prompts]
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
            "expected_success": [t.expected_success for t in trajectories],
            "simulator": [t.simulator for t in trajectories],
        }

    return rollout_func


def env_reward(completions: list[Any], env_reward: list[float], **kwargs: Any) -> list[float]:
    """TRL reward function: the env's reward of each dialogue (from :func:`make_rollout_func`)."""
    return [float(r) for r in env_reward]


def expected_reward(completions: list[Any], env_reward: list[float], expected_success: list[float | None],
                    **kwargs: Any) -> list[float]:
    """TRL reward function: each dialogue's expected success where the user simulator reports one (its deciding
    draw's probability of success, ``info["expected_success"]``: the same expectation as the env's 0/1 reward
    without the draw's noise), else the env's reward."""
    return [float(e) if e is not None else float(r) for e, r in zip(expected_success, env_reward, strict=True)]


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


def scenario_id_of(prompt: Any) -> str:
    """The scenario id of a TRL prompt: prompts are scenario ids (strings), or chats whose last message holds one."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        return str(prompt[-1]["content"])
    raise TypeError(f"simpop's rollout_func expects scenario ids as prompts (see scenario_dataset), got {prompt!r}")


#: TRL log keys the collapse monitor reads, by the simpop metric they stand for (first present wins).
TRL_MONITOR_KEYS = {
    "success": ("rewards/env_reward/mean", "reward"),
    "zero_var_frac": ("frac_reward_zero_std",),
    "policy_entropy": ("entropy",),
}


def monitor_metrics(logs: dict[str, Any]) -> dict[str, float]:
    """The collapse monitor's inputs from one TRL log (:data:`TRL_MONITOR_KEYS`; absent ones are left out)."""
    out = {}
    for name, keys in TRL_MONITOR_KEYS.items():
        found = next((logs[k] for k in keys if isinstance(logs.get(k), (int, float))), None)
        if found is not None:
            out[name] = float(found)
    return out


def collapse_callback(probe: Callable[[int], dict[str, float]], probe_every: int = 10, on_collapse: str = "warn",
                      monitor: Any = None, grow: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None):
    """A ``transformers.TrainerCallback`` that runs the collapse monitor (:mod:`simpop.train.monitor`) in TRL.

    Every TRL log feeds :meth:`CollapseMonitor.observe_update` (:func:`monitor_metrics`: env reward as success,
    ``frac_reward_zero_std``, ``entropy``); every ``probe_every`` optimiser steps ``probe(step)`` (success per
    probe member, e.g. :func:`simpop.evaluation.panel.evaluate` ``.per_member`` on the trainer's model) feeds
    :meth:`observe_probe`. Probe records and the warning go into TRL's logs (``monitor/...``); on firing,
    ``on_collapse="stop"`` sets ``control.should_training_stop`` and ``"add-simulators"`` calls ``grow``.
    The monitor is the callback's ``monitor`` attribute.
    """
    from transformers import TrainerCallback

    from simpop.train.monitor import ON_COLLAPSE, CollapseMonitor

    if on_collapse not in ON_COLLAPSE:
        raise ValueError(f"on_collapse must be one of {', '.join(ON_COLLAPSE)}, got {on_collapse!r}")
    if on_collapse == "add-simulators" and grow is None:
        raise ValueError("on_collapse='add-simulators' needs grow=...")
    if probe_every < 1:
        raise ValueError(f"probe_every must be >= 1, got {probe_every}")

    class CollapseCallback(TrainerCallback):
        def __init__(self) -> None:
            self.monitor = monitor if monitor is not None else CollapseMonitor()
            self.pending: dict[str, Any] = {}

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any):
            if logs is None:
                return
            metrics = monitor_metrics(logs)
            if metrics:
                logs.update(self.monitor.observe_update(int(state.global_step), metrics))
            logs.update(self.pending)
            self.pending = {}

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any):
            step = int(state.global_step)
            if step % probe_every != 0:
                return
            record = self.monitor.observe_probe(step, probe(step))
            self.pending = {f"monitor/{k}": v for k, v in record.items() if isinstance(v, (int, float))}
            if record["warning_fired_now"]:
                if on_collapse == "stop":
                    control.should_training_stop = True
                elif on_collapse == "add-simulators":
                    added = grow(step, record)
                    self.pending["monitor/added_simulators"] = float(added.get("added", 0))

    return CollapseCallback()
