"""``simpop experiment defaults``: the grid and rule that pick ``simpop train``'s defaults (docs/defaults-study.md).

Every run is the plain command ``simpop train TRAINER --env ENV --simulator native --updates N --seed SEED`` plus
its cell's flags, with evaluation flags that do not change training: the held-out ``panel`` at update 0 (the same
seed's untrained policy) and at update N, on the same scenarios. Each (trainer, cell, seed) has its own folder,
``OUT/TRAINER/CELL/seed-SEED/``, finished once it holds ``result.json``; a rerun skips finished runs and restarts
unfinished ones. The GRPO grid runs first (seed by seed over the cells), then the GRPO variants at the GRPO winner
(``OUT/grpo-variants/ALGORITHM/seed-SEED/``), then the PPO grid. ``summary.json`` and ``table.md`` are rewritten
after every run.

The rule (:func:`pick`): a cell is eligible when no run *collapsed* (``zero_var_frac`` 1.0 at each of the last
``window`` updates; GRPO only) and the 95% paired interval of its gain (held-out minus untrained success, over
seeds: :func:`simpop.experiments.study.interval`) lies above 0. The highest mean held-out success among eligible
cells wins, except that the cheapest cell within :data:`~simpop.experiments.study.TIE` of it wins (fewest dialogues
or transitions per update, then no KL penalty, then the higher mean). Nothing is picked before every cell has every
seed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simpop.experiments.runs import read_jsonl
from simpop.validation import at_least_one, check_fields


@dataclass(frozen=True)
class Cell:
    """One grid setting.

    Attributes:
        name: Folder name, e.g. ``g8x8-lr0.01-kl0``.
        flags: Its ``simpop train`` flags.
        cost: Dialogues (GRPO) or transitions (PPO) per update.
        kl_coef: Its KL weight (a tie-break: 0 skips the reference pass).
    """

    name: str
    flags: tuple[str, ...]
    cost: int
    kl_coef: float = 0.0


def grpo_cell(group: int, scenarios: int, lr: float, kl: float) -> Cell:
    """A GRPO cell: ``group`` dialogues on each of ``scenarios`` scenarios per update, learning rate, KL weight."""
    return Cell(f"g{group}x{scenarios}-lr{lr:g}-kl{kl:g}",
                ("--group-size", str(group), "--scenarios-per-update", str(scenarios), "--lr", f"{lr:g}",
                 "--kl-coef", f"{kl:g}"), group * scenarios, kl)


def ppo_cell(n_envs: int, n_steps: int, lr: float, ent: float) -> Cell:
    """A PPO cell: ``n_envs`` x ``n_steps`` transitions per update, learning rate, entropy weight."""
    return Cell(f"e{n_envs}x{n_steps}-lr{lr:g}-ent{ent:g}",
                ("--n-envs", str(n_envs), "--n-steps", str(n_steps), "--lr", f"{lr:g}", "--ent-coef", f"{ent:g}"),
                n_envs * n_steps)


#: The pre-registered grids (docs/defaults-study.md).
GRIDS: dict[str, tuple[Cell, ...]] = {
    "grpo": tuple(grpo_cell(g, s, lr, kl) for g, s in ((4, 4), (8, 4), (8, 8)) for lr in (3e-3, 1e-2, 3e-2)
                  for kl in (0.0, 0.1)),
    "ppo": tuple(ppo_cell(8, n, lr, 0.01) for n in (32, 64) for lr in (1e-3, 3e-3)),
}
#: The GRPO variants checked at the GRPO winner.
VARIANTS = ("dr_grpo", "dapo", "reinforce_pp")


@dataclass(frozen=True)
class DefaultsConfig:
    """Settings of ``simpop experiment defaults``.

    Attributes:
        trainers: Grids to run, in order: ``grpo`` (then its variants at the winner) and ``ppo``.
        seeds: Training seeds of every cell (a cell's interval needs 2).
        updates: Updates per run (the acceptance command's).
        episodes: Dialogues per held-out panel member at each of the two evaluations.
        window: Last updates that must all have ``zero_var_frac`` 1.0 for a GRPO run to count as collapsed.
        env: The env id.
        panel: The held-out panel (a named panel or panel YAML).
        variants: Check the GRPO variants at the GRPO winner.
    """

    trainers: tuple[str, ...] = ("grpo", "ppo")
    seeds: tuple[int, ...] = (30000, 30001, 30002, 30003, 30004)
    updates: int = 200
    episodes: int = 128
    window: int = 20
    env: str = "simpop/PersuasionAct-v0"
    panel: str = "p4g-act-v1"
    variants: bool = True

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.trainers or set(self.trainers) - set(GRIDS):
            raise ValueError(f"DefaultsConfig: trainers must be from {', '.join(GRIDS)}, got {self.trainers}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"DefaultsConfig: seeds must be distinct, at least one, got {self.seeds}")
        at_least_one(self, ("updates", "episodes", "window"))


def run_one(config: DefaultsConfig, trainer: str, flags: Sequence[str], seed: int, run_dir: Path) -> dict[str, Any]:
    """One run of ``simpop train`` (or its ``result.json`` when already finished)."""
    from simpop.files import write_atomically
    from simpop.train import cli

    result_path = run_dir / "result.json"
    if result_path.is_file():
        return json.loads(result_path.read_text())
    shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished run starts again
    parser = argparse.ArgumentParser(prog="simpop train")
    cli.configure(parser)
    n = str(config.updates)
    args = parser.parse_args([trainer, "--env", config.env, "--simulator", "native", "--updates", n, "--seed",
                              str(seed), "--out", str(run_dir), "--panel", config.panel, "--eval-every", n,
                              "--eval-episodes", str(config.episodes), "--save-every", n, "--report-to", "none",
                              "--threads", "1", "--no-progress", "--no-export", *flags])
    start = time.perf_counter()
    if cli.run(args) != 0:
        raise RuntimeError(f"simpop train {trainer} {' '.join(flags)} --seed {seed} failed (see above)")
    wall = time.perf_counter() - start
    result = {"seed": seed, **outcome(read_jsonl(run_dir / "metrics.jsonl"), config.updates, config.window),
              "wall_s": wall}
    write_atomically(result_path, json.dumps(result, indent=1) + "\n")
    return result


def outcome(records: Sequence[dict[str, Any]], updates: int, window: int) -> dict[str, Any]:
    """A run's held-out success before training and after ``updates``, and whether it ended collapsed
    (``zero_var_frac`` 1.0 at each of the last ``window`` updates), from its ``metrics.jsonl`` records."""
    evals = {r["step"]: r["heldout_success"] for r in records if r["kind"] == "eval"}
    tail = [r["zero_var_frac"] for r in records if r["kind"] == "train" and "zero_var_frac" in r][-window:]
    return {"untrained": evals[0], "heldout": evals[updates],
            "collapsed": len(tail) == window and all(z == 1.0 for z in tail),
            "zero_var_tail": sum(tail) / len(tail) if tail else None}


def summarise_cell(cell: Cell, results: Sequence[dict[str, Any]], seeds: int) -> dict[str, Any]:
    """A cell's row: mean held-out success (with its interval), gain over untrained, collapsed runs, time."""
    from simpop.experiments.study import interval

    row: dict[str, Any] = {"flags": " ".join(cell.flags), "cost": cell.cost, "kl_coef": cell.kl_coef,
                           "seeds": len(results), "complete": len(results) == seeds,
                           "collapsed": sum(r["collapsed"] for r in results),
                           "wall_s": sum(r["wall_s"] for r in results) / max(1, len(results))}
    if len(results) >= 2:
        row["heldout"] = interval([r["heldout"] for r in results])
        row["untrained"] = interval([r["untrained"] for r in results])
        row["gain"] = interval([r["heldout"] - r["untrained"] for r in results])
    row["eligible"] = bool(row["complete"] and not row["collapsed"] and "gain" in row and row["gain"]["ci_low"] > 0)
    return row


def pick(rows: dict[str, dict[str, Any]]) -> tuple[str | None, str]:
    """The pre-registered rule over one trainer's rows (module docstring): the winning cell (None: none) and why."""
    from simpop.experiments.study import TIE

    if not rows or not all(r["complete"] for r in rows.values()):
        return None, "the grid is incomplete: no cell is picked and the defaults stay"
    eligible = [name for name, row in rows.items() if row["eligible"]]
    if not eligible:
        return None, "no cell is eligible (every cell collapsed or gained nothing shown): the defaults stay"
    best = max(rows[n]["heldout"]["mean"] for n in eligible)
    tied = [n for n in eligible if best - rows[n]["heldout"]["mean"] <= TIE]
    chosen = min(tied, key=lambda n: (rows[n]["cost"], rows[n]["kl_coef"] > 0, -rows[n]["heldout"]["mean"]))
    return chosen, (f"{chosen}: the cheapest eligible cell within {TIE} of the best mean held-out success "
                    f"{best:.3f} (tied: {', '.join(tied)})")


def table(summary: dict[str, Any]) -> str:
    """The markdown tables of ``summary.json``: every cell, the rule's pick, the variants' check."""
    from simpop.experiments.collapse_report import cell

    def cells(row: dict[str, Any]) -> str:
        return (f"{row['seeds']} | {cell(row.get('heldout'))} | {cell(row.get('gain'), signed=True)} | "
                f"{row['collapsed']} | {row['wall_s']:.1f}")

    lines: list[str] = []
    for trainer, part in summary["grids"].items():
        lines += [f"### {trainer}", "", "| cell | seeds | held-out success (95% CI) | gain over untrained (95% CI) | "
                  "collapsed runs | s / run |", "|---|---|---|---|---|---|"]
        for name, row in part["rows"].items():
            lines.append(f"| `{name}`{' **(picked)**' if name == part['picked'] else ''} | {cells(row)} |")
        lines += ["", f"Rule: {part['reason']}.", ""]
    if summary.get("variants"):
        lines += ["### GRPO variants at the GRPO pick", "", "| algorithm | seeds | held-out success (95% CI) | "
                  "gain over untrained (95% CI) | collapsed runs | s / run | acceptance |", "|---|---|---|---|---|---|---|"]
        for name, row in summary["variants"].items():
            lines.append(f"| `{name}` | {cells(row)} | "
                         f"{'passes' if row['eligible'] else 'fails' if row['complete'] else 'incomplete'} |")
        lines.append("")
    return "\n".join(lines)


def write_summary(out: Path, config: DefaultsConfig, grids: dict[str, tuple[Cell, ...]]) -> dict[str, Any]:
    """``summary.json`` and ``table.md`` from the finished runs in ``out``."""
    from simpop.files import write_atomically, write_json

    def results(folder: Path) -> list[dict[str, Any]]:
        return [json.loads((folder / f"seed-{s}" / "result.json").read_text()) for s in config.seeds
                if (folder / f"seed-{s}" / "result.json").is_file()]

    summary: dict[str, Any] = {"config": {k: list(v) if isinstance(v, tuple) else v
                                          for k, v in vars(config).items()}, "grids": {}, "variants": {}}
    for trainer in config.trainers:
        rows = {cell.name: summarise_cell(cell, results(out / trainer / cell.name), len(config.seeds))
                for cell in grids[trainer]}
        picked, reason = pick(rows)
        summary["grids"][trainer] = {"rows": rows, "picked": picked, "reason": reason}
    winner = variant_base(summary, grids)
    if config.variants and winner is not None:
        summary["variants"] = {algorithm: summarise_cell(winner, results(out / "grpo-variants" / algorithm),
                                                         len(config.seeds)) for algorithm in VARIANTS}
    write_json(out / "summary.json", summary, indent=1)
    write_atomically(out / "table.md", table(summary))
    return summary


def variant_base(summary: dict[str, Any], grids: dict[str, tuple[Cell, ...]]) -> Cell | None:
    """The GRPO cell the variants run at: the GRPO pick (None: none yet)."""
    picked = summary["grids"].get("grpo", {}).get("picked")
    return next((c for c in grids["grpo"] if c.name == picked), None)


def run_defaults(config: DefaultsConfig, out: str | Path, grids: dict[str, tuple[Cell, ...]] | None = None,
                 log: Any = print) -> Path:
    """Run every missing run of the grids (module docstring); the path of ``table.md``."""
    out, grids = Path(out), grids or GRIDS

    def runs(trainer: str, folder: Path, cells: Iterable[tuple[str, tuple[str, ...]]]) -> None:
        cells = list(cells)
        for seed in config.seeds:  # seed by seed: a stopped grid leaves every cell with as many seeds
            for name, flags in cells:
                result = run_one(config, trainer, flags, seed, folder / name / f"seed-{seed}")
                log(f"{trainer} {name} seed {seed}: held-out {result['heldout']:.3f} (untrained "
                    f"{result['untrained']:.3f}), collapsed {result['collapsed']}, {result['wall_s']:.1f} s")
                write_summary(out, config, grids)

    for trainer in config.trainers:
        runs(trainer, out / trainer, [(c.name, c.flags) for c in grids[trainer]])
        if trainer == "grpo" and config.variants:
            winner = variant_base(write_summary(out, config, grids), grids)
            if winner is not None:
                runs("grpo", out / "grpo-variants", [(a, (*winner.flags, "--algorithm", a)) for a in VARIANTS])
    write_summary(out, config, grids)
    return out / "table.md"
