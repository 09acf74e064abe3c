"""Co-training behind the OpenEnv server (``simpop openenv serve --cotrain``).

An outside trainer (TRL, ...) trains the policy through the server; meanwhile the server trains its
trainable simulators (act-level ones such as ``trainable:persuadee``, LoRA ones such as
``trainable:smollm2``) on the episodes it hosts, with :class:`~simpop.train.cotrain.CoTrainer`'s simulator
step and objectives (``target``, ``persona``, ``realism``, ``adversarial``, ``diverse``;
:class:`~simpop.train.cotrain.CoTrainConfig`), unchanged.

- **Masters and session copies.** The server keeps one *master* per trainable simulator spec (built on its
  own backends, so training never touches weights a session is sampling from). Every session has its own
  copies (their dialogue slots are its own) and loads the newest published master weights at each reset;
  the versions it played with are ``metadata["simulator_versions"]``.
- **Updates.** A finished episode's record (the copy's :attr:`~simpop.seat.Trainable.episodes` entry) and
  its success (``info["success"]``, else return > 0) are queued for the master that played it. Every
  ``episodes_per_update`` on-policy episodes of a master, a background thread takes CoTrainer's simulator
  step on them, publishes the new weights as the next version and writes a checkpoint. Episodes played
  with an older version than the master's current one, or that end while it is being updated, are
  off-policy for its score-function objective: they are dropped and counted (``stale``).
- **Checkpoints and resume.** ``run_dir/checkpoints`` (:mod:`simpop.checkpoint`): the masters' weights and
  optimiser states, their versions and the update log; ``resume=True`` continues from the newest one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from simpop import checkpoint
from simpop.integrations.openenv_server import SimpopEnvironment, SimpopObservation, UserSeatSource
from simpop.seat import Trainable
from simpop.simulators.population import leaf_simulators
from simpop.train.cotrain import CoTrainConfig, CoTrainer

log = logging.getLogger(__name__)


class _SimulatorStep(CoTrainer):
    """CoTrainer's simulator side (objective set-up, optimisers, ``update_simulators``) without a policy trainer:
    the policy trains outside the server. The methods are CoTrainer's own, so the objectives stay in one place."""

    def __init__(self, simulators: Sequence[Trainable], config: CoTrainConfig):  # no CoTrainer.__init__: no policy
        self.config, self.simulators = config, list(simulators)
        self.reference_sizes = self._prepare_objective()
        self.optimizers = [torch.optim.Adam(self._trained(s), lr=config.sim_lr) for s in self.simulators]


class ServerCoTrainer:
    """Trains a server's trainable simulators on the episodes its sessions host (module docstring).

    Args:
        source: The server's user seat: specs of trainable simulators (one, or a population).
        config: CoTrainer's simulator settings and objective (its pool settings do not apply here).
        episodes_per_update: On-policy episodes of one simulator per optimiser update.
        run_dir: Where checkpoints go (None: no checkpoints).
        resume: Continue from ``run_dir``'s newest checkpoint.
    """

    def __init__(self, source: UserSeatSource, config: CoTrainConfig | None = None, episodes_per_update: int = 16,
                 run_dir: str | Path | None = None, resume: bool = False):
        if source.panel is not None:
            raise ValueError("--cotrain trains the user seat's simulators; a panel is for evaluation (held out)")
        if episodes_per_update < 2:
            raise ValueError(f"episodes_per_update must be >= 2 (the objective compares episodes), "
                             f"got {episodes_per_update}")
        self.source, self.episodes_per_update = source, episodes_per_update
        self.config = config or CoTrainConfig()
        if self.config.pool_size or self.config.population_size != 1:
            raise ValueError("server co-training takes its population from the --simulator specs; leave "
                             "population_size=1 and pool_size=0")
        from simpop.envs.registration import make
        from simpop.simulators.registry import build_simulator

        # Masters on backends of their own: training never writes weights a session is sampling from.
        specs: Any = source.simulators[0] if len(source.simulators) == 1 else list(source.simulators)
        masters = leaf_simulators([build_simulator(specs, env=make(source.env_id, **source.env_kwargs),
                                                   backends={})])
        untrainable = [m.name for m in masters if not isinstance(m, Trainable)]
        if untrainable:
            raise ValueError(f"--cotrain needs trainable simulators (e.g. trainable:persuadee, trainable:smollm2); "
                             f"not trainable: {', '.join(untrainable)}")
        if len({m.name for m in masters}) != len(masters):
            raise ValueError("trainable simulators need distinct names (give distinct specs)")
        self.masters: dict[str, Any] = {m.name: m for m in masters}
        self.step = _SimulatorStep(list(self.masters.values()), self.config)
        self.versions = dict.fromkeys(self.masters, 0)
        self.published = {name: _clone(m.state_dict()) for name, m in self.masters.items()}
        self.queues: dict[str, list[tuple[Any, float]]] = {name: [] for name in self.masters}
        self.history: list[dict[str, Any]] = []
        self.stale = 0
        self.run_dir = None if run_dir is None else Path(run_dir)
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="simpop-cotrain")
        self._pending: list[Future] = []
        self._training: set[str] = set()  # simulators with an update under way
        if resume:
            self._resume()

    # ----------------------------------------------------------------- sessions
    def environment(self) -> CoTrainedEnvironment:
        """A session's environment (the server's per-session factory)."""
        return CoTrainedEnvironment(self.source, self)

    def sync(self, copies: dict[str, Any], loaded: dict[str, int]) -> dict[str, int]:
        """Load the newest published weights into a session's simulator copies; the versions they now hold."""
        with self._lock:
            for name, copy in copies.items():
                if loaded.get(name) != self.versions[name]:
                    copy.load_state_dict(self.published[name])
                    loaded[name] = self.versions[name]
            return dict(loaded)

    def record(self, name: str, episode: Any, success: float, version: int) -> None:
        """Queue a finished episode of simulator ``name`` played with ``version``; update when enough are queued."""
        with self._lock:
            if version != self.versions[name] or name in self._training:  # off-policy for the next version
                self.stale += 1
                return
            queue = self.queues[name]
            queue.append((episode, success))
            if len(queue) < self.episodes_per_update:
                return
            self.queues[name] = []
            self._training.add(name)
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._worker.submit(self._update, name, queue, version))

    def _update(self, name: str, queue: list[tuple[Any, float]], version: int) -> None:
        try:
            master = self.masters[name]
            for sim in self.masters.values():
                sim.clear()
            master.episodes = [episode for episode, _ in queue]
            trajectories = [SimpleNamespace(simulator=name, success=bool(s)) for _, s in queue]
            batch: Any = SimpleNamespace(trajectories=trajectories, collected=None, kept=None)  # what it reads
            metrics = self.step.update_simulators(batch)
            master.clear()
            with self._lock:
                self.versions[name] = version + 1
                self.published[name] = _clone(master.state_dict())
                self._training.discard(name)
                self.history.append({"simulator": name, "version": version + 1, "episodes": len(queue),
                                     "stale_total": self.stale, **metrics})
            log.info("co-trained %s to version %d on %d episodes: %s", name, version + 1, len(queue),
                     {k: round(v, 4) for k, v in metrics.items()})
            if self.run_dir is not None:
                checkpoint.save(self.run_dir, sum(self.versions.values()), self.state_dict())
        except Exception:  # a failed update must not take the server down: logged, weights unchanged
            log.exception("co-training update (or checkpoint) of %s from version %d failed", name, version)
            with self._lock:
                self._training.discard(name)

    def wait(self) -> None:
        """Block until every queued update has finished (tests, shutdown)."""
        for future in list(self._pending):
            future.result()

    def close(self) -> None:
        """Finish the queued updates, then stop the update thread."""
        self.wait()
        self._worker.shutdown()

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint: published weights and versions of every simulator, the optimisers, the update history
        and the count of stale episodes (dropped as off-policy)."""
        with self._lock:
            return {"simulators": dict(self.published), "versions": dict(self.versions),
                    "optimizers": [o.state_dict() for o in self.step.optimizers], "history": list(self.history),
                    "stale": self.stale}

    def _resume(self) -> None:
        found = None if self.run_dir is None else checkpoint.load_latest(self.run_dir, restore_rng=False)
        if found is None:
            log.info("co-training: no checkpoint in %s; starting from the base simulators", self.run_dir)
            return
        path, _, state = found
        if set(state["simulators"]) != set(self.masters):
            raise ValueError(f"checkpoint {path} holds simulators {sorted(state['simulators'])}, this server "
                             f"{sorted(self.masters)}: resume with the same --simulator specs")
        for name, master in self.masters.items():
            master.load_state_dict(state["simulators"][name])
        for optimizer, saved in zip(self.step.optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(saved)
        self.versions, self.published = dict(state["versions"]), dict(state["simulators"])
        self.history, self.stale = list(state["history"]), int(state["stale"])
        log.info("co-training resumed from %s (versions %s)", path, self.versions)


class CoTrainedEnvironment(SimpopEnvironment):
    """A session whose trainable simulators load the newest co-trained weights at each reset and report
    the episodes they play to the :class:`ServerCoTrainer`."""

    def __init__(self, source: UserSeatSource, cotrainer: ServerCoTrainer):
        super().__init__(source)
        self.cotrainer = cotrainer
        self.copies: dict[str, Any] = {s.name: s for s in leaf_simulators([self.seat_filler])}  # type: ignore
        if cotrainer.config.objective == "persona":  # the copies play personas drawn by the trained sampler
            for copy in self.copies.values():
                copy.use_persona_sampler()
        self.loaded: dict[str, int] = {}
        self.playing: dict[str, int] = {}

    def reset(self, seed: int | None = None, episode_id: str | None = None, scenario_id: str | None = None,
              member: str | None = None, **kwargs: Any) -> SimpopObservation:
        """Load the newest published weights into this session's simulators, then start the episode as
        :meth:`SimpopEnvironment.reset` does."""
        self.playing = self.cotrainer.sync(self.copies, self.loaded)
        for copy in self.copies.values():
            copy.clear()
        return super().reset(seed=seed, episode_id=episode_id, scenario_id=scenario_id, member=member, **kwargs)

    def episode_ended(self, info: dict[str, Any]) -> None:
        copy = self.copies.get(self.member or "")
        if copy is None or len(copy.episodes) != 1:
            log.warning("co-training: session simulator %r recorded %d episodes for one; not used", self.member,
                        0 if copy is None else len(copy.episodes))
            return
        success = float(info["success"]) if "success" in info else float(self.episode_return > 0)
        self.cotrainer.record(copy.name, copy.episodes[0], success, self.playing[copy.name])

    def extra_metadata(self) -> dict[str, Any]:
        return {"simulator_versions": dict(self.playing)}


def _clone(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of a state dict that later optimiser steps cannot change."""
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
