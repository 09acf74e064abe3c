"""The one run loop: any :class:`Trainer` for N updates, with metrics, checkpoints, resume and evaluation.

Every trainer (GRPO and its variants, PPO, co-training, population co-training) is a :class:`Trainer`:
``step()`` runs one update and returns its metrics, ``state_dict()`` / ``load_state_dict()`` checkpoint
everything that trains. :func:`run` drives it; ``simpop train`` and ``simpop experiment collapse`` both
call it. A run folder holds::

    metrics.jsonl       one line per update ({"step", "kind": "train", ...}) and per evaluation ("kind": "eval")
    tb/                 TensorBoard scalars of the same (when TensorBoard is installed and enabled)
    checkpoints/        atomic step_<k>.pt files, the newest ``keep_checkpoints`` kept

With ``evaluate``, the policy is evaluated before the first update (step 0, checkpointed so that a resumed
run does not repeat it), every ``eval_every`` updates and after the last. A killed run resumed from its
newest checkpoint continues exactly as an uninterrupted one (the log is cut back to that checkpoint and the
global RNG states are restored with it); a corrupted newest checkpoint is skipped, with a warning naming it, for
the newest intact one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from simpop import checkpoint


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
        tensorboard: Also write TensorBoard scalars under ``tb/`` (when TensorBoard is installed).
    """

    save_every: int = 1
    keep_checkpoints: int = 3
    eval_every: int = 10
    tensorboard: bool = True

    def __post_init__(self) -> None:
        for key in ("save_every", "keep_checkpoints", "eval_every"):
            if getattr(self, key) < 1:
                raise ValueError(f"LoopConfig: {key} must be >= 1, got {getattr(self, key)}")


#: Called with ``(step, record)`` for every record written (progress bars, parent processes).
Reporter = Callable[[int, dict[str, Any]], None]


def run(trainer: Trainer, updates: int, run_dir: str | Path | None = None, *, config: LoopConfig | None = None,
        resume: bool = False, evaluate: Callable[[int], dict[str, Any]] | None = None,
        report: Reporter | None = None, progress: bool = False, desc: str = "train") -> list[dict[str, float]]:
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

    Returns:
        The training metrics of the updates run by this call.
    """
    if updates < 0:
        raise ValueError(f"updates must be >= 0, got {updates}")
    if resume and run_dir is None:
        raise ValueError("resume=True needs the run_dir to resume from")
    config = config or LoopConfig()
    run_dir = Path(run_dir) if run_dir is not None else None
    start, resumed = 0, False
    if resume and (found := checkpoint.load_latest(run_dir)) is not None:
        _, start, state = found
        trainer.load_state_dict(state)
        resumed = True
    logger = None
    if run_dir is not None:
        from simpop.evaluation.metrics import MetricsLogger

        logger = MetricsLogger(run_dir, resume_step=start if resumed else None, tensorboard=config.tensorboard)

    def log(step: int, record: dict[str, Any]) -> None:
        if logger is not None:
            logger.log(step, record)
        if report is not None:
            report(step, record)

    def save(step: int) -> None:
        if run_dir is not None:
            checkpoint.save(run_dir, step, trainer.state_dict(), keep=config.keep_checkpoints)

    from simpop.progress import progress_bar

    bar = progress_bar(updates, desc, unit="update", initial=min(start, updates), disable=not progress)
    history: list[dict[str, float]] = []
    try:
        if evaluate is not None and not resumed:
            log(0, {"kind": "eval", **evaluate(0)})
            save(0)
        for step in range(start + 1, updates + 1):
            metrics = trainer.step()
            history.append(metrics)
            log(step, {"kind": "train", **metrics})
            evaluated = evaluate is not None and (step % config.eval_every == 0 or step == updates)
            if evaluated:
                log(step, {"kind": "eval", **evaluate(step)})
            if evaluated or step % config.save_every == 0 or step == updates:
                save(step)
            bar.update(1)
    finally:
        bar.close()
        if logger is not None:
            logger.close()
    return history
