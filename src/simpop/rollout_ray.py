"""Ray rollout workers: the rollout engine's waves run in Ray actors while the trainer stays in the driver.

:class:`RayRolloutEngine` is a :class:`~simpop.rollout.RolloutEngine` whose :meth:`~RayRolloutEngine.run`
splits the jobs into waves (:func:`~simpop.rollout.plan_waves`, each wave with its own generator) and
sends wave ``k`` to worker ``k mod workers``. A worker is a Ray actor (fractional CPUs allowed) holding its
own envs, simulator and policy copy:

- **envs** are made inside the worker from the env id (or factory) the engine was given;
- **the simulator** is built inside the worker from its spec (``simulator_spec``, any
  :func:`~simpop.simulators.registry.build_simulator` spec) when the engine was given one; a simulator
  set without a spec (``engine.simulator = ...``) is shipped pickled at every run. Trainable simulators
  learn from the dialogues they play, so they stay in the driver: Ray refuses them;
- **the policy**: a torch module policy (:class:`~simpop.agents.policy.ActPolicy`, PPO's actor-critic)
  travels once as a module and then as its ``state_dict`` at every run (an update's new weights); other
  policies (an OpenAI-compatible text policy, scripted baselines) are light and travel pickled at every
  run. A trained text policy that generates on a vLLM server (``LLMPolicy`` with a generator,
  ``--generator vllm:...``) ships only its served side (:meth:`~simpop.agents.policy.LLMPolicy.served`: the
  server client set to the newest synced adapter, and the tokenizer), so workers generate on the server
  while the model trains in the driver. A policy or shipped simulator holding an in-process language model
  (a torch module of more than :data:`LIVE_MODEL_PARAMETERS` parameters, e.g. ``LLMPolicy`` without a
  generator) is refused: serve the model (``simpop serve``, vLLM) and give the workers an HTTP policy
  (``openai:URL#MODEL``) or a generator instead.

Every dialogue runs start to end inside one wave on one worker (sticky routing: every turn of a dialogue is
asked by the same worker, in order, so a server's prefix cache sees each dialogue's growing prompt).
Trajectories come back in the order the local engine returns them, and are identical to the local
engine's with the same ``n_envs`` (same jobs, same wave generators, same per-dialogue simulator
generators). ``n_envs=None`` on Ray means one wave per worker (``ceil(jobs / workers)`` dialogues each).

Two things the local engine does that workers cannot share with the driver: the driver's simulator never
hears the workers' dialogues (a population whose weights adapt to ``feedback`` adapts per worker), and
counters kept on the driver's policy or simulator objects (e.g. text-format fallbacks) count nothing.

A wave whose worker fails (the actor died, a task raised) is run again in the driver, with the same
generator, so the result is unchanged (an error of the dialogue itself then raises there, as locally); a dead
worker is replaced when the cluster can start another within :data:`WORKER_START_S` (a node that died takes its
CPUs with it), else its slot is dropped and the remaining workers (or, with none left, the driver) run the waves.
``ray_fallback_waves`` in :attr:`RayRolloutEngine.fallbacks` counts the waves the driver ran (a warning is logged
each time; ``simpop train`` records it in the metrics).

The cluster: a local one is started on first use (``ray.init(num_cpus=...)``, no dashboard) unless Ray is
already initialised or :attr:`RayConfig.ray_address` names a cluster to join (simpop must be installed on
its nodes). ``simpop train grpo --ray --ray-workers 2`` turns it on for training, ``simpop eval --ray`` for
evaluation (:mod:`simpop.evaluation.eval_run`).
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from simpop.rollout import Job, RolloutEngine, RolloutStats, Trajectory, plan_waves
from simpop.seat import Simulator, Trainable
from simpop.validation import check_fields

logger = logging.getLogger(__name__)

#: Seconds a replacement worker may take to start before its slot is dropped (its node may be gone).
WORKER_START_S = 60.0


#: One wave: its jobs and the generator that drives its policy (:func:`~simpop.rollout.plan_waves`).
Wave = tuple[list[Job], np.random.Generator]
#: What a worker returns per wave: trajectories, stats, and ``env_view(env)`` per dialogue (if asked).
WaveResult = tuple[list[Trajectory], RolloutStats, list[Any]]


@dataclass(frozen=True)
class RayConfig:
    """Where rollouts run (the ``--ray`` flags of ``simpop train grpo`` are generated from these fields).

    Attributes:
        ray: Run the rollout waves in Ray worker actors (``pip install simpop[ray]``); the trainer stays here.
        ray_address: A running Ray cluster to join (``auto``, ``ray://HOST:10001``); None starts a local one
            (or uses the one this process already started).
        ray_workers: Rollout worker actors; wave ``k`` runs on worker ``k mod ray_workers``.
        ray_worker_cpus: CPUs each worker reserves (fractions share cores: 0.5 puts two workers on one core).
    """

    ray: bool = False
    ray_address: str | None = None
    ray_workers: int = 2
    ray_worker_cpus: float = 1.0

    def __post_init__(self) -> None:
        check_fields(self)
        if self.ray_workers < 1:
            raise ValueError(f"RayConfig: ray_workers must be >= 1, got {self.ray_workers}")
        if not 0 < self.ray_worker_cpus <= 1024:
            raise ValueError(f"RayConfig: ray_worker_cpus must be > 0 (fractions share a core), got "
                             f"{self.ray_worker_cpus}")
        if self.ray_address is not None and not self.ray_address.strip():
            raise ValueError("RayConfig: ray_address must name a cluster (auto, ray://HOST:PORT) or be None")


def import_ray() -> Any:
    """The ``ray`` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as error:
        raise ImportError("Ray rollout workers need Ray: pip install 'simpop[ray]'") from error
    return ray


def connect(config: RayConfig) -> Any:
    """Join ``config.ray_address`` or start a local cluster with room for the workers (no-op if Ray is up)."""
    ray = import_ray()
    if not ray.is_initialized():
        if config.ray_address:
            ray.init(address=config.ray_address, log_to_driver=False)
        else:
            needed = math.ceil(config.ray_workers * config.ray_worker_cpus)
            ray.init(num_cpus=max(os.cpu_count() or 1, needed), include_dashboard=False, log_to_driver=False)
    return ray


class RolloutWorker:
    """One Ray actor's state: its envs, simulator and policy copy, and a local engine that runs its waves.

    Args:
        env_fn: Makes a fresh env (called inside the worker).
        threads: torch CPU threads in this worker (its CPU share, at least 1).
    """

    def __init__(self, env_fn: Callable[[], Any], threads: int):
        import torch

        torch.set_num_threads(threads)
        self.env_fn = env_fn
        self.engine: RolloutEngine | None = None
        self._module_key: Any = None
        self._module: Any = None
        self._simulator_key: Any = None
        self._simulator: Simulator | None = None

    def run_waves(self, policy: dict[str, Any], simulator: dict[str, Any], waves: list[Wave],
                  env_view: Callable[[Any], Any] | None = None) -> bytes:
        """Run ``waves`` one after another; per wave, its trajectories, stats and env views, pickled in one
        piece (Ray would give each of the trajectories' many small arrays a buffer of its own: ~3x slower)."""
        policy_obj, simulator_obj = self._policy(policy), self._simulator_for(simulator)
        if self.engine is None:
            self.engine = RolloutEngine(self.env_fn, policy_obj, simulator_obj)
        else:
            self.engine.policy, self.engine.simulator = policy_obj, simulator_obj
        out = []
        for jobs, rng in waves:
            self.engine.stats = RolloutStats()
            start = time.perf_counter()
            trajectories = self.engine.run_wave(jobs, rng)
            self.engine.stats.total_s = time.perf_counter() - start
            self.engine.stats.dialogues = len(trajectories)
            views = [env_view(env) for env in self.engine.env_pool(len(jobs))] if env_view else []
            out.append((trajectories, self.engine.stats, views))
        return pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)

    def _policy(self, payload: dict[str, Any]) -> Any:
        if "object" in payload:
            return payload["object"]
        if payload["key"] != self._module_key:
            import ray

            self._module, self._module_key = ray.get(payload["module"]), payload["key"]
        self._module.load_state_dict(payload["state"])
        return self._module

    def _simulator_for(self, payload: dict[str, Any]) -> Simulator:
        if "object" in payload:
            return payload["object"]
        if payload["key"] != self._simulator_key:
            from simpop.simulators.registry import build_simulator

            env = self.env_fn()
            self._simulator, self._simulator_key = build_simulator(payload["spec"], env), payload["key"]
        assert self._simulator is not None
        return self._simulator


class RayRolloutEngine(RolloutEngine):
    """A :class:`~simpop.rollout.RolloutEngine` whose waves run in Ray worker actors (module docstring).

    Args:
        env: A registered env id, or a zero-argument callable returning a fresh env (pickled to the workers).
        policy: The driver's policy; its weights are shipped to the workers at every :meth:`run`.
        simulator: The driver's simulator (rollouts use it only where no ``simulator_spec`` describes it).
        n_envs: Dialogues per wave; None: one wave per worker.
        env_kwargs: Constructor arguments when ``env`` is an id.
        config: Cluster address, workers and their CPU share.
        simulator_spec: The spec ``simulator`` was built from; workers build their own from it.
        env_view: Called in the worker on each dialogue's env when its wave ends; the results (picklable) are
            :attr:`env_views` (e.g. the transcript, for evaluation records).

    Attributes:
        stats: The last run's counts and model times summed over the workers; ``total_s`` is its wall time.
        fallbacks: ``{"ray_fallback_waves": n}``: waves re-run in the driver after a worker failed.
        env_views: ``env_view(env)`` per trajectory of the last run (empty without ``env_view``).
    """

    def __init__(self, env: str | Callable[[], Any], policy: Any, simulator: Simulator, n_envs: int | None = None,
                 env_kwargs: dict[str, Any] | None = None, *, config: RayConfig | None = None,
                 simulator_spec: Any = None, env_view: Callable[[Any], Any] | None = None):
        super().__init__(env, policy, simulator, n_envs, env_kwargs)
        if _holds_model(_rollout_side(policy)):
            raise ValueError(f"{type(policy).__name__} runs an in-process language model, which every Ray worker "
                             f"would have to copy; generate on a server (--generator vllm:...), roll out with an "
                             f"OpenAI-compatible policy (openai:URL#MODEL), or run without Ray")
        self.env_view = env_view
        self.env_views: list[Any] = []
        self.config = config or RayConfig(ray=True)
        self._ray = connect(self.config)
        self.fallbacks = {"ray_fallback_waves": 0}
        self._spec, self._spec_simulator = simulator_spec, simulator if simulator_spec is not None else None
        self._module_ref: Any = None
        self._module_key: Any = None
        self._workers = [self._new_worker() for _ in range(self.config.ray_workers)]
        pending = [worker.__ray_ready__.remote() for worker in self._workers]
        ready, _ = self._ray.wait(pending, num_returns=len(pending), timeout=WORKER_START_S)
        if len(ready) < len(pending):  # a task sent to a worker the cluster cannot place would wait forever
            self.close()
            raise ValueError(f"the Ray cluster started {len(ready)} of {len(pending)} rollout workers within "
                               f"{WORKER_START_S:.0f} s ({self.config.ray_worker_cpus:g} CPU each; it has "
                               f"{self._ray.available_resources().get('CPU', 0):g} free): lower --ray-workers or "
                               f"--ray-worker-cpus, or add nodes")

    def _new_worker(self) -> Any:
        actor = _remote_worker(self._ray).options(num_cpus=self.config.ray_worker_cpus)
        return actor.remote(self.env_fn, max(1, int(self.config.ray_worker_cpus)))

    def run(self, jobs: Sequence[Job], rng: np.random.Generator) -> list[Trajectory]:
        """Run ``jobs`` in waves spread over the workers; ``rng`` drives the policy's sampling."""
        size = self.n_envs or max(1, math.ceil(len(jobs) / len(self._workers)))
        return self.run_waves(plan_waves(jobs, rng, size))

    def run_waves(self, waves: Sequence[Wave]) -> list[Trajectory]:
        """Run planned waves (wave ``k`` on worker ``k mod workers``); their trajectories, in wave order."""
        self.stats = RolloutStats()
        start = time.perf_counter()
        n = len(self._workers)
        if n == 0:  # every worker was lost and none could be replaced: the driver runs the waves
            done = self._fallback(-1, list(waves), RuntimeError("no Ray workers left"))
            return self._gather(list(done), start)
        policy, simulator = self._policy_payload(), self._simulator_payload()  # small: sent inline with the task
        futures = [self._workers[w].run_waves.remote(policy, simulator, list(waves[w::n]), self.env_view)
                   for w in range(min(n, len(waves)))]
        results: list[WaveResult | None] = [None] * len(waves)
        for w, future in enumerate(futures):
            mine = list(range(w, len(waves), n))
            try:
                done = pickle.loads(self._ray.get(future))
            except Exception as error:  # a dead actor or a failing task: the driver runs these waves itself
                done = self._fallback(w, [waves[k] for k in mine], error)
            for k, result in zip(mine, done):
                results[k] = result
        self._workers = [worker for worker in self._workers if worker is not None]  # slots that could not restart
        return self._gather(results, start)

    def _gather(self, results: Sequence[WaveResult | None], start: float) -> list[Trajectory]:
        """The waves' trajectories in wave order, their summed stats and env views."""
        for result in results:
            if result is not None:
                for f in fields(RolloutStats):
                    if f.name != "total_s":
                        setattr(self.stats, f.name, getattr(self.stats, f.name) + getattr(result[1], f.name))
        out = [t for result in results if result for t in result[0]]
        self.env_views = [v for result in results if result for v in result[2]]
        self.stats.total_s = time.perf_counter() - start
        if self.stats.user_rejected:
            logger.warning("the env rejected %d user-seat actions in %d dialogues (Trajectory.user_rejected counts "
                           "them per dialogue)", self.stats.user_rejected, len(out))
        return out

    def close(self) -> None:
        """End the worker actors (the cluster stays up)."""
        for worker in self._workers:
            try:
                self._ray.kill(worker)
            except Exception:  # noqa: BLE001 - its node is gone already
                logger.debug("could not kill a Ray worker (its node is gone)")
        self._workers = []

    # ----------------------------------------------------------------- what travels to the workers
    def _policy_payload(self) -> dict[str, Any]:
        if not _is_module(self.policy):
            return {"object": _rollout_side(self.policy)}
        if self._module_key is not self.policy:  # a new policy object: its structure travels once
            self._module_ref, self._module_key = self._ray.put(self.policy), self.policy
        module: Any = self.policy  # a torch module (checked above)
        state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        return {"key": id(self._module_ref), "module": self._module_ref, "state": state}

    def _simulator_payload(self) -> dict[str, Any]:
        if self._spec is not None and self.simulator is self._spec_simulator:
            return {"key": id(self), "spec": self._spec}
        if isinstance(self.simulator, Trainable):
            raise ValueError(f"simulator {getattr(self.simulator, 'name', '?')!r} is trainable: it learns from the "
                             f"dialogues it plays, so it must play them in the driver; run without Ray")
        if _holds_model(self.simulator):
            raise ValueError(f"simulator {getattr(self.simulator, 'name', '?')!r} runs an in-process language model, "
                             f"which every Ray worker would have to copy; give its spec (simulator_spec) so that "
                             f"workers build their own, serve the model (an openai: backend spec), or run without Ray")
        return {"object": self.simulator}

    def _fallback(self, w: int, waves: list[Wave], error: BaseException) -> list[WaveResult]:
        self.fallbacks["ray_fallback_waves"] += len(waves)
        logger.warning("Ray worker %d failed (%s: %s); running its %d wave(s) in the driver",
                       w, type(error).__name__, str(error).strip().splitlines()[0] if str(error).strip() else "",
                       len(waves))
        if w >= 0 and isinstance(error, self._ray.exceptions.RayActorError):  # the actor is gone: start another
            try:
                self._ray.kill(self._workers[w])  # unreachable, perhaps not dead: release its CPUs
            except Exception:  # noqa: BLE001 - its node is gone already
                logger.debug("could not kill Ray worker %d (its node is gone)", w)
            self._workers[w] = self._replacement(w)
        out = []
        for jobs, rng in waves:
            self.stats, before = RolloutStats(), self.stats
            trajectories = self.run_wave(jobs, rng)
            views = [self.env_view(env) for env in self.env_pool(len(jobs))] if self.env_view else []
            out.append((trajectories, self.stats, views))
            self.stats = before
        return out


    def _replacement(self, w: int) -> Any:
        """A new worker for slot ``w``, or None when the cluster cannot start one within :data:`WORKER_START_S`."""
        actor = self._new_worker()
        ready, _ = self._ray.wait([actor.__ray_ready__.remote()], timeout=WORKER_START_S)
        if ready:
            try:
                self._ray.get(ready[0])
                return actor
            except Exception as error:  # noqa: BLE001 - it failed to start: reported below
                logger.debug("replacement worker failed to start: %s", error)
        self._ray.kill(actor)
        logger.warning("Ray worker %d could not be replaced within %.0f s (no room left on the cluster); "
                       "continuing with %d worker(s)", w, WORKER_START_S, sum(x is not None for x in self._workers) - 1)
        return None


_REMOTE: dict[str, Any] = {}


def _remote_worker(ray: Any) -> Any:
    """:class:`RolloutWorker` as a Ray actor class (made once per process)."""
    if "worker" not in _REMOTE:
        _REMOTE["worker"] = ray.remote(RolloutWorker)
    return _REMOTE["worker"]


def _rollout_side(policy: Any) -> Any:
    """What workers run of ``policy``: a text policy generating on a server ships its served side only."""
    served = getattr(policy, "served", None)
    side = served() if callable(served) else None
    return side if side is not None else policy


def _is_module(obj: Any) -> bool:
    try:
        from torch import nn
    except ImportError:
        return False
    return isinstance(obj, nn.Module)


#: A torch module with more parameters than this, found in a policy or simulator, is a language model (act-level
#: MLPs have thousands).
LIVE_MODEL_PARAMETERS = 5_000_000


def _holds_model(obj: Any, depth: int = 4) -> bool:
    """Whether ``obj`` (or what its attributes hold, ``depth`` levels down) is a large torch module."""
    if _is_module(obj):
        return sum(p.numel() for p in obj.parameters()) > LIVE_MODEL_PARAMETERS
    if depth == 0 or isinstance(obj, (str, bytes, int, float, np.ndarray)):
        return False
    if isinstance(obj, dict):
        children: Any = obj.values()
    elif isinstance(obj, (list, tuple)):
        children = obj[:64]  # models sit in attributes or short lists (population members), not in data
    else:
        children = getattr(obj, "__dict__", {}).values()
    return any(_holds_model(child, depth - 1) for child in children)
