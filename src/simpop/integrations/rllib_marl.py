"""PPO with RLlib, unmodified, on act-level simpop envs: both seats at once, or the policy seat against a population.

RLlib's own ``PPO`` on its new API stack, in this process (no env-runner or learner actors; Ray starts a local
instance beside it), with the settings of the TorchRL route (:class:`~simpop.integrations.marl_ppo.MarlConfig`),
judged by the same frozen-opponent rule (:func:`~simpop.integrations.marl_ppo.evaluate`,
:func:`~simpop.integrations.marl_ppo.gain`).

Both seats (:func:`train_both_seats`): RLlib's ``ParallelPettingZooEnv`` around
:class:`~simpop.integrations.marl.MarlView` and a module per seat (``policies`` = the seats). Two things RLlib
expects differently from TorchRL, done by :class:`RLlibView` (a PettingZoo wrapper between the two):

- the user seat's realism mask travels in its observation (``{"observations", "action_mask"}``, RLlib's convention),
  read by RLlib's ``ActionMaskingTorchRLModule``; the policy seat keeps RLlib's default module;
- the turn cap ends an episode as a termination, not a truncation, so RLlib's GAE does not bootstrap there (the
  TorchRL route's ``terminated=done``; bootstrapping paid the policy seat for stalling to the cap).

RLlib's PPO has one ``gamma`` for all modules and always standardises advantages, so unlike the TorchRL route the
user seat's objective is not exactly ``-KL(user || reference)``: it gets the policy seat's ``gamma`` and its own
entropy coefficient (``MarlConfig.user_entropy``, per module).

The policy seat alone (:func:`train_policy_seat`): simpop's single-agent view ``gymnasium.make(env_id,
simulator=population)``, the same PPO. RLlib lives in its own environment (``make rllib-env``: ``ray[rllib]`` pins
gymnasium 1.2.2); ``python -m simpop.integrations.rllib_marl`` trains there and prints the rule's figures as JSON.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from pettingzoo.utils.wrappers import BaseParallelWrapper

import simpop
from simpop.integrations.marl import MarlView
from simpop.integrations.marl_ppo import MarlConfig, Trained, evaluate, gain
from simpop.simulators.registry import build_simulator
from simpop.user_input import SEED, ArgumentParser, integer

try:
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig as RLlibPPOConfig
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModule, RLModuleSpec
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv
    from ray.rllib.examples.rl_modules.classes.action_masking_rlm import ActionMaskingTorchRLModule
    from ray.tune.registry import register_env
    from torch import nn
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("simpop.integrations.rllib_marl needs RLlib: pip install 'simpop[rllib]' (in this repository: "
                      "make rllib-env)") from error


class RLlibView(BaseParallelWrapper):
    """:class:`MarlView` as RLlib reads a parallel env: the user seat's action mask in its observation, and the turn
    cap as a termination."""

    def __init__(self, view: MarlView):
        super().__init__(view)
        self.view = view
        self.user = view.dialogue.user_seat

    def observation_space(self, agent: str) -> spaces.Space:
        """The view's space; the user seat's is ``Dict(observations=<the view's>, action_mask=Box(0, 1, (n,)))``."""
        space = self.env.observation_space(agent)
        if agent != self.user:
            return space
        mask = spaces.Box(0.0, 1.0, (self.env.action_space(agent).n,), np.float32)
        return spaces.Dict({"observations": space, "action_mask": mask})

    def _masked(self, observations: dict[str, Any], infos: dict[str, dict[str, Any]]) -> dict[str, Any]:
        if self.user in observations:
            mask = infos[self.user]["action_mask"].astype(np.float32)
            observations = {**observations, self.user: {"observations": observations[self.user], "action_mask": mask}}
        return observations

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        """The view's reset, the user seat's mask in its observation."""
        observations, infos = self.env.reset(seed=seed, options=options)
        return self._masked(observations, infos), infos

    def step(self, actions: dict[str, Any]):
        """The view's step, the user seat's mask in its observation; an episode ends as a termination."""
        observations, rewards, terminations, truncations, infos = self.env.step(actions)
        ended = {seat: terminations[seat] or truncations[seat] for seat in terminations}
        return (self._masked(observations, infos), rewards, ended, dict.fromkeys(truncations, False), infos)


class _EndAtCap(gymnasium.Wrapper):
    """The single-agent view with the turn cap as a termination (as :class:`RLlibView`)."""

    def step(self, action: Any):
        observation, reward, terminated, truncated, info = self.env.step(action)
        return observation, reward, terminated or truncated, False, info


class _Logits(nn.Module):
    """A trained RLlib module as :func:`~simpop.integrations.marl_ppo.evaluate` takes a seat: observation -> logits.
    A masking module (``mask_size`` actions) gets an all-ones mask: ``evaluate`` applies the realism mask itself."""

    def __init__(self, algorithm: Any, module_id: str, mask_size: int = 0):
        super().__init__()
        self.module: RLModule = algorithm.get_module(module_id)
        self.mask_size = mask_size

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        obs: Any = observation[None].float()
        if self.mask_size:
            obs = {"observations": obs, "action_mask": torch.ones(1, self.mask_size)}
        with torch.no_grad():
            return self.module.forward_inference({"obs": obs})["action_dist_inputs"][0]


def _ppo(config: MarlConfig, env: str, env_config: dict[str, Any]) -> RLlibPPOConfig:
    """RLlib's PPO with ``config``'s settings, its sampling and learning in this process. Unless Ray is running,
    starts a local instance of its own (one CPU, no dashboard), never one it finds on the machine."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    return (RLlibPPOConfig()
            .environment(env, env_config=env_config)
            .env_runners(num_env_runners=0, num_envs_per_env_runner=config.n_envs)
            .learners(num_learners=0)
            .training(train_batch_size_per_learner=config.frames_per_batch, minibatch_size=config.minibatch_size,
                      num_epochs=config.epochs, lr=config.lr, lambda_=config.gae_lambda, gamma=config.gamma,
                      clip_param=config.clip_eps, entropy_coeff=config.ent_coef, vf_loss_coeff=config.vf_coef,
                      use_kl_loss=False, grad_clip=config.max_grad_norm or None)
            .debugging(seed=config.seed, log_level="ERROR"))


def _model(config: MarlConfig) -> DefaultModelConfig:
    return DefaultModelConfig(fcnet_hiddens=[config.hidden_size, config.hidden_size], fcnet_activation="tanh")


def _train(algorithm: Any, config: MarlConfig, measure: Callable[[dict[str, Any]], dict[str, float]],
           log: Callable[[str], Any]) -> list[dict[str, float]]:
    history, start = [], time.perf_counter()
    try:
        for iteration in range(config.iterations):
            result = algorithm.train()
            record = {"iteration": float(iteration), **measure(result), "seconds": time.perf_counter() - start}
            history.append(record)
            log(" ".join(f"{k}={v:.3f}" for k, v in record.items()))
    finally:
        algorithm.stop()
    return history


def _marl_env(env_config: dict[str, Any]) -> ParallelPettingZooEnv:
    view = MarlView(simpop.make(env_config["env_id"], **env_config["env_kwargs"]), realism=env_config["realism"],
                    floor=env_config["floor"])
    return ParallelPettingZooEnv(RLlibView(view))


def _solo_env(env_config: dict[str, Any]) -> gymnasium.Env:
    return _EndAtCap(gymnasium.make(env_config["env_id"], simulator=env_config["population"],
                                    **env_config["env_kwargs"]))


register_env("simpop-marl", _marl_env)
register_env("simpop-solo", _solo_env)


def train_both_seats(config: MarlConfig | None = None, log: Callable[[str], Any] = print) -> Trained:
    """RLlib's PPO on both seats at once, a module per seat. Records (means over the iteration's finished episodes):
    ``user_return`` (the user seat's realism rewards summed), ``policy_success`` and ``episode_steps``."""
    config = config or MarlConfig()
    dialogue = simpop.make(config.env_id, **config.env_kwargs)
    policy, user = dialogue.policy_seat, dialogue.user_seat
    env_config = {"env_id": config.env_id, "env_kwargs": config.env_kwargs, "realism": config.realism,
                  "floor": config.realism_floor}
    specs = {policy: RLModuleSpec(model_config=_model(config)),
             user: RLModuleSpec(module_class=ActionMaskingTorchRLModule, model_config=_model(config))}
    # A list, not a set: the modules are built in this order from the seeded RNG (a set's order varies by process).
    algorithm = (_ppo(config, "simpop-marl", env_config)
                 .multi_agent(policies=[policy, user], policy_mapping_fn=lambda agent, episode, **kwargs: agent,
                              algorithm_config_overrides_per_module={
                                  user: RLlibPPOConfig.overrides(entropy_coeff=config.user_entropy)})
                 .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs=specs))
                 .build_algo())

    def measure(result: dict[str, Any]) -> dict[str, float]:
        runners = result["env_runners"]  # no key for a figure while no episode has ended
        returns = runners.get("agent_episode_returns_mean", {})
        return {"user_return": float(returns.get(user, np.nan)), "policy_success": float(returns.get(policy, np.nan)),
                "episode_steps": float(runners.get("episode_len_mean", np.nan))}

    history = _train(algorithm, config, measure, log)
    return Trained(history, {policy: _Logits(algorithm, policy),
                             user: _Logits(algorithm, user, mask_size=dialogue.action_space(user).n)})


def train_policy_seat(population: Any, config: MarlConfig | None = None,
                      log: Callable[[str], Any] = print) -> Trained:
    """RLlib's PPO on the policy seat alone against ``population`` (simulator spec(s), or a factory returning a
    simulator: one per env copy). Records ``policy_success``."""
    config = config or MarlConfig()
    if isinstance(population, (str, list, tuple, dict)):
        specs = population
        population = lambda: build_simulator(specs, env=simpop.make(config.env_id, **config.env_kwargs))  # noqa: E731
        population()  # a bad spec fails here (ValueError), before Ray starts
    elif not callable(population):
        raise TypeError("population must be simulator spec(s) or a factory returning a simulator (each env copy "
                        f"needs its own), got {type(population).__name__}")
    env_config = {"env_id": config.env_id, "env_kwargs": config.env_kwargs, "population": population}
    algorithm = _ppo(config, "simpop-solo", env_config).rl_module(model_config=_model(config)).build_algo()

    def measure(result: dict[str, Any]) -> dict[str, float]:
        return {"policy_success": float(result["env_runners"].get("episode_return_mean", np.nan))}

    history = _train(algorithm, config, measure, log)
    return Trained(history, {simpop.make(config.env_id).policy_seat: _Logits(algorithm, DEFAULT_MODULE_ID)})


def _figures(trained: np.ndarray, random: np.ndarray, cost: bool = False) -> dict[str, Any]:
    """The rule on one seat: trained vs uniformly random (for a ``cost``, lower is better)."""
    result = gain(random, trained) if cost else gain(trained, random)
    return {"trained": float(trained.mean()), "random": float(random.mean()), "difference": result.difference,
            "se": result.se, "learned": result.learned}


def main(argv: list[str] | None = None) -> int:
    """``python -m simpop.integrations.rllib_marl {both,solo}``: train, then print one JSON object: the history,
    CPU and wall seconds, and the frozen-opponent rule's figures on ``--episodes`` fixed seeds."""
    parser = ArgumentParser(prog="python -m simpop.integrations.rllib_marl",
                            description="Train simpop/PersuasionAct-v0 with RLlib's PPO; print the frozen-opponent "
                                        "rule's figures as JSON.")
    parser.add_argument("mode", choices=["both", "solo"], help="both seats, or the policy seat against --population")
    parser.add_argument("--iterations", type=integer(1, 10_000), default=None, help="default: 30 (both), 20 (solo)")
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--episodes", type=integer(2, 100_000), default=300)
    parser.add_argument("--population", nargs="+", default=["persuadee", "persuadee?temperature=0.8"],
                        help="simulator specs the policy seat trains against (solo)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    wall, cpu = time.perf_counter(), time.process_time()
    quiet = lambda line: None  # noqa: E731
    if args.mode == "both":
        config = MarlConfig(iterations=args.iterations or 30, seed=args.seed)
        trained = train_both_seats(config, log=quiet)
        persuader, user = trained.policies["persuader"], trained.policies["persuadee"]
    else:
        config = MarlConfig(iterations=args.iterations or 20, seed=args.seed)
        try:
            trained = train_policy_seat(args.population, config, log=quiet)
        except ValueError as error:  # a bad --population spec, refused before training
            parser.error(f"--population: {error}")
        persuader = trained.policies["persuader"]
    out: dict[str, Any] = {"mode": args.mode, "seed": args.seed, "iterations": config.iterations,
                           "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
                           "history": trained.history}
    episodes = args.episodes
    reference = "persuadee"
    if args.mode == "both":
        out["policy_vs_final_user"] = _figures(evaluate(persuader, user, config, episodes).success,
                                               evaluate(None, user, config, episodes).success)
        out["user_kl"] = _figures(evaluate(None, user, config, episodes).user_kl,
                                  evaluate(None, None, config, episodes).user_kl, cost=True)
    out["policy_vs_reference"] = _figures(evaluate(persuader, reference, config, episodes).success,
                                          evaluate(None, reference, config, episodes).success)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
