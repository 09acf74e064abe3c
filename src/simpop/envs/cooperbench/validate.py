"""Check a CooperBench dataset: ``python -m simpop.envs.cooperbench.validate [--dataset DIR]``.

For every feature: the base fails its tests, the base plus its gold patch passes them, and the
task's combined patch passes them. For every feature pair: whether the two gold patches conflict
when merged (informational), and with ``--evaluate-pairs`` the full evaluation of the gold pair
(the reward two gold-patch agents would get under ``--conflict-rule``). Prints a table; the exit
code is 1 if any feature check fails.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from simpop.envs.cooperbench.dataset import Dataset, load_dataset
from simpop.envs.cooperbench.evaluator import CONFLICT_RULES, Evaluator, FeatureResult
from simpop.envs.cooperbench.scenario import FeaturePair, Task
from simpop.user_input import ArgumentParser, integer


@dataclass
class FeatureCheck:
    """The three checks of one feature (``combined`` is None when the task has no combined patch)."""

    task: str
    feature: int
    base: FeatureResult
    gold: FeatureResult
    combined: FeatureResult | None

    def problems(self) -> list[str]:
        """What is wrong with this feature's data (base passes, gold fails, ...); empty if nothing."""
        where = f"{self.task} feature {self.feature}"
        found = []
        if self.base.passed:
            found.append(f"{where}: the base already passes its tests")
        if not self.gold.passed:
            found.append(f"{where}: the gold patch fails its tests ({self.gold.summary()})")
        if self.combined is not None and not self.combined.passed:
            found.append(f"{where}: the combined patch fails its tests ({self.combined.summary()})")
        return found


@dataclass
class PairCheck:
    """One gold pair: the merge status, and the reward when the pair was evaluated."""

    pair: str
    merge: str
    both_passed: bool | None = None


@dataclass
class Report:
    """Every feature's and pair's checks of a dataset."""
    features: list[FeatureCheck]
    pairs: list[PairCheck]

    def problems(self) -> list[str]:
        """Every feature's problems, in order."""
        return [p for check in self.features for p in check.problems()]

    def table(self) -> str:
        """A printable table: base, gold and combined results per feature, and the pairs' merges."""
        def verdict(r: FeatureResult | None) -> str:
            if r is None:
                return "-"
            return f"{'pass' if r.passed else 'FAIL'} {r.tests_passed}/{r.tests_passed + r.tests_failed}"

        rows = ["| task | feature | base | gold | combined |", "|---|---|---|---|---|"]
        rows += [f"| {c.task} | {c.feature} | {verdict(c.base)} | {verdict(c.gold)} | {verdict(c.combined)} |"
                 for c in self.features]
        with_reward = any(p.both_passed is not None for p in self.pairs)
        rows += ["", "| gold pair | merge |" + (" reward |" if with_reward else ""),
                 "|---|---|" + ("---|" if with_reward else "")]
        for p in self.pairs:
            reward = f" {int(bool(p.both_passed))} |" if with_reward else ""
            rows.append(f"| {p.pair} | {p.merge} |{reward}")
        conflicts = sum(p.merge != "clean" for p in self.pairs)
        rows += ["", f"{len(self.features)} features, {len(self.problems())} problems; "
                     f"{conflicts}/{len(self.pairs)} gold pairs do not merge cleanly"]
        return "\n".join(rows)


def validate(dataset: Dataset, evaluator: Evaluator, subset: str | None = None, evaluate_pairs: bool = False,
             jobs: int = 2) -> Report:
    """Run every check (test runs in ``jobs`` threads)."""
    pairs = dataset.pairs(subset)
    tasks = {p.task.key: p.task for p in pairs}
    for task in tasks.values():
        task.require_runnable()

    def check_feature(item: tuple[Task, int]) -> FeatureCheck:
        task, fid = item
        combined = evaluator.test_feature(task, fid, task.combined_patch) if task.combined_patch else None
        return FeatureCheck(task.key, fid, evaluator.test_feature(task, fid, ""),
                            evaluator.test_feature(task, fid, task.features[fid].patch), combined)

    def check_pair(pair: FeaturePair) -> PairCheck:
        a, b = pair.first, pair.second
        if evaluate_pairs:
            result = evaluator.evaluate(pair.task, a.id, b.id, a.patch, b.patch)
            return PairCheck(pair.id, result.merge.status, result.both_passed)
        return PairCheck(pair.id, evaluator.merge(pair.task, a.patch, b.patch).status)

    features = [(task, fid) for task in tasks.values() for fid in task.features]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return Report(list(pool.map(check_feature, features)), list(pool.map(check_pair, pairs)))


def main(argv: list[str] | None = None) -> int:
    """``python -m simpop.envs.cooperbench.validate``: check a dataset; 0 if no problems, else 1."""
    parser = ArgumentParser(prog="python -m simpop.envs.cooperbench.validate",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mini",
                        help="CooperBench dataset/ folder (default: the packaged mini set)")
    parser.add_argument("--repos", default=None, help="folder of repository checkouts at their base commits")
    parser.add_argument("--subset", default=None, help="only the pairs (and their tasks) of this subset")
    parser.add_argument("--evaluate-pairs", action="store_true", help="also run the full evaluation of every gold pair")
    parser.add_argument("--conflict-rule", choices=CONFLICT_RULES, default="lead")
    parser.add_argument("--jobs", type=integer(1, 256), default=2, help="test runs in parallel")
    args = parser.parse_args(argv)
    report = validate(load_dataset(args.dataset, args.repos), Evaluator(conflict_rule=args.conflict_rule),
                      args.subset, args.evaluate_pairs, args.jobs)
    print(report.table())
    for problem in report.problems():
        print("PROBLEM:", problem, file=sys.stderr)
    return 1 if report.problems() else 0


if __name__ == "__main__":
    raise SystemExit(main())
