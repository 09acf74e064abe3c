"""The one run loop: any :class:`Trainer` for N updates, with metrics, checkpoints, resume and evaluation.

Every trainer (GRPO and its variants, PPO, co-training, population co-training) is a :class:`Trainer`:
``step()`` runs one update and returns its metrics, ``state_dict()`` / ``load_state_dict()`` checkpoint
everything that trains. :func:`run` drives it; ``simpop train`` and ``simpop experiment collapse`` both
call it. A run folder holds::

    metrics.jsonl       one line per update ({"step", "kind": "train", ...}) and per evaluation ("kind": "eval")
    tb/                 TensorBoard scalars of the same (``report_to``: the default; :mod:`simpop.evaluation.trackers`)
    wandb-run-id        with ``report_to`` wandb: the Weights & Biases run that ``resume`` continues
    checkpoints/        atomic step_<k>.pt files, the newest ``keep_checkpoints`` kept
    config.yaml         the policy's ``model`` and ``grpo`` sections, and run.json (trainer, env): what
    run.json            ``simpop eval --policy run:DIR`` rebuilds the policy from (:func:`write_run_card`)

With ``evaluate``, the policy is evaluated before the first update (step 0, checkpointed so that a resumed
run does not repeat it), every ``eval_every`` updates and after the last. A killed run resumed from its
newest checkpoint continues exactly as an uninterrupted one (the log is cut back to that checkpoint and the
global RNG states are restored with it); a corrupted newest checkpoint is skipped, with a warning naming it, for
the newest intact one.

Every run also watches for updates with no gradient (:class:`~simpop.train.monitor.NoGradientWatch`: every GRPO
group's rewards equal for :data:`~simpop.train.monitor.NO_GRADIENT_WINDOW` updates in a row): one warning line and a
``"no_gradient_warning"`` record per such episode; its state is checkpointed, so a resumed run neither repeats nor
loses the warning.

With ``LoopConfig(monitor=True)`` and a ``probe``, a :class:`~simpop.train.monitor.CollapseMonitor` watches every
update and every probe (each ``probe_every`` updates: records of kind ``"probe"``); when it fires it logs a
``"collapse_warning"`` record and acts by ``on_collapse``: ``warn`` (only that), ``stop`` (checkpoint and end the
run) or ``add-simulators`` (call ``grow``, e.g. failure-driven simulator generation, and log what it added).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from simpop import checkpoint
from simpop.files import write_atomically
from simpop.validation import at_least_one, check_fields


@runtime_checkable
class Trainer(Protocol):
    """What :func:`run` needs of a trainer.

    Attributes:
        update_count: Updates completed so far (restored by :meth:`load_state_dict`).
        policy: The policy being trained.
    """

    update_count: int
    policy: Any

    @property
    def training_simulator(self) -> Any:
        """What the policy trains against (a simulator or population; evaluated as "training success")."""
        ...

    def step(self) -> dict[str, float]:
        """One update; its metrics."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything that trains (weights, optimisers, RNGs, counters), for checkpoints."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        ...


@dataclass(frozen=True)
class LoopConfig:
    """How a run is logged and checkpointed (``simpop train`` flags are generated from these fields).

    Attributes:
        save_every: Write a checkpoint every this many updates (and after the last one).
        keep_checkpoints: Checkpoints kept on disk (older ones are deleted).
        eval_every: Updates between evaluations when the run has an evaluation (also at 0 and at the end).
        report_to: Experiment trackers that also get the metrics, TRL's names: ``tensorboard`` (scalars under
            ``tb/``), ``wandb`` (Weights & Biases), both comma-separated, ``none`` or ``all`` (every one installed).
        monitor: Run the collapse early warning (:mod:`simpop.train.monitor`); needs a probe panel.
        probe_panel: The monitor's probe panel: a named panel or panel YAML (``simpop train``); it must differ
            from the held-out ``--panel``.
        probe_every: Updates between probe evaluations.
        probe_episodes: Dialogues per probe member and probe.
        on_collapse: What a warning does: ``warn``, ``stop`` (end the run) or ``add-simulators`` (grow the
            training pool with failure-driven simulators, :mod:`simpop.simulators.generation`).
    """

    save_every: int = 1
    keep_checkpoints: int = 3
    eval_every: int = 10
    report_to: str = "tensorboard"
    monitor: bool = False
    probe_panel: str | None = None
    probe_every: int = 10
    probe_episodes: int = 16
    on_collapse: str = "warn"

    def __post_init__(self) -> None:
        check_fields(self)
        from simpop.evaluation.trackers import trackers_named
        from simpop.train.monitor import ON_COLLAPSE

        try:
            trackers_named(self.report_to)
        except ValueError as error:
            raise ValueError(f"LoopConfig: {error}") from None

        at_least_one(self, ("save_every", "keep_checkpoints", "eval_every", "probe_every", "probe_episodes"))
        if self.on_collapse not in ON_COLLAPSE:
            raise ValueError(f"LoopConfig: on_collapse must be one of {', '.join(ON_COLLAPSE)}, got "
                             f"{self.on_collapse!r}")


#: Called with ``(step, record)`` for every record written (progress bars, parent processes).
Reporter = Callable[[int, dict[str, Any]], None]
#: ``probe(step) -> {member: success}``: the collapse monitor's probe panel.
Probe = Callable[[int], dict[str, float]]
#: ``grow(step, warning_record) -> record``: what ``on_collapse="add-simulators"`` calls (what it added, logged).
Grow = Callable[[int, dict[str, Any]], dict[str, Any]]
_MONITOR_KEY = "collapse_monitor"
_NO_GRADIENT_KEY = "no_gradient_watch"


def write_run_card(run_dir: str | Path, info: dict[str, Any], model: Any, grpo: Any) -> None:
    """Write a run folder's ``config.yaml`` (``model`` and ``grpo`` sections) and ``run.json`` (``info``: trainer,
    env, ...), as ``simpop train`` does, for run folders the experiments train: ``simpop eval --policy run:DIR``
    rebuilds the policy from them. The experiments write it on every start and resume (so a resume fills in a
    folder trained before it existed)."""
    import json

    import yaml

    from simpop.train.config import to_dict

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("config.yaml", yaml.safe_dump({"model": to_dict(model), "grpo": to_dict(grpo)},
                                                      sort_keys=False)),
                       ("run.json", json.dumps(info, indent=2) + "\n")):
        write_atomically(run_dir / name, text)


def read_run_card(run_dir: str | Path) -> dict[str, Any]:
    """A run folder's settings, as trackers record them: ``config.yaml``'s sections and ``run.json`` as ``run``
    (what is missing is left out)."""
    import json

    from simpop.user_input import load_yaml_file

    run_dir = Path(run_dir)
    card = dict(load_yaml_file(run_dir / "config.yaml") or {}) if (run_dir / "config.yaml").exists() else {}
    if (run_dir / "run.json").exists():
        card["run"] = json.loads((run_dir / "run.json").read_text())
    return card


def run(trainer: Trainer, updates: int, run_dir: str | Path | None = None, *, config: LoopConfig | None = None,
        resume: bool = False, evaluate: Callable[[int], dict[str, Any]] | None = None,
        report: Reporter | None = None, progress: bool = False, desc: str = "train", probe: Probe | None = None,
        grow: Grow | None = None, monitor: Any = None, name: str | None = None,
        group: str | None = None) -> list[dict[str, float]]:
    """Run ``trainer`` until it has completed ``updates`` updates.

    Args:
        trainer: Any :class:`Trainer`.
        updates: The run's total number of updates (a resumed run does only the remaining ones).
        run_dir: The run folder; None keeps nothing on disk (no metrics file, no checkpoints).
        config: Checkpoint, evaluation and logging settings.
        resume: Continue from the newest intact checkpoint in ``run_dir`` (a fresh start when there is none;
            unreadable newer ones are skipped with a warning, see :func:`simpop.checkpoint.load_latest`).
        evaluate: ``evaluate(step) -> record`` (e.g. held-out panel success); None: no evaluation.
        report: Also called with every record written.
        progress: Show a tqdm progress bar.
        desc: The progress bar's label.
        probe: The monitor's probe (needed with ``config.monitor``).
        grow: What ``on_collapse="add-simulators"`` calls.
        monitor: A :class:`~simpop.train.monitor.CollapseMonitor` to use (default: a new one with the default
            rule when ``config.monitor``); its state is checkpointed with the trainer's.
        name: The run's name in the trackers (W&B; default the run folder's name).
        group: The trackers' group of the run (W&B; an experiment's runs share one).

    Returns:
        The training metrics of the updates run by this call.
    """
    if updates < 0:
        raise ValueError(f"updates must be >= 0, got {updates}")
    if resume and run_dir is None:
        raise ValueError("resume=True needs the run_dir to resume from")
    config = config or LoopConfig()
    if config.monitor and monitor is None:
        from simpop.train.monitor import CollapseMonitor

        monitor = CollapseMonitor()
    if monitor is not None and probe is None:
        raise ValueError("the collapse monitor needs a probe panel (probe=..., simpop train --probe-panel)")
    if monitor is not None and config.on_collapse == "add-simulators" and grow is None:
        raise ValueError("on_collapse='add-simulators' needs grow=... (a failure-driven simulator generator)")
    from simpop.train.monitor import NO_GRADIENT_KIND, NoGradientWatch

    no_gradient = NoGradientWatch()
    run_dir = Path(run_dir) if run_dir is not None else None
    start, resumed = 0, False
    if resume and run_dir is not None and (found := checkpoint.load_latest(run_dir)) is not None:
        _, start, state = found
        monitor_state = state.pop(_MONITOR_KEY, None)
        if (watch_state := state.pop(_NO_GRADIENT_KEY, None)) is not None:
            no_gradient.load_state_dict(watch_state)
        trainer.load_state_dict(state)
        if monitor is not None and monitor_state is not None:
            monitor.load_state_dict(monitor_state)
        resumed = True
    logger = None
    if run_dir is not None:
        from simpop.evaluation.metrics import MetricsLogger

        logger = MetricsLogger(run_dir, resume_step=start if resumed else None, report_to=config.report_to,
                               config=read_run_card(run_dir), name=name, group=group)

    def log(step: int, record: dict[str, Any]) -> None:
        if logger is not None:
            logger.log(step, record)
        if report is not None:
            report(step, record)

    def save(step: int) -> None:
        if run_dir is not None:
            state = trainer.state_dict()
            if no_gradient.streak:  # saved only inside a run of no-gradient updates (fresh otherwise)
                state = {**state, _NO_GRADIENT_KEY: no_gradient.state_dict()}
            if monitor is not None:
                state = {**state, _MONITOR_KEY: monitor.state_dict()}
            checkpoint.save(run_dir, step, state, keep=config.keep_checkpoints)

    def watch(step: int) -> bool:
        """Probe when due and judge; True when the run must stop."""
        if monitor is None or step % config.probe_every != 0:
            return False
        assert probe is not None  # checked at the start
        record = monitor.observe_probe(step, probe(step))
        log(step, {"kind": "probe", **record})
        if not record["warning_fired_now"]:
            return False
        log(step, {"kind": "collapse_warning", "action": config.on_collapse,
                   **{k: v for k, v in record.items() if k.startswith("indicator/")}})
        if config.on_collapse == "add-simulators":
            assert grow is not None  # checked at the start
            log(step, {"kind": "pool_growth", **grow(step, record)})
        return config.on_collapse == "stop"

    from simpop.progress import progress_bar

    bar = progress_bar(updates, desc, unit="update", initial=min(start, updates), disable=not progress)
    history: list[dict[str, float]] = []
    try:
        if evaluate is not None and not resumed:
            log(0, {"kind": "eval", **evaluate(0)})
            save(0)
        for step in range(start + 1, updates + 1):
            metrics = trainer.step()
            if monitor is not None:
                metrics.update(monitor.observe_update(step, metrics))
            history.append(metrics)
            log(step, {"kind": "train", **metrics})
            if (warning := no_gradient.observe(step, metrics)) is not None:
                log(step, {"kind": NO_GRADIENT_KIND, **warning})
            stop = watch(step)
            evaluated = evaluate is not None and (step % config.eval_every == 0 or step == updates or stop)
            if evaluate is not None and evaluated:
                log(step, {"kind": "eval", **evaluate(step)})
            if evaluated or step % config.save_every == 0 or step == updates or stop:
                save(step)
            bar.update(1)
            if stop:
                break
    finally:
        bar.close()
        if logger is not None:
            logger.close()
    return history
