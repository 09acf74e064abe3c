"""The ``simpop eval`` runner: a policy against every member of a held-out panel, resumable, with reports.

:func:`evaluate_panel` plays, for every panel member, either ``episodes`` dialogues (distinct scenarios while
the env has enough, drawn as :meth:`~simpop.rollout.RolloutEngine.collect` draws them) or ``num_trials``
trials of every scenario (τ²'s ``--num-trials``). Every member gets the same scenarios, env seeds and policy
sampling seeds (common random numbers: members differ only by the simulator).

**Chunks.** A member's episodes run in chunks of ``concurrency`` dialogues, side by side in one wave of the
:class:`~simpop.rollout.RolloutEngine` (one batched model call per seat per turn). Each chunk's policy
generator is seeded from ``(seed, chunk)``, so a chunk gives the same dialogues whenever it runs. When a
chunk finishes its records are appended to ``episodes.jsonl`` in one write (flushed and fsynced): a kill
loses at most the chunk in flight.

**Members in one wave** (``one_wave``; by default for a policy that draws nothing from its generator,
:func:`draws_nothing`, and with ``simpop eval --sim-generator``): chunk ``c`` of every member runs as one wave instead (``concurrency`` x members dialogues side by side,
:class:`~simpop.simulators.panel_wave.PanelWave`): one batched policy call per tick for all members, and the
members' simulator calls of a tick sent side by side from threads, so members generating on one vLLM server are
one batch there. Each member starts its dialogues as it would alone, so a policy that draws nothing from its
generator (τ²'s gold agent, greedy text policies) gives the same records (up to a model engine's numerics: a
greedy model may break a near-tie differently in a larger batch); a policy that samples draws for every member's
dialogues of a tick from the chunk's one generator, so members no longer share its draws: such a policy runs
member by member unless ``one_wave=True`` (``simpop eval --waves panel``).

**Resume.** ``resume=True`` reads ``episodes.jsonl`` (a torn last line is dropped and the file rewritten
without it), checks that the run's settings (``eval.json``) match, and skips every finished
``(member, scenario, trial)``. A chunk with some episodes missing (a torn write) runs whole again with its
own seed and only the missing records are written, so a resumed run ends with exactly the records of an
uninterrupted one (for local models and native simulators; remote models are as deterministic as their
server). The summary is always computed from the file, in plan order.

**Ray.** With ``ray`` (:class:`~simpop.rollout_ray.RayConfig`, ``simpop eval --ray``) the chunks run in Ray
workers, one chunk per worker at a time, each with the generator it has locally, so the records are the same;
each worker sends back its envs' transcripts. τ² envs stay local (their results files read the env's state).

**Failures.** A policy or simulator that raises in a chunk does not end the evaluation: the chunk's
episodes run again one at a time (each with its own seed), and an episode that still raises is recorded
with ``error`` (success 0), counted and logged. In a wave of members, a member whose simulator raised is named
(:class:`~simpop.simulators.panel_wave.MemberError`): the other members' share reruns as one wave and only that
member's one episode at a time, so a dialogue that fails every time costs its member two runs, not three. A model
server that stays unreachable through its retries
(:class:`~simpop.agents.openai_backend.BackendUnavailable`) is not the policy's failure: it stops the run, like
``KeyboardInterrupt``; finished chunks stay, and ``resume`` continues once the server is back.

**The folder.** A run holds ``out``'s writer lock (:func:`simpop.files.run_lock`, shared by every command that
writes a run folder) and writes only an empty folder or one with an ``eval.json`` (an evaluation's): never another
tool's files.

**Outputs** in ``out``: ``eval.json`` (settings), ``episodes.jsonl`` (:mod:`~simpop.evaluation.eval_records`),
``summary.json`` (overall and per-member success with Wilson 95% intervals, per-task breakdown, policy entropy, error
counts; ``heldout_check``: the panel's check against a training run, with what each look-alike member shares with
it), ``report.md`` (tables and the panel card) and ``success.png`` (:mod:`~simpop.evaluation.eval_summary`). τ² envs
also get pass^k for k = 1..num_trials and one τ² results file per member under ``tau2_results/``
(:mod:`~simpop.evaluation.eval_tau2`).

**Entropy.** Per episode, the policy's own ``entropy([trajectory])`` and what it averages over (decisions
or generated tokens); overall and per member, the weighted mean. Policies without ``entropy`` report none.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simpop.agents.openai_backend import BackendUnavailable
from simpop.evaluation.eval_records import EPISODES, append_records, read_records
from simpop.evaluation.eval_summary import CHART, REPORT, SUMMARY, plot_success, render_report, summarize
from simpop.evaluation.eval_tau2 import is_tau2, tau2_extras, tau2_payload
from simpop.evaluation.panel import EnvPool, EpisodeRecord, episode_record, json_safe, transcript_of
from simpop.files import RUN_LOCK, run_lock, write_atomically
from simpop.rollout import Job, RolloutEngine, Trajectory
from simpop.rollout_ray import RayConfig, RayRolloutEngine
from simpop.simulators.panel_wave import MemberError, PanelWave
from simpop.simulators.population import Panel
from simpop.user_input import error_line

log = logging.getLogger(__name__)

SETTINGS = "eval.json"
#: Settings a resumed run must share with the run it continues.
_RESUME_KEYS = ("env", "env_kwargs", "policy", "panel", "members", "seed", "episodes", "num_trials")


@dataclass(frozen=True)
class PlannedEpisode:
    """One episode of a member's plan (the same plan for every member)."""

    scenario: str
    trial: int
    index: int
    seed: int


def plan_episodes(scenario_ids: Sequence[str], *, episodes: int | None = None, num_trials: int | None = None,
                  seed: int = 0) -> list[PlannedEpisode]:
    """The episodes every member plays.

    ``episodes=N``: ``N`` scenarios drawn as ``RolloutEngine.collect(N, seed=seed)`` draws them (without
    replacement while there are enough; a scenario drawn again is its next trial), env seeds as ``collect``'s.
    ``num_trials=K``: every scenario ``K`` times, trial by trial (trial 0 of every scenario first).
    """
    if (episodes is None) == (num_trials is None):
        raise ValueError("give exactly one of episodes (per member) and num_trials (per task)")
    count = episodes if episodes is not None else num_trials
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"{'episodes' if episodes is not None else 'num_trials'} must be an integer >= 1, "
                         f"got {count!r}")
    ids = list(scenario_ids)
    if not ids:
        raise ValueError("the env has no scenarios")
    plan: list[PlannedEpisode] = []
    if episodes is not None:
        picks = np.random.default_rng([seed, 0]).choice(len(ids), size=episodes, replace=episodes > len(ids))
        seen: dict[str, int] = {}
        for g, i in enumerate(picks):
            sid = ids[int(i)]
            plan.append(PlannedEpisode(sid, seen.get(sid, 0), g, _seed([seed, 1, g, 0])))
            seen[sid] = seen.get(sid, 0) + 1
        return plan
    for trial in range(num_trials):  # type: ignore[arg-type]
        for t, sid in enumerate(ids):
            plan.append(PlannedEpisode(sid, trial, len(plan), _seed([seed, 5, t, trial])))
    return plan


def _seed(entropy: list[int]) -> int:
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


# ---------------------------------------------------------------------------------------------- the runner
def _locked(run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` (which writes its keyword argument ``out``) holding ``out``'s :func:`~simpop.files.run_lock`."""
    @functools.wraps(run)
    def locked(*args: Any, out: str | Path, **kwargs: Any) -> Any:
        with run_lock(out):
            return run(*args, out=out, **kwargs)

    return locked


@_locked
def evaluate_panel(env_id: str, policy: Any, panel: Panel, *, episodes: int | None = None,
                   num_trials: int | None = None, seed: int = 0, out: str | Path, resume: bool = False,
                   concurrency: int = 8, env_kwargs: Mapping[str, Any] | None = None, progress: bool = False,
                   policy_spec: str | None = None, ray: RayConfig | None = None,
                   one_wave: bool | None = None, heldout: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Evaluate ``policy`` on every member of ``panel`` and write the outputs to ``out`` (module docstring).

    Args:
        env_id: The registered env.
        policy: What plays the policy seat (see :mod:`simpop.evaluation.policies`).
        panel: The held-out simulators.
        episodes: Dialogues per member (exclusive with ``num_trials``).
        num_trials: Trials of every scenario per member (exclusive with ``episodes``).
        seed: Derives scenarios, env seeds and the policy's sampling; same seed, same episodes.
        out: Output folder.
        resume: Continue the evaluation in ``out`` (refused if its settings differ).
        concurrency: Dialogues run side by side (the rollout engine's ``n_envs``; also the chunk size).
        env_kwargs: Env constructor arguments.
        progress: Show a progress bar.
        policy_spec: How the policy was named (recorded and compared on resume).
        ray: Run the chunks in Ray rollout workers when ``ray.ray`` (same records as locally).
        one_wave: Run every member's share of a chunk in one wave (module docstring; not with ``ray``); None:
            when the policy :func:`draws_nothing` and ``ray`` is off.
        heldout: The panel's check against a training run (``simpop eval --run``: ``run``, ``strict``,
            ``look_alikes``), written to the summary (``heldout_check``) and the report's panel card.

    Returns:
        The summary (as written to ``summary.json``).

    Raises:
        ValueError: Bad settings, a non-empty ``out`` without ``resume``, a resume with other settings, an
            ``out`` that holds something other than an evaluation, or one another run is writing.
    """
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    from simpop.envs.registration import make

    kwargs = dict(env_kwargs or {})
    pool = EnvPool(lambda: make(env_id, **kwargs))
    plan = plan_episodes(pool.take(1)[0].scenario_ids(), episodes=episodes, num_trials=num_trials, seed=seed)
    if one_wave is None:
        one_wave = draws_nothing(policy) and not (ray is not None and ray.ray)
    if one_wave and ray is not None and ray.ray:
        raise ValueError("members run in one wave locally; drop --ray (or --sim-generator)")
    if ray is not None and ray.ray and is_tau2(pool.take(1)[0]):
        raise ValueError("--ray does not run τ² evaluations (their results files read each env's state); "
                         "run them without --ray")
    members = {name: member_spec(simulator) for name, simulator in panel}
    settings = {"env": env_id, "env_kwargs": json_safe(kwargs), "policy": policy_spec or _describe(policy),
                "panel": panel.name, "members": members, "seed": int(seed), "episodes": episodes,
                "num_trials": num_trials, "concurrency": concurrency}
    out = Path(out)
    path = out / EPISODES
    _prepare(out, settings, resume)
    done = {r.key for r in read_records(path, repair=True)} if resume else set()
    planned_keys = {(m, e.scenario, e.trial) for m in members for e in plan}
    total, finished = len(planned_keys), len(done & planned_keys)

    from simpop.progress import progress_bar

    bar = progress_bar(total, "eval", unit="episode", initial=finished, disable=not progress)
    errors = 0
    started = time.perf_counter()
    try:
        if one_wave:
            for new in _run_panel(pool, policy, panel, plan, concurrency, seed, done):
                append_records(path, new)
                done.update(r.key for r in new)
                errors += sum(r.error is not None for r in new)
                bar.update(len(new))
        for name, simulator in () if one_wave else panel:
            if ray is not None and ray.ray:
                engine: RolloutEngine = RayRolloutEngine(lambda: make(env_id, **kwargs), policy, simulator,
                                                         n_envs=concurrency, config=ray, env_view=env_view)
            else:
                engine = RolloutEngine(pool.factory(), policy, simulator, n_envs=concurrency)
            todo = [(plan[c:c + concurrency], [seed, 3, c // concurrency]) for c in range(0, len(plan), concurrency)
                    if any((name, e.scenario, e.trial) not in done for e in plan[c:c + concurrency])]
            side_by_side = ray.ray_workers if isinstance(engine, RayRolloutEngine) and ray is not None else 1
            for g in range(0, len(todo), side_by_side):
                for records in _run_chunks(engine, pool, policy, name, todo[g:g + side_by_side]):
                    new = [r for r in records if r.key not in done]
                    append_records(path, new)
                    done.update(r.key for r in new)
                    errors += sum(r.error is not None for r in new)
                    bar.update(len(new))
            if isinstance(engine, RayRolloutEngine):
                engine.close()
    finally:
        bar.close()
    if errors:
        log.warning("%d episode(s) failed with an error this run; they are recorded with error and success 0",
                    errors)
    log.info("ran %d episode(s) in %.1f s", total - finished, time.perf_counter() - started)
    return write_outputs(out, settings=settings, plan=plan, heldout=heldout)


def draws_nothing(policy: Any) -> bool:
    """Whether ``policy``'s actions never depend on the generator the rollout engine hands it (its ``rng_free``
    attribute, False if it has none): then all members in one wave give the member-by-member records."""
    return bool(getattr(policy, "rng_free", False))


def member_spec(simulator: Any) -> str:
    """A member's spec string (its canonical :class:`~simpop.seat.SimulatorSpec`), or its class if it has none."""
    try:
        return str(simulator.spec)
    except Exception as error:  # a custom simulator whose spec fails still gets a line
        return f"<{type(simulator).__name__}: spec unavailable: {error}>"


def _describe(policy: Any) -> str:
    return f"<{type(policy).__module__}.{type(policy).__qualname__}>"


def _prepare(out: Path, settings: dict[str, Any], resume: bool) -> None:
    """Check that ``out`` fits a new or resumed evaluation, then write ``eval.json``.

    Only a folder with an ``eval.json`` (an evaluation's) or an empty one is written: the outputs replace
    ``summary.json``, ``report.md`` and ``success.png``, which must not be another tool's.
    """
    settings_path, episodes_path = out / SETTINGS, out / EPISODES
    if not settings_path.exists():
        others = sorted(p.name for p in out.iterdir() if p.name != RUN_LOCK)
        if others:
            raise ValueError(f"{out} is not empty ({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}) and "
                             f"holds no {SETTINGS}: not a simpop eval folder; choose a new or empty --out")
        saved = None
    else:
        try:
            saved = json.loads(settings_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ValueError(f"{settings_path}: unreadable ({error}); choose another --out") from None
        if not isinstance(saved, dict):
            raise ValueError(f"{settings_path} is not a simpop eval settings file (a {type(saved).__name__}, not a "
                             f"JSON object); choose another --out")
    if resume and saved is not None:
        changed = [f"{k}: {saved.get(k)!r} -> {settings[k]!r}" for k in _RESUME_KEYS if saved.get(k) != settings[k]]
        if changed:
            raise ValueError(f"--resume with different settings than the evaluation in {out}: " + "; ".join(changed)
                             + "; pass the same settings, or use a new --out")
        if saved.get("concurrency") != settings["concurrency"]:
            log.warning("resuming with concurrency %s (was %s): the remaining chunks differ from an uninterrupted "
                        "run's, so sampled results may differ", settings["concurrency"], saved.get("concurrency"))
    elif not resume and episodes_path.exists() and episodes_path.stat().st_size > 0:
        raise ValueError(f"{out} already holds an evaluation ({episodes_path}); pass --resume to continue it, "
                         f"or choose another --out")
    write_atomically(settings_path, json.dumps(settings, indent=2, sort_keys=True) + "\n")


def env_view(env: Any) -> Any:
    """What a record needs of the env that ran a dialogue, sent back by Ray workers: its transcript."""
    from types import SimpleNamespace

    return SimpleNamespace(transcript=list(getattr(env, "transcript", [])))


def _run_chunks(engine: RolloutEngine, pool: EnvPool, policy: Any, member: str,
                chunks: list[tuple[list[PlannedEpisode], list[int]]]) -> list[list[EpisodeRecord]]:
    """Records of several chunks (each with its generator's seed) run side by side by Ray workers, else one by one
    (as they also run if the side-by-side run raises)."""
    if isinstance(engine, RayRolloutEngine) and len(chunks) > 1:
        try:
            trajectories = engine.run_waves([([Job(e.scenario, e.index, e.seed) for e in chunk],
                                              np.random.default_rng(rng_seed)) for chunk, rng_seed in chunks])
            episodes = [e for chunk, _ in chunks for e in chunk]
            records = [_record(t, view, policy, member, e)
                       for t, view, e in zip(trajectories, engine.env_views, episodes, strict=True)]
            sizes = np.cumsum([0] + [len(chunk) for chunk, _ in chunks])
            return [records[a:b] for a, b in zip(sizes[:-1], sizes[1:])]
        except BackendUnavailable:  # the server is gone: stop, finished chunks kept
            raise
        except Exception as error:
            log.warning("member %s: %d chunks run side by side raised (%s: %s); running them one at a time",
                        member, len(chunks), type(error).__name__, error_line(error))
    return [_run_chunk(engine, pool, policy, member, chunk, rng_seed) for chunk, rng_seed in chunks]


def _run_chunk(engine: RolloutEngine, pool: EnvPool, policy: Any, member: str, chunk: list[PlannedEpisode],
               rng_seed: list[int]) -> list[EpisodeRecord]:
    """Run one chunk as one wave; if it raises, run its episodes one by one and record those that still fail."""
    envs = pool.take(len(chunk))
    try:
        trajectories = engine.run([Job(e.scenario, e.index, e.seed) for e in chunk], np.random.default_rng(rng_seed))
        views = engine.env_views if isinstance(engine, RayRolloutEngine) else envs
        return [_record(t, views[i], policy, member, chunk[i]) for i, t in enumerate(trajectories)]
    except BackendUnavailable:  # the server is gone: stop, finished chunks kept
        raise
    except Exception as error:
        log.warning("member %s: a chunk of %d episode(s) raised (%s: %s); running them one at a time",
                    member, len(chunk), type(error).__name__, error_line(error))
    return _run_episodes(engine, pool, policy, member, chunk, rng_seed)


def _run_episodes(engine: RolloutEngine, pool: EnvPool, policy: Any, member: str, chunk: list[PlannedEpisode],
                  rng_seed: list[int]) -> list[EpisodeRecord]:
    """Run a chunk's episodes one at a time; an episode that raises is recorded with its error."""
    records = []
    for j, e in enumerate(chunk):
        env = pool.take(1)[0]
        before = env.transcript
        try:
            (t,) = engine.run([Job(e.scenario, e.index, e.seed)], np.random.default_rng([*rng_seed, 1 + j]))
            records.append(_record(t, engine.env_views[0] if isinstance(engine, RayRolloutEngine) else env, policy,
                                   member, e))
        except BackendUnavailable:  # the server is gone: stop, finished chunks kept
            raise
        except Exception as error:
            message = f"{type(error).__name__}: {error_line(error)}"
            log.warning("member %s, scenario %s, trial %d: episode failed: %s", member, e.scenario, e.trial, message)
            partial = transcript_of(env) if env.transcript is not before else []
            records.append(EpisodeRecord(member=member, scenario=e.scenario, trial=e.trial, index=e.index,
                                         seed=e.seed, transcript=partial, error=message, turns=len(partial),
                                         policy_turns=sum(t["seat"] == env.policy_seat for t in partial)))
    return records


def _run_panel(pool: EnvPool, policy: Any, panel: Panel, plan: list[PlannedEpisode], concurrency: int, seed: int,
               done: set[tuple[str, str, int]]) -> Iterable[list[EpisodeRecord]]:
    """The new records of each chunk, every member's share of the chunk run in one wave (module docstring)."""
    names = [name for name, _ in panel]
    simulators = [simulator for _, simulator in panel]
    wave = PanelWave(simulators, concurrent=all(_served(s) for s in simulators))
    engine = RolloutEngine(pool.factory(), policy, wave)
    for c in range(0, len(plan), concurrency):
        chunk, rng_seed = plan[c:c + concurrency], [seed, 3, c // concurrency]
        members = [m for m, name in enumerate(names) if any((name, e.scenario, e.trial) not in done for e in chunk)]
        if members:
            records = _run_panel_chunk(engine, wave, pool, policy, [names[m] for m in members], members, chunk,
                                       rng_seed)
            yield [r for r in records if r.key not in done]


def _served(simulator: Any) -> bool:
    """Whether every model behind ``simulator`` (its ``backend``, its members' in a population) is served over HTTP,
    so that its calls may overlap another member's (an in-process model is not thread-safe)."""
    from simpop.agents.openai_backend import OpenAIBackend
    from simpop.agents.vllm_backend import VLLMBackend

    backend = getattr(simulator, "backend", None)
    if backend is not None and not isinstance(backend, (OpenAIBackend, VLLMBackend)):
        return False
    return all(_served(m) for m in getattr(simulator, "members", None) or () if m is not simulator)


def _run_panel_chunk(engine: RolloutEngine, wave: PanelWave, pool: EnvPool, policy: Any, names: list[str],
                     members: list[int], chunk: list[PlannedEpisode], rng_seed: list[int]) -> list[EpisodeRecord]:
    """``chunk`` for each of ``members`` as one wave. If a member's simulator raises (:class:`MemberError`), the
    other members rerun as one wave and that member's share one episode at a time; if anything else raises (the
    policy, an env), each member's share runs alone (and one episode at a time if that raises too,
    :func:`_run_chunk`)."""
    wave.assign([m for m in members for _ in chunk])
    envs = pool.take(len(members) * len(chunk))
    try:
        trajectories = engine.run([Job(e.scenario, e.index, e.seed) for _ in members for e in chunk],
                                  np.random.default_rng(rng_seed))
        return [_record(t, envs[i], policy, names[i // len(chunk)], chunk[i % len(chunk)])
                for i, t in enumerate(trajectories)]
    except BackendUnavailable:  # the server is gone: stop, finished chunks kept
        raise
    except MemberError as error:  # one member's simulator raised: the others rerun together, it episode by episode
        failed = members.index(error.member)
        log.warning("members %s: a chunk of %d episode(s) each raised in one wave (%s); the other members rerun as "
                    "one wave, %s one episode at a time", ", ".join(names), len(chunk), error_line(error),
                    names[failed])
        others = [i for i in range(len(members)) if i != failed]
        records = (_run_panel_chunk(engine, wave, pool, policy, [names[i] for i in others],
                                    [members[i] for i in others], chunk, rng_seed) if others else [])
        alone = RolloutEngine(pool.factory(), policy, wave.members[error.member], n_envs=len(chunk))
        records += _run_episodes(alone, pool, policy, names[failed], chunk, rng_seed)
        order = {name: i for i, name in enumerate(names)}
        return sorted(records, key=lambda r: order[r.member])  # member by member, as from one wave
    except Exception as error:
        log.warning("members %s: a chunk of %d episode(s) each raised in one wave (%s: %s); running each member's "
                    "share alone", ", ".join(names), len(chunk), type(error).__name__, error_line(error))
    records = []
    for name, m in zip(names, members):
        alone = RolloutEngine(pool.factory(), policy, wave.members[m], n_envs=len(chunk))
        records += _run_chunk(alone, pool, policy, name, chunk, rng_seed)
    return records




def _record(trajectory: Trajectory, env: Any, policy: Any, member: str, e: PlannedEpisode) -> EpisodeRecord:
    entropy, weight = _episode_entropy(policy, trajectory)
    record = episode_record(trajectory, env, member=member, index=e.index, trial=e.trial, entropy=entropy,
                            entropy_weight=weight)
    if is_tau2(env):
        record.extra["tau2"] = tau2_payload(env, e.trial)
    return record


def _episode_entropy(policy: Any, trajectory: Trajectory) -> tuple[float | None, int]:
    measure = getattr(policy, "entropy", None)
    if not callable(measure):
        return None, 0
    weight = trajectory.policy_tokens if trajectory.token_ids else trajectory.policy_turns
    try:
        value = float(measure([trajectory]))
    except Exception as error:  # entropy is a diagnostic: a failure is logged, never fatal
        log.warning("policy entropy failed (%s: %s); recorded as none", type(error).__name__, error_line(error))
        return None, 0
    return (value, int(weight)) if math.isfinite(value) and weight > 0 else (None, 0)










# ---------------------------------------------------------------------------------------------- outputs
def write_outputs(out: str | Path, *, settings: Mapping[str, Any], plan: Sequence[PlannedEpisode],
                  heldout: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``summary.json``, ``report.md``, ``success.png`` (and τ² results) from ``episodes.jsonl`` (``heldout``: see
    :func:`evaluate_panel`)."""
    out = Path(out)
    members = dict(settings["members"])
    order = {(m, e.scenario, e.trial): (i, e.index) for i, m in enumerate(members) for e in plan}
    records = sorted((r for r in read_records(out / EPISODES) if r.key in order), key=lambda r: order[r.key])
    summary = summarize(records, members, settings, planned=len(members) * len(plan))
    summary["heldout_check"] = dict(heldout) if heldout is not None else None
    if summary["tau2"] is not None:
        summary["tau2"].update(tau2_extras(out, records, members, settings))
    write_atomically(out / SUMMARY, json.dumps(summary, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    write_atomically(out / REPORT, render_report(summary))
    plot_success(summary, out / CHART)
    return summary






















