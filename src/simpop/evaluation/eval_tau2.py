"""What an evaluation adds for τ² envs: each episode as τ² sees it (kept in its record), pass^k per member and
overall, and the results files τ²'s own tooling reads (:mod:`simpop.envs.tau2.results`). A missing piece is reported
in the summary and logged, never fatal."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from simpop.user_input import error_line
from simpop.evaluation.panel import EpisodeRecord

log = logging.getLogger(__name__)


def is_tau2(env: Any) -> bool:
    """Whether ``env`` is a τ² env (its episodes carry τ² messages and pass^k applies)."""
    return type(env).__module__.startswith("simpop.envs.tau2")


def tau2_env(env_id: str) -> bool:
    """Whether the registered ``env_id`` is a τ² env."""
    from simpop.envs.registration import spec

    try:
        return spec(env_id).entry_point.startswith("simpop.envs.tau2")
    except KeyError:
        return False


def tau2_payload(env: Any, trial: int) -> dict[str, Any]:
    """The finished τ² episode as τ² sees it: its ``SimulationRun`` (``env.simulation_run``: messages, reward
    info, termination reason, times) or, on an env without it, its messages and reward info."""
    try:
        if callable(getattr(env, "simulation_run", None)):
            return {"domain": env.domain, "simulation": env.simulation_run(trial).model_dump(mode="json")}
        info = env.reward_info
        return {"domain": env.domain, "messages": [m.model_dump(mode="json") for m in env.trajectory()],
                "reward_info": info.model_dump(mode="json") if info is not None else None}
    except Exception as error:
        log.warning("could not keep the τ² trajectory (%s: %s)", type(error).__name__, error_line(error))
        return {"error": f"{type(error).__name__}: {error_line(error)}"}


def tau2_extras(out: Path, records: Sequence[EpisodeRecord], members: Mapping[str, str],
                settings: Mapping[str, Any]) -> dict[str, Any]:
    """pass^k for k = 1..num_trials (per member and overall) and one τ² results file per member, by
    :mod:`simpop.envs.tau2.results`. What cannot be computed or written is reported in the summary and logged."""
    from simpop.envs.tau2.results import pass_hat_k, write_tau2_results

    def by_k(outcomes: Iterable[tuple[str, EpisodeRecord]]) -> dict[str, float]:
        """pass^k for k = 1..trials over the tasks named in ``outcomes`` ((task, record) pairs)."""
        by_task: dict[str, list[bool]] = {}
        for task, r in outcomes:
            by_task.setdefault(task, []).append(bool(r.success))
        return {str(k): float(pass_hat_k(by_task, k)) for k in range(1, trials + 1)} if by_task else {}

    extras: dict[str, Any] = {}
    trials = settings["num_trials"]
    if trials:
        try:
            per_member = {m: by_k((r.scenario, r) for r in records if r.member == m) for m in members}
            # Overall: every (member, task) is one "task" of K trials (the mean over members).
            extras["pass_hat_k"] = by_k((f"{r.member}/{r.scenario}", r) for r in records)
            extras["pass_hat_k_per_member"] = per_member
        except ValueError as error:  # e.g. an incomplete evaluation: some task has fewer than k trials
            extras["error"] = f"pass^k not computed: {error_line(error)}"
            log.error(extras["error"])
    else:
        extras["pass_hat_k"] = None
        extras["note"] = "pass^k needs --num-trials (every task, K trials)"
    folder = out / "tau2_results"
    folder.mkdir(exist_ok=True)
    files = {}
    for m, spec in members.items():
        episodes = [r for r in records if r.member == m]
        path = folder / f"{_file_name(m)}.json"
        try:
            limits = {k: settings["env_kwargs"].get(k) for k in ("max_steps", "max_errors")}
            write_tau2_results(path, episodes=episodes, agent=settings["policy"], user=spec, seed=settings["seed"],
                               num_trials=trials, env_id=settings["env"], **limits)
            files[m] = str(path.relative_to(out))
        except Exception as error:  # the summary and report are still written
            extras.setdefault("results_errors", {})[m] = f"{type(error).__name__}: {error_line(error)}"
            log.error("τ² results file for member %s not written: %s", m, extras["results_errors"][m])
    extras["results_files"] = files
    return extras


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "member"
