"""What every experiment's (condition, seed) runs share: their folders, one run through the loop, running them all
(resume, worker processes, progress bar), and reading their records and writing the outputs."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


class Seeded:
    """An experiment config whose (condition, seed) runs take the seeds ``first_seed .. first_seed + seeds - 1``."""

    seeds: Any
    first_seed: int

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))


def run_folder(out: Path, condition: str, seed: int) -> Path:
    """The folder of one (condition, seed) run of an experiment writing into ``out``."""
    return out / "runs" / condition / f"seed{seed}"


def train_run(config: Any, condition: str, seed: int, out: Path, resume: bool, threads: int | None,
              start: Callable[[Any], tuple[Any, dict[str, Any]]],
              report: Callable[[str, int, int, dict[str, Any]], None] | None = None,
              report_to: str = "none", loop: Any = None) -> Path:
    """Train one (condition, seed) run with :func:`simpop.train.loop.run` in its :func:`run_folder`; the folder.

    ``config``: the experiment's ``env_id``, ``env_kwargs()``, ``updates`` and ``eval_every``. With ``resume`` a
    finished run is left as it is and an unfinished one continues from its newest checkpoint. ``start(env)``, called
    on a new env once torch is seeded and set to ``threads`` threads (None: as they are; restored after), returns the
    trainer and the loop's other arguments (``evaluate``, ``probe``, ...; default ``report``: ``report`` with the
    run's condition and seed). ``loop``: the :class:`~simpop.train.loop.LoopConfig` (default: a checkpoint, the last
    two kept, and an evaluation every ``eval_every`` updates; trackers ``report_to``).
    """
    import torch

    from simpop import checkpoint
    from simpop.envs.registration import make
    from simpop.train.loop import LoopConfig, run

    run_dir = run_folder(out, condition, seed)
    saved = checkpoint.latest(run_dir) if resume else None
    if saved is not None and int(saved.stem.split("_")[1]) >= config.updates:
        return run_dir
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        torch.manual_seed(seed)
        trainer, options = start(make(config.env_id, **config.env_kwargs()))
        options.setdefault("report", (lambda step, record: report(condition, seed, step, record)) if report else None)
        loop = loop or LoopConfig(save_every=config.eval_every, keep_checkpoints=2, eval_every=config.eval_every,
                                  report_to=report_to)
        run(trainer, config.updates, run_dir, config=loop, resume=resume, name=f"{condition}/seed{seed}",
            group=out.name, **options)
    finally:
        torch.set_num_threads(before)
    return run_dir


class SettingsChanged(ValueError):
    """``--resume`` of a run folder with other settings than it was made with (the user's to fix)."""


def run_experiment(run_one: Callable[..., Any], config: Any, out: str | Path, resume: bool, default: Any,
                   progress: bool, report_to: str, order: Callable[[tuple[str, int]], Any] | None = None,
                   runs: Any = None) -> tuple[Path, float]:
    """Every (condition, seed) run of an experiment into ``out`` (its settings written to ``config.json``):
    ``run_one(config, condition, seed, out, resume, report, report_to)`` for each, seed by seed (sorted by ``order``),
    here or in ``config.workers`` spawned processes, under a progress bar (``progress``; a worker's error is raised
    here); ``runs``: a context manager giving the config the runs use (default ``config``). ``out`` and the seconds the
    runs took.

    Raises:
        FileExistsError: ``out`` holds runs and ``resume`` is off.
        SettingsChanged: ``resume`` with other settings than ``config.json``'s (a setting it lacks counts at
            ``default``'s value, :func:`~simpop.train.config.changed_settings`).
    """
    from simpop.train.config import changed_settings, to_dict

    out = Path(out)
    if not resume and (out / "runs").exists():
        raise FileExistsError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.json"
    changed = changed_settings(json.loads(path.read_text()), config, default) if resume and path.exists() else []
    if changed:
        raise SettingsChanged(f"--resume with different settings ({', '.join(changed)}) than the run in {out}; "
                         f"resume with the same flags or use another --out")
    path.write_text(json.dumps(to_dict(config), indent=2))
    tasks = sorted([(c, s) for s in config.seed_list for c in config.conditions], key=order or (lambda task: 0))
    started = time.perf_counter()
    bar = Progress(len(tasks) * config.updates, progress, run_one.__module__.rpartition(".")[2])
    with runs or contextlib.nullcontext(config) as runs_config:
        if config.workers == 1 or len(tasks) == 1:
            for condition, seed in tasks:
                run_one(runs_config, condition, seed, out, resume, bar.report, report_to)
        else:
            import concurrent.futures
            import multiprocessing

            context = multiprocessing.get_context("spawn")
            with context.Manager() as manager:
                queue = manager.Queue()
                with concurrent.futures.ProcessPoolExecutor(config.workers, mp_context=context) as pool:
                    futures = [pool.submit(_worker, run_one, runs_config, c, s, out, resume, queue, report_to)
                               for c, s in tasks]
                    while not all(f.done() for f in futures):
                        bar.drain(queue)
                        time.sleep(0.2)
                    bar.drain(queue)
                    for f in futures:
                        f.result()  # re-raise a worker's error here
    bar.close()
    return out, time.perf_counter() - started


def _worker(run_one: Callable[..., Any], config: Any, condition: str, seed: int, out: Path, resume: bool, queue: Any,
            report_to: str) -> None:
    run_one(config, condition, seed, out, resume, lambda *record: queue.put(record), report_to)


class Progress:
    """A tqdm bar over all updates of all runs, with the latest held-out success per condition."""

    def __init__(self, total: int, enabled: bool, desc: str):
        from simpop.progress import progress_bar

        self.bar = progress_bar(total, desc, unit="update", disable=not enabled)
        self.heldout: dict[str, float] = {}

    def report(self, condition: str, seed: int, step: int, record: dict[str, Any]) -> None:
        """Count a finished update, or show a new held-out success, of ``(condition, seed)``."""
        if record.get("kind") == "train":
            self.bar.update(1)
        elif "heldout_success" in record and not math.isnan(record["heldout_success"]):
            self.heldout[condition] = record["heldout_success"]
            self.bar.set_postfix({f"{c}": f"{v:.2f}" for c, v in self.heldout.items()}, refresh=False)

    def drain(self, queue: Any) -> None:
        """Report every record waiting in ``queue`` (from worker processes)."""
        while not queue.empty():
            self.report(*queue.get())

    def close(self) -> None:
        """Close the progress bar."""
        self.bar.close()


def merge_records(out: Path, config: Any) -> list[dict[str, Any]]:
    """Every run's metrics, tagged with condition and seed, in (condition, seed, line) order (``config``: any
    experiment config with ``conditions`` and ``seed_list``), also written to ``out/metrics.jsonl``."""
    records = [{"condition": condition, "seed": seed, **record} for condition in config.conditions
               for seed in config.seed_list
               for record in read_jsonl(run_folder(out, condition, seed) / "metrics.jsonl")]
    with (out / "metrics.jsonl").open("w") as f:
        for record in records:
            f.write(json.dumps(record, sort_keys=True) + "\n")
    return records


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (none when it does not exist)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def finished_evaluations(records: Sequence[dict[str, Any]], condition: str, seed: int, updates: int
                         ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A finished run's evaluation records (by step, from 0 to ``updates``) and update records, from an experiment's
    records (:func:`merge_records`); RuntimeError when the run is incomplete."""
    mine = [r for r in records if r["condition"] == condition and r["seed"] == seed]
    evals = sorted((r for r in mine if r["kind"] == "eval"), key=lambda r: r["step"])
    if not evals or evals[-1]["step"] != updates or evals[0]["step"] != 0:
        raise RuntimeError(f"run {condition}/seed{seed} is incomplete; rerun with --resume to finish it")
    return evals, [r for r in mine if r["kind"] == "train"]


def write_report(out: Path, config: Any, summary: dict[str, Any], report: str, plots: Sequence[Path],
                 report_to: str) -> Path:
    """Write ``summary.json`` and ``report.md`` into ``out`` and log the ``plots`` to the trackers ``report_to`` names
    (:func:`simpop.evaluation.trackers.log_report`); the report's path."""
    from simpop.evaluation.trackers import log_report
    from simpop.train.config import to_dict

    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=json_default))
    (out / "report.md").write_text(report)
    log_report(report_to, out, plots, config.updates, to_dict(config))
    return out / "report.md"


def json_default(value: Any) -> Any:
    """Numpy scalars as Python numbers, for ``json.dumps``."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")
