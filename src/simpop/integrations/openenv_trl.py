"""TRL's ``GRPOTrainer`` training through a simpop OpenEnv server (TRL's ``rollout_func`` route for OpenEnv).

TRL documents two ways to train against OpenEnv environments: ``environment_factory`` (the model acts
through tool calls) and ``rollout_func`` (the rollout is the user's code, on token ids). A simpop dialogue
is plain chat, not tool calls, and the user's turns must stay out of the loss, so this module takes the
``rollout_func`` route: :func:`make_rollout_func` plays each dialogue in its own session of a ``simpop
openenv serve`` server (:class:`~simpop.integrations.openenv_client.SimpopEnvClient`), where the server's
simulator population plays the user, and hands TRL, per dialogue, what
:func:`simpop.train.trl_adapter.make_rollout_func` hands it in process: ``prompt_ids``, ``completion_ids``
(every policy turn and the template and user tokens between), ``env_mask`` (1 only on tokens the policy
generated: TRL's loss skips the user's turns), ``logprobs``, and ``env_reward`` / ``success`` /
``expected_success`` / ``simulator`` for reward functions (:func:`~simpop.train.trl_adapter.env_reward`,
:func:`~simpop.train.trl_adapter.expected_reward`). Token ids are built on the client
from the observation's chat with simpop's token-in/token-out bookkeeping (:class:`~simpop.agents.policy.TokenLedger`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from simpop.agents.base import SamplingParams
from simpop.integrations.openenv_client import SimpopEnvClient
from simpop.agents.policy import ChatDelta, TokenLedger
from simpop.train.trl_adapter import scenario_id_of

if TYPE_CHECKING:
    from simpop.agents.transformers_backend import TransformersBackend


def make_rollout_func(base_url: str, backend: TransformersBackend, max_new_tokens: int = 48,
                      system_prompt: str | None = None, seed: int = 0,
                      client_kwargs: dict[str, Any] | None = None) -> Callable[[list[Any], Any], dict[str, list]]:
    """A TRL ``rollout_func`` that plays every prompt's dialogue on the OpenEnv server at ``base_url``.

    Args:
        base_url: The server (``simpop openenv serve``), e.g. ``http://127.0.0.1:8000``.
        backend: Chat template and generation; its ``model`` is pointed at the trainer's current model
            before every rollout, so pass the same model to TRL's trainer.
        max_new_tokens: Token limit of each policy turn.
        system_prompt: A fixed system message for the policy (default: the env's instructions).
        seed: Base seed; each call's dialogues get reset seeds from it and TRL's global step.
        client_kwargs: Extra :class:`SimpopEnvClient` arguments (``headers`` for an API key, timeouts).

    Returns:
        ``rollout_func(prompts, trainer) -> dict`` for ``trl.GRPOTrainer(rollout_func=...)``; prompts are
        scenario ids (:func:`simpop.train.trl_adapter.scenario_dataset`).
    """
    delta = ChatDelta(backend)

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list]:
        backend.model = trainer.accelerator.unwrap_model(trainer.model)
        args, step = trainer.args, int(trainer.state.global_step)
        sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=args.temperature,
                                  top_p=args.top_p if args.top_p is not None else 1.0, logprobs=True)
        resets = [{"seed": int(np.random.SeedSequence([seed, step, i]).generate_state(1)[0]),
                   "scenario_id": scenario_id_of(p)} for i, p in enumerate(prompts)]
        played = play_dialogues(base_url, backend, resets, sampling, [seed, step], system_prompt, client_kwargs, delta)
        return {
            "prompt_ids": [lg.ids[:lg.prompt_length] for lg in played.ledgers],
            "completion_ids": [lg.ids[lg.prompt_length:] for lg in played.ledgers],
            "logprobs": [lg.logprobs[lg.prompt_length:] for lg in played.ledgers],
            "env_mask": [lg.mask[lg.prompt_length:] for lg in played.ledgers],
            "env_reward": played.returns,
            "success": played.successes,
            "expected_success": played.expected,
            "simulator": played.simulators,
        }

    return rollout_func


@dataclasses.dataclass
class PlayedDialogues:
    """What :func:`play_dialogues` played: per dialogue its tokens, return, success, expected success (the
    simulator's ``info["expected_success"]``, None where it reports none) and user-seat member."""

    ledgers: list[TokenLedger]
    returns: list[float]
    successes: list[float]
    expected: list[float | None]
    simulators: list[str]


def play_dialogues(base_url: str, backend: TransformersBackend, resets: list[dict[str, Any]],
                   sampling: SamplingParams, seed: int | Sequence[int] = 0, system_prompt: str | None = None,
                   client_kwargs: dict[str, Any] | None = None, delta: ChatDelta | None = None) -> PlayedDialogues:
    """Play one dialogue per ``resets`` entry, each in its own session of the OpenEnv server at ``base_url``.

    The policy turns of all live dialogues are generated in one batch by ``backend`` (in eval mode) with
    ``sampling``, each turn's sampling seed drawn from a generator seeded with ``seed``; ``resets`` are the sessions' reset arguments (``seed``,
    ``scenario_id``, ``member`` on panel servers). Success is the env's ``info["success"]`` when it reports
    one, else a positive return. Used by :func:`make_rollout_func` and for held-out evaluation.
    """
    delta = delta or ChatDelta(backend)
    rng = np.random.default_rng(seed)
    sessions = [SimpopEnvClient(base_url=base_url, **(client_kwargs or {})).sync() for _ in resets]
    was_training = backend.model.training
    backend.model.eval()
    try:
        results = [env.reset(**kwargs) for env, kwargs in zip(sessions, resets)]
        ledgers = [TokenLedger() for _ in resets]
        returns = [0.0] * len(resets)

        def policy_system_prompt(view: dict[str, Any]) -> str | None:
            return system_prompt if system_prompt is not None else view.get("instructions")

        while live := [i for i, r in enumerate(results) if not r.done]:
            batch = [ledgers[i].extend(delta, json.loads(results[i].observation.text), policy_system_prompt)
                     for i in live]
            params = dataclasses.replace(sampling, seed=int(rng.integers(2**31)))
            for i, generation in zip(live, backend.generate_ids(batch, params)):
                ledgers[i].add_generation(generation)
                results[i] = sessions[i].step(generation.text)
                returns[i] += float(results[i].reward or 0.0)
    finally:
        backend.model.train(was_training)
        for env in sessions:
            env.close()
    infos = [r.metadata.get("info", {}) for r in results]
    return PlayedDialogues(
        ledgers=ledgers, returns=returns,
        successes=[float(info["success"]) if "success" in info else float(g > 0) for info, g in zip(infos, returns)],
        expected=[float(info["expected_success"]) if info.get("expected_success") is not None else None
                  for info in infos],
        simulators=[str(r.metadata.get("simulator")) for r in results])
