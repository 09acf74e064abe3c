"""τ² results: pass^k exactly as τ² defines it, and results files that τ²'s own tooling reads.

:func:`pass_hat_k` is τ²'s pass^k (``tau2.metrics.agent_metrics``, from the τ-bench paper): per task
with ``n`` trials of which ``c`` succeeded, ``C(c, k) / C(n, k)`` (the chance that ``k`` trials drawn
without replacement all succeed), averaged over tasks. A trial succeeds when its reward is 1 (τ²'s
``is_successful``, the env's ``info["success"]``). It needs no τ² import.

:func:`write_tau2_results` writes τ²'s ``Results`` file (``tau2.data_model.simulation.Results``, saved
with τ²'s own serializer) from simpop episodes, so that ``tau2 view``, τ²'s
``evaluate_trajectories`` (which re-scores every run with τ²'s evaluator) and
``tau2.metrics.agent_metrics.compute_metrics`` (average reward, pass^k) run on it unchanged. One file
holds one agent against one user simulator (τ²'s ``Info`` names one of each): write one file per panel
member.

**What an episode must contain.** Each episode is one of:

- a τ² ``SimulationRun`` with its ``reward_info``: :meth:`Tau2Env.simulation_run(trial)
  <simpop.envs.tau2.env.Tau2Env.simulation_run>` after the episode ends;
- a record: a mapping (e.g. a parsed JSON line) or an object with attributes (e.g. the eval runner's
  ``EpisodeRecord``) holding

  - ``task_id`` (or ``scenario``): the τ² task id;
  - ``trial``: the trial number (0, 1, ... per task);
  - ``reward`` (optional): the env's reward, checked against the τ² reward info;
  - ``tau2`` (or ``extra["tau2"]``): the τ² episode, either ``{"simulation": <SimulationRun JSON>}``
    (``env.simulation_run().model_dump(mode="json")``: the complete form) or ``{"messages": [<τ² message
    JSON>, ...], "reward_info": <RewardInfo JSON>, "termination_reason": "user_stop"}`` (the termination
    reason may instead sit in the record's ``info["termination_reason"]``); an optional ``"domain"``
    must be the file's domain;
  - ``error`` (optional): set when the policy or simulator raised. Such an episode is written the way
    τ² writes a sample it skipped after an error (``skip_failed_samples``): no messages,
    ``termination_reason="agent_error"``, reward 0, ``skipped=True``; it counts as a failed trial.

Every (task, trial) pair may appear once; every run must have been scored (``reward_info``).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simpop.files import atomic_path

if TYPE_CHECKING:  # the τ² import (4–7 s) happens only when a results file is written
    from tau2.data_model.simulation import Results, SimulationRun

__all__ = ["pass_hat_k", "write_tau2_results"]

#: Largest difference tolerated between a record's reward and its τ² reward info.
_REWARD_TOLERANCE = 1e-9


def pass_hat_k(successes_by_task: Mapping[str, Sequence[bool]], k: int) -> float:
    """τ²'s pass^k: the mean over tasks of ``C(c, k) / C(n, k)`` (``n`` trials, ``c`` successes).

    Args:
        successes_by_task: Task id -> whether each of its trials succeeded (reward 1). Tasks may have
            different numbers of trials (τ² then uses each task's own ``n``).
        k: How many trials must all succeed; 1 <= k <= every task's number of trials.

    Raises:
        ValueError: ``k`` is not a positive int, there are no tasks, an outcome is not a bool, or a task
            has fewer than ``k`` trials (τ² refuses those too; the message names them).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"pass^k needs an int k >= 1, got {k!r}")
    if not successes_by_task:
        raise ValueError("pass^k needs at least one task with trials; got none")
    too_few: dict[str, int] = {}
    for task, outcomes in successes_by_task.items():
        if isinstance(outcomes, (str, bytes)) or not isinstance(outcomes, Sequence):
            raise ValueError(f"task {task!r}: outcomes must be a sequence of bools, got {type(outcomes).__name__}")
        bad = [o for o in outcomes if not _is_bool(o)]
        if bad:
            raise ValueError(f"task {task!r}: outcomes must be bools (success = reward 1), got {bad[0]!r}")
        if len(outcomes) < k:
            too_few[str(task)] = len(outcomes)
    if too_few:
        shown = ", ".join(f"{t!r} ({n})" for t, n in list(too_few.items())[:5])
        more = f" and {len(too_few) - 5} more" if len(too_few) > 5 else ""
        raise ValueError(f"pass^{k} needs at least {k} trials of every task; {len(too_few)} task(s) have fewer: "
                         f"{shown}{more}")
    per_task = [math.comb(sum(map(bool, outcomes)), k) / math.comb(len(outcomes), k)
                for outcomes in successes_by_task.values()]
    return math.fsum(per_task) / len(per_task)


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def write_tau2_results(path: str | os.PathLike, domain: str | None = None, episodes: Iterable[Any] = (), *,
                       env_id: str | None = None, agent: str = "simpop", user: str = "simpop",
                       agent_llm: str | None = None, user_llm: str | None = None, num_trials: int | None = None,
                       seed: int | None = None, max_steps: int | None = None, max_errors: int | None = None,
                       task_ids: Sequence[str] | None = None) -> Results:
    """Write ``episodes`` as a τ² results file at ``path`` (τ²'s ``Results.save``; atomic replace).

    Args:
        path: The JSON file to write (its folder is created).
        domain: The τ² domain (``"mock"``, ``"airline"``, ``"retail"``, ``"telecom"``, ``"telecom-workflow"``).
            May be omitted when ``env_id`` is given.
        episodes: The episodes (see the module for what each must contain).
        env_id: A registered τ² env id (e.g. ``"simpop/Tau2-retail-v0"``); its domain is used when
            ``domain`` is None and must equal ``domain`` otherwise.
        agent: What played the agent (τ²'s ``agent_info.implementation``), e.g. the policy spec.
        user: What played the user (τ²'s ``user_info.implementation``), e.g. the simulator spec.
        agent_llm: The agent's model name, if any (``agent_info.llm``).
        user_llm: The user simulator's model name, if any (``user_info.llm``).
        num_trials: Trials per task (τ²'s ``info.num_trials``, which τ²'s pass^k reads as the largest k).
            None: the largest number of trials any task has. No task may have more.
        seed: The evaluation's seed (``info.seed``).
        max_steps: The env's ``max_steps`` (default: :class:`~simpop.envs.tau2.env.Tau2Env`'s).
        max_errors: The env's ``max_errors`` (default: Tau2Env's).
        task_ids: The tasks to list in the file (e.g. the whole split, for τ²'s submission checks);
            default: the tasks the episodes played, in τ²'s order. Must include every played task.

    Returns:
        The τ² ``Results`` written.

    Raises:
        ValueError: an unknown or inconsistent domain, no episodes, an episode without what the module
            lists, an unscored run, a reward that disagrees with its τ² reward info, a repeated
            (task, trial), an unknown task, or more trials of a task than ``num_trials``.
    """
    from simpop.envs.tau2 import domains as t2
    from simpop.envs.tau2.env import DEFAULT_MAX_ERRORS, DEFAULT_MAX_STEPS
    from tau2.data_model.simulation import AgentInfo, Info, UserInfo

    import simpop

    name = _resolve_domain(domain, env_id)
    d = t2.domain(name)
    runs = [_simulation(e, i, name) for i, e in enumerate(episodes)]
    if not runs:
        raise ValueError("no episodes to write: a τ² results file needs at least one scored run")
    _number_trials(runs)
    unknown = sorted({r.task_id for r in runs} - set(d.tasks))
    if unknown:
        raise ValueError(f"episodes name task(s) that τ² domain {name!r} does not have: {unknown[:5]}")
    repeated = [key for key, n in Counter((r.task_id, r.trial) for r in runs).items() if n > 1]
    if repeated:
        raise ValueError(f"(task, trial) pairs appear more than once: {repeated[:5]}; each trial is one episode")
    counts = Counter(r.task_id for r in runs)
    most = max(counts.values())
    if num_trials is None:
        num_trials = most
    elif isinstance(num_trials, bool) or not isinstance(num_trials, int) or num_trials < 1:
        raise ValueError(f"num_trials must be an int >= 1 or None, got {num_trials!r}")
    elif most > num_trials:
        over = [t for t, n in counts.items() if n > num_trials]
        raise ValueError(f"num_trials={num_trials} but task(s) {over[:5]} have {most} trials")
    listed = list(dict.fromkeys(task_ids)) if task_ids is not None else [i for i in d.tasks if i in counts]
    missing = sorted(set(counts) - set(listed))
    if missing:
        raise ValueError(f"task_ids must include every played task; missing {missing[:5]}")
    absent = [i for i in listed if i not in d.tasks]
    if absent:
        raise ValueError(f"task_ids name task(s) that τ² domain {name!r} does not have: {absent[:5]}")

    info = Info(
        git_commit=f"simpop-{simpop.__version__}",
        num_trials=num_trials,
        max_steps=DEFAULT_MAX_STEPS if max_steps is None else int(max_steps),
        max_errors=DEFAULT_MAX_ERRORS if max_errors is None else int(max_errors),
        user_info=UserInfo(implementation=str(user), llm=user_llm,
                           global_simulation_guidelines=t2.user_guidelines(d.user_tools is not None)),
        agent_info=AgentInfo(implementation=str(agent), llm=agent_llm),
        environment_info=d.new_environment().get_info(include_tool_info=False),
        seed=seed,
    )
    results = t2.Results(info=info, tasks=[d.tasks[i] for i in listed], simulations=runs)
    _save(results, Path(path))
    return results


def _resolve_domain(domain: str | None, env_id: str | None) -> str:
    from_id = None
    if env_id is not None:
        from simpop.envs.registration import spec

        s = spec(env_id)
        from_id = s.kwargs.get("domain")
        if not s.entry_point.startswith("simpop.envs.tau2") or from_id is None:
            raise ValueError(f"env id {env_id!r} is not a τ² env with a domain; τ² results need one")
    resolved = domain if domain is not None else from_id
    if resolved is None:
        raise ValueError("write_tau2_results needs the τ² domain (domain=...) or a τ² env id (env_id=...)")
    if domain is not None and from_id is not None and domain != from_id:
        raise ValueError(f"domain {domain!r} disagrees with env id {env_id!r} (domain {from_id!r})")
    return resolved


def _field(record: Any, name: str, default: Any = None) -> Any:
    if isinstance(record, Mapping):
        return record.get(name, default)
    return getattr(record, name, default)


def _simulation(episode: Any, index: int, domain: str) -> SimulationRun:
    """τ²'s ``SimulationRun`` for one episode (see the module for the accepted forms)."""
    from simpop.envs.tau2 import domains as t2

    if isinstance(episode, t2.SimulationRun):
        run = episode.model_copy(deep=True)
    else:
        where = f"episode {index}"
        task_id = _field(episode, "task_id", _field(episode, "scenario"))
        trial = _field(episode, "trial")
        if not isinstance(task_id, str) or not task_id:
            raise ValueError(f"{where}: needs the τ² task id as 'task_id' (or 'scenario'), got {task_id!r}")
        if trial is not None and (isinstance(trial, bool) or not isinstance(trial, int) or trial < 0):
            raise ValueError(f"{where} (task {task_id!r}): 'trial' must be an int >= 0, got {trial!r}")
        where = f"episode {index} (task {task_id!r}, trial {trial})"
        error = _field(episode, "error")
        if error:
            # τ²'s own record of a sample that failed with an error and was skipped (run_tasks).
            now = t2.get_now()
            return t2.SimulationRun(id=f"simpop/{domain}/{task_id}/trial-{trial}/failed", task_id=task_id,
                                    start_time=now, end_time=now, duration=0.0,
                                    termination_reason=t2.TerminationReason.AGENT_ERROR, messages=[], trial=trial,
                                    reward_info=t2.RewardInfo(reward=0.0, info={"error": str(error)}), skipped=True)
        payload = _field(episode, "tau2")
        if payload is None:
            payload = (_field(episode, "extra") or {}).get("tau2")
        if not isinstance(payload, Mapping):
            raise ValueError(f"{where}: has no τ² episode ('tau2' or extra['tau2'] with 'simulation', or "
                             f"'messages' and 'reward_info'); record env.simulation_run() when the episode ends")
        if payload.get("domain") not in (None, domain):
            raise ValueError(f"{where}: was played on τ² domain {payload['domain']!r}, not {domain!r}")
        try:
            if payload.get("simulation") is not None:
                run = t2.SimulationRun.model_validate(payload["simulation"])
            elif payload.get("messages") is not None:
                reason = payload.get("termination_reason") or (_field(episode, "info") or {}).get("termination_reason")
                if reason is None:
                    raise ValueError("no termination_reason (in the τ² payload or the record's info)")
                run = t2.SimulationRun.model_validate({
                    "id": f"simpop/{domain}/{task_id}/trial-{trial}", "task_id": task_id, "start_time": "",
                    "end_time": "", "duration": 0.0, "termination_reason": reason,
                    "messages": payload["messages"], "reward_info": payload.get("reward_info")})
            else:
                raise ValueError(f"the τ² payload has neither 'simulation' nor 'messages' (keys: {sorted(payload)})")
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            raise ValueError(f"{where}: not a τ² episode: {e}") from e
        if run.task_id != task_id:
            raise ValueError(f"{where}: its τ² run is of task {run.task_id!r}")
        if trial is not None:
            if run.trial is not None and run.trial != trial:
                raise ValueError(f"{where}: its τ² run says trial {run.trial}")
            run.trial = trial
        reward = _field(episode, "reward")
        if reward is not None and run.reward_info is not None and not (
                abs(float(reward) - float(run.reward_info.reward)) <= _REWARD_TOLERANCE):
            raise ValueError(f"{where}: reward {reward} disagrees with its τ² reward info ({run.reward_info.reward})")
    if run.reward_info is None:
        raise ValueError(f"episode {index} (task {run.task_id!r}): the τ² run was never scored (no reward_info); "
                         f"take it from env.simulation_run() after the episode ends")
    return run


def _number_trials(runs: list[SimulationRun]) -> None:
    """Give runs without a trial number the next free number of their task, in order of appearance."""
    taken: dict[str, set[int]] = {}
    for r in runs:
        if r.trial is not None:
            taken.setdefault(r.task_id, set()).add(r.trial)
    for r in runs:
        if r.trial is None:
            used = taken.setdefault(r.task_id, set())
            r.trial = next(i for i in range(len(runs) + 1) if i not in used)
            used.add(r.trial)


def _save(results: Results, path: Path) -> None:
    """τ²'s ``Results.save`` to a temporary file beside ``path``, then an atomic replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        results.save(tmp)
