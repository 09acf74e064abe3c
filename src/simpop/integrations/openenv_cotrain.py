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
  optimiser states, their versions, the update log and the :class:`~simpop.train.cotrain.CoTrainConfig` they were
  trained with; ``resume=True`` continues from the newest one. The folder is checked and locked
  (:func:`simpop.files.run_lock`: one writer) before anything runs, and without ``resume`` it must hold no
  checkpoint. A resume refuses, naming it, a setting that shapes the checkpoint (:data:`SHAPING`: the objective
  decides which parameters the optimisers hold), other simulators, and another kind of checkpoint; other
  settings may change and apply (a new ``sim_lr`` goes into the restored optimisers). A checkpoint that cannot be
  written (a full disk) is a counted one-line warning (:attr:`ServerCoTrainer.checkpoint_failures`): training
  goes on and the next update's checkpoint tries again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from simpop import checkpoint
from simpop.files import run_lock
from simpop.integrations.openenv_server import SimpopEnvironment, SimpopObservation, UserSeatSource
from simpop.seat import Trainable
from simpop.simulators.population import leaf_simulators
from simpop.train.config import changed_settings, json_ready, to_dict
from simpop.train.cotrain import CoTrainConfig, CoTrainer

log = logging.getLogger(__name__)

#: CoTrainConfig fields a resume may not change (they decide what the checkpoint holds), with their flags.
SHAPING = {"objective": "--cotrain-objective"}
#: What a server co-training checkpoint holds.
_ENTRIES = ("simulators", "versions", "optimizers", "history")


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
        run_dir: Where checkpoints go (None: no checkpoints); locked until :meth:`close`.
        resume: Continue from ``run_dir``'s newest checkpoint.

    Raises:
        ValueError: Bad settings or simulators; a ``run_dir`` that cannot be written or that another run holds;
            checkpoints in ``run_dir`` without ``resume``; a resume that does not fit them (module docstring).
    """

    def __init__(self, source: UserSeatSource, config: CoTrainConfig | None = None, episodes_per_update: int = 16,
                 run_dir: str | Path | None = None, resume: bool = False):
        if source.panel is not None:
            raise ValueError("--cotrain trains the user seat's simulators; a panel is for evaluation (held out)")
        if resume and run_dir is None:
            raise ValueError("resume needs the run_dir (--cotrain-dir) where the checkpoints are")
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
        self.stale = self.checkpoint_failures = 0
        self.run_dir = None if run_dir is None else Path(run_dir)
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="simpop-cotrain")
        self._pending: list[Future] = []
        self._training: set[str] = set()  # simulators with an update under way
        self._held = contextlib.ExitStack()  # run_dir's writer lock
        if self.run_dir is None:
            return
        self._held.enter_context(run_lock(self.run_dir, "--cotrain-dir"))
        try:
            if resume:
                self._resume(self.run_dir)
            elif checkpoint.latest(self.run_dir) is not None:
                raise ValueError(f"--cotrain-dir {self.run_dir} already holds checkpoints; pass --resume to continue "
                                 f"a co-training run's, or choose another --cotrain-dir")
        except BaseException:
            self._held.close()
            raise

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
        except Exception:  # a failed update must not take the server down: logged, weights unchanged
            log.exception("co-training update of %s from version %d failed", name, version)
            with self._lock:
                self._training.discard(name)
            return
        if self.run_dir is not None:
            self._checkpoint(self.run_dir)

    def _checkpoint(self, run_dir: Path) -> None:
        """Save a checkpoint; a failed one is counted and logged (a write error, such as a full disk, in one line),
        and training goes on: the next update's checkpoint tries again."""
        try:
            checkpoint.save(run_dir, sum(self.versions.values()), self.state_dict())
        except OSError as error:
            from simpop.user_input import error_line

            self.checkpoint_failures += 1
            log.warning("co-training: writing a checkpoint in %s failed (%s; %d failed so far); the server goes on "
                        "training and the next update tries again", run_dir, error_line(error),
                        self.checkpoint_failures)
        except Exception:  # not a write error: a fault to see whole, but not one to take the server down
            self.checkpoint_failures += 1
            log.exception("co-training: a checkpoint in %s failed", run_dir)

    def wait(self) -> None:
        """Block until every queued update has finished (tests, shutdown)."""
        for future in list(self._pending):
            future.result()

    def close(self) -> None:
        """Finish the queued updates, then stop the update thread and release ``run_dir``."""
        try:
            self.wait()
            self._worker.shutdown()
        finally:
            self._held.close()

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint: published weights and versions of every simulator, the optimisers, the update history,
        the count of stale episodes (dropped as off-policy) and the settings (``CoTrainConfig``) they were trained
        with."""
        with self._lock:
            return {"simulators": dict(self.published), "versions": dict(self.versions),
                    "optimizers": [o.state_dict() for o in self.step.optimizers], "history": list(self.history),
                    "stale": self.stale, "settings": json_ready(to_dict(self.config))}

    def _resume(self, run_dir: Path) -> None:
        found = checkpoint.load_latest(run_dir, restore_rng=False)
        if found is None:
            log.info("co-training: no checkpoint in %s; starting from the base simulators", run_dir)
            return
        path, _, state = found
        if not isinstance(state, dict) or not set(_ENTRIES) <= set(state):
            held = ", ".join(sorted(map(str, state))[:8]) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"--cotrain-dir {run_dir} holds another kind of checkpoint ({path.name}: {held}); "
                             f"expected a server co-training checkpoint ({', '.join(_ENTRIES)}): choose the "
                             f"--cotrain-dir of a `simpop openenv serve --cotrain` run, or a new one")
        self._check_settings(path, state.get("settings", {}))  # none saved: an earlier server's, at the defaults
        if set(state["simulators"]) != set(self.masters):
            raise ValueError(f"checkpoint {path} holds simulators {sorted(state['simulators'])}, this server "
                             f"{sorted(self.masters)}: resume with the same --simulator specs")
        for name, master in self.masters.items():
            master.load_state_dict(state["simulators"][name])
        for optimizer, saved in zip(self.step.optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(saved)
            for group in optimizer.param_groups:  # the saved state carries the old learning rate
                group["lr"] = self.config.sim_lr
        self.versions, self.published = dict(state["versions"]), dict(state["simulators"])
        self.history, self.stale = list(state["history"]), int(state["stale"])
        log.info("co-training resumed from %s (versions %s)", path, self.versions)

    def _check_settings(self, path: Path, saved: dict[str, Any]) -> None:
        """Refuse a resume that changes a :data:`SHAPING` setting (one line: the setting, saved and given values);
        log the other changed settings, which apply."""
        given, default = to_dict(self.config), to_dict(CoTrainConfig())
        changed = changed_settings(saved, self.config, CoTrainConfig())
        values = {name: (saved.get(name, default.get(name)), given.get(name)) for name in changed}
        refused = [f"{name} ({SHAPING[name]}): saved {values[name][0]!r}, given {values[name][1]!r}"
                   for name in changed if name in SHAPING]
        if refused:
            raise ValueError(f"--resume with a setting that does not fit checkpoint {path}: {'; '.join(refused)}; "
                             f"resume with the saved setting, or use a new --cotrain-dir")
        if changed:
            log.info("co-training: resuming with changed settings (applied): %s",
                     ", ".join(f"{name} {old!r} -> {new!r}" for name, (old, new) in values.items()))


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
