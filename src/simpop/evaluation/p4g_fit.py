"""``simpop fit-p4g``: remake simpop's human-grounded P4G data from a corpus folder, in one command.

It writes the two files simpop ships (no corpus file ships; both hold fitted numbers and statistics only):

- ``p4g-fit-v1.json``: the corpus-fitted persuadees (:func:`simpop.envs.persuasion.fitted.fit_release`);
- ``p4g-realism-v1.json``: the human statistics the realism index compares simulators with
  (:func:`simpop.evaluation.realism.human_reference`).

``--check`` compares what it wrote with the shipped files and exits 1 when a number differs (beyond 1e-9 relative):
the shipped numbers reproduce from the public corpus (its repository and commit are in both files)::

    simpop fit-p4g --corpus DIR --check
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path
from typing import Any

from simpop.user_input import SEED, UsageError, integer

#: What the shipped files record as the command that reproduces them.
COMMAND = "simpop fit-p4g --corpus DIR --check"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``simpop fit-p4g``'s arguments to ``parser``."""
    from simpop.envs.persuasion.fitted import CORPUS_COMMIT, FIT_SEED, RESAMPLES

    parser.add_argument("--corpus", required=True, metavar="DIR",
                        help="P4G corpus folder (full_dialog.csv, full_info.csv, 300_dialog.xlsx, 300_info.xlsx)")
    parser.add_argument("--out", default="runs/p4g-fit", help="output folder (default runs/p4g-fit)")
    parser.add_argument("--check", action="store_true", help="compare the files with the shipped ones (exit 1 if not)")
    parser.add_argument("--resamples", type=integer(1, 1_000_000), default=RESAMPLES, help=f"bootstrap fits (default {RESAMPLES})")
    parser.add_argument("--seed", type=SEED, default=FIT_SEED, help=f"split and resample seed (default {FIT_SEED})")
    parser.add_argument("--commit", default=CORPUS_COMMIT, help="the corpus repository commit, recorded")


def outputs(corpus: str, resamples: int, seed: int, commit: str) -> dict[str, dict[str, Any]]:
    """File name -> content of everything ``simpop fit-p4g`` writes."""
    from simpop.envs.persuasion.fitted import fit_release
    from simpop.envs.persuasion.release import FIT_VERSION
    from simpop.evaluation.realism import REALISM_VERSION, human_reference

    return {f"{FIT_VERSION}.json": fit_release(corpus, seed=seed, resamples=resamples, commit=commit, command=COMMAND),
            f"{REALISM_VERSION}.json": human_reference(corpus, seed=seed, commit=commit, command=COMMAND)}


def shipped_paths() -> dict[str, Any]:
    """File name -> the shipped file."""
    from simpop.envs.persuasion.release import FIT_VERSION, release_path
    from simpop.evaluation.realism import REALISM_VERSION, reference_path

    return {f"{FIT_VERSION}.json": release_path(), f"{REALISM_VERSION}.json": reference_path()}


def rounded(value: Any, digits: int = 9) -> Any:
    """``value`` with every float rounded to ``digits`` significant digits (the files' precision)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if math.isfinite(value) else value
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    return value


def differences(a: Any, b: Any, path: str = "", rel: float = 1e-9) -> list[str]:
    """Where two JSON values differ (numbers beyond ``rel`` relative tolerance)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only in one" for k in sorted(set(a) ^ set(b))]
        return out + [d for k in sorted(set(a) & set(b)) for d in differences(a[k], b[k], f"{path}/{k}", rel)]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} entries"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]", rel)]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        same = (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)
        return [] if same else [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def run(args: argparse.Namespace) -> int:
    """Run ``simpop fit-p4g`` with parsed arguments; returns the exit code."""
    from simpop.envs.persuasion.corpus import CorpusError

    if not Path(args.corpus).is_dir():
        raise UsageError(f"--corpus {args.corpus}: no such folder")
    logging.getLogger("simpop.envs.persuasion.corpus").setLevel(logging.ERROR)  # skipped rows: counted in the file
    try:
        files = outputs(args.corpus, args.resamples, args.seed, args.commit)
    except CorpusError as error:
        raise UsageError(f"--corpus {args.corpus}: {error}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (out / name).write_text(json.dumps(rounded(content), indent=1, sort_keys=True) + "\n")
        print(f"wrote {out / name}")
    if not args.check:
        return 0
    status = 0
    for name, shipped in shipped_paths().items():
        found = differences(json.loads(shipped.read_text(encoding="utf-8")), json.loads((out / name).read_text()))
        print(f"{name}: " + ("reproduces the shipped file" if not found else f"{len(found)} differences from the "
                             "shipped file, e.g.\n  " + "\n  ".join(found[:10])))
        status |= bool(found)
    return status
