"""Experiment trackers: where a run's metrics, settings and plots go besides ``metrics.jsonl`` (``--report-to``).

``--report-to`` takes TRL's names with TRL's meaning (``transformers.TrainingArguments.report_to``): a
comma-separated list of ``tensorboard`` (the default) and ``wandb``; ``none`` alone turns trackers off, ``all``
alone means every one installed. :func:`open_trackers` opens the chosen ones on a folder as one :class:`Tracker`,
the interface every writer uses: :class:`~simpop.evaluation.metrics.MetricsLogger` sends each record's numbers
(:func:`tracked_values`: ``kind/key`` at the record's step), the experiments their report's plots
(:func:`log_report`).

- ``tensorboard``: scalar and image events under ``FOLDER/tb`` (none, with a logged warning, when TensorBoard is not
  installed).
- ``wandb``: a Weights & Biases run (``pip install 'simpop[wandb]'``; imported only when chosen) whose config is the
  settings passed (a run folder's ``config.yaml`` and ``run.json``), its files under ``$WANDB_DIR`` (default the
  folder), project ``$WANDB_PROJECT`` (default ``simpop``). The run id is kept in ``FOLDER/wandb-run-id``: a resumed
  run continues the same W&B run. ``WANDB_MODE=offline`` logs without a network; ``wandb sync`` uploads later.

A resumed log repeats no step: :class:`~simpop.evaluation.metrics.MetricsLogger` sends the trackers only the steps
after the last one the interrupted run logged (a resumed run redoes the steps after its checkpoint exactly, so the
trackers already hold them).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

#: The trackers ``--report-to`` names (TRL's names; each is also the package it needs).
TRACKERS = ("tensorboard", "wandb")
#: The file in a run folder that keeps its W&B run id.
WANDB_ID_FILE = "wandb-run-id"

log = logging.getLogger(__name__)


class TrackerError(ValueError):
    """A chosen tracker is not installed or cannot start a run (one line, saying what to do)."""


def trackers_named(report_to: str) -> tuple[str, ...]:
    """The trackers a ``--report-to`` value names, in its order.

    Raises:
        ValueError: An unknown name, or ``none`` / ``all`` with other names.
    """
    names = [name.strip() for name in report_to.split(",")]
    if len(names) > 1 and {"none", "all"} & set(names):
        raise ValueError(f"report_to {report_to!r}: 'none' and 'all' stand alone")
    if names == ["none"]:
        return ()
    if names == ["all"]:
        return tuple(name for name in TRACKERS if _installed(name))
    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"report_to: unknown tracker {name!r}; a comma-separated list of "
                             f"{', '.join(TRACKERS)}, or none (no tracker) or all (every one installed)")
    return tuple(dict.fromkeys(names))


def report_to_flag(text: str) -> str:
    """The argparse ``type`` of ``--report-to``: the value, once :func:`trackers_named` accepts it."""
    try:
        trackers_named(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def require(report_to: str) -> None:
    """Raise a :class:`TrackerError` naming the extra to install if a chosen tracker other than TensorBoard (off
    when missing) is not installed."""
    for name in trackers_named(report_to):
        if name != "tensorboard" and not _installed(name):
            raise TrackerError(f"--report-to {name} needs the {name} package: pip install 'simpop[{name}]'")


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def tracked_values(record: dict[str, Any]) -> dict[str, float]:
    """A ``metrics.jsonl`` record's numbers as trackers get them: ``kind/key`` (``train/success``,
    ``eval/heldout_success``); a record without a kind keeps its keys."""
    prefix = f"{record['kind']}/" if "kind" in record else ""
    return {prefix + key: value for key, value in record.items()
            if key not in ("step", "kind") and isinstance(value, (int, float)) and not isinstance(value, bool)}


class Tracker(Protocol):
    """One tracker's run (or all the chosen ones: :func:`open_trackers`)."""

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Log ``values`` at ``step`` (steps never decrease)."""
        ...

    def images(self, step: int, paths: Sequence[Path]) -> None:
        """Log the PNG files ``paths`` as images ``plots/<stem>`` at ``step``."""
        ...

    def close(self) -> None:
        """Finish the run (everything logged is written)."""
        ...


class Trackers(Tracker):
    """The chosen trackers as one :class:`Tracker`."""

    def __init__(self, members: Sequence[Tracker]) -> None:
        self.members = list(members)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for member in self.members:
            member.scalars(step, values)

    def images(self, step: int, paths: Sequence[Path]) -> None:
        for member in self.members:
            member.images(step, paths)

    def close(self) -> None:
        while self.members:
            self.members.pop().close()


def open_trackers(report_to: str, folder: str | Path, *, config: dict[str, Any] | None = None, resume: bool = False,
                  name: str | None = None, group: str | None = None) -> Trackers:
    """Open the trackers ``report_to`` names on ``folder``.

    Args:
        report_to: A ``--report-to`` value.
        folder: The run folder (created if missing).
        config: The run's settings (W&B's run config).
        resume: Continue the folder's W&B run (its id in :data:`WANDB_ID_FILE`) rather than start a new one.
        name: The run's name in W&B (default the folder's name).
        group: The W&B group (an experiment's runs share one).

    Raises:
        TrackerError: A chosen tracker is not installed or cannot start its run.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    require(report_to)
    members: list[Tracker] = []
    try:
        for tracker in trackers_named(report_to):
            if tracker == "wandb":
                members.append(WandbRun(folder, config or {}, resume, name or folder.name, group))
            elif (writer := TensorBoardRun.open(folder / "tb")) is not None:
                members.append(writer)
    except BaseException:
        Trackers(members).close()
        raise
    return Trackers(members)


def log_report(report_to: str, folder: Path, plots: Sequence[Path], step: int, config: dict[str, Any]) -> None:
    """Log an experiment report's ``plots`` as images at ``step``, in a W&B run named ``report`` grouped with the
    experiment's runs (TensorBoard: ``folder/tb``). A rewritten report is a new W&B run."""
    trackers = open_trackers(report_to, folder, config=config, name="report", group=folder.name)
    try:
        trackers.images(step, plots)
    finally:
        trackers.close()


class TensorBoardRun(Tracker):
    """TensorBoard events under one log folder."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    @classmethod
    def open(cls, log_dir: Path) -> TensorBoardRun | None:
        """A writer on ``log_dir``; None, with a warning, when TensorBoard is not installed."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.warning("TensorBoard is not installed (pip install tensorboard): metrics go to metrics.jsonl only")
            return None
        return cls(SummaryWriter(log_dir=str(log_dir)))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def images(self, step: int, paths: Sequence[Path]) -> None:
        from matplotlib.image import imread

        for path in paths:
            self.writer.add_image(f"plots/{Path(path).stem}", imread(path), step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbRun(Tracker):
    """A Weights & Biases run (see the module docstring for its project, files and id)."""

    def __init__(self, folder: Path, config: dict[str, Any], resume: bool, name: str, group: str | None) -> None:
        import wandb

        from simpop.user_input import error_line

        id_file = folder / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.exists() else uuid.uuid4().hex[:12]
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "simpop"), id=run_id, resume="allow",
                                  name=name, group=group, config=config, dir=os.environ.get("WANDB_DIR") or str(folder))
        except Exception as error:  # not logged in, no network, a bad setting: W&B's own words, on one line
            raise TrackerError(f"--report-to wandb: W&B could not start its run ({error_line(error, 300)}); log in "
                               f"with `wandb login`, or log offline with WANDB_MODE=offline") from None
        id_file.write_text(run_id + "\n")
        self.image = wandb.Image

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def images(self, step: int, paths: Sequence[Path]) -> None:
        self.run.log({f"plots/{Path(path).stem}": self.image(str(path)) for path in paths}, step=step)

    def close(self) -> None:
        self.run.finish()
