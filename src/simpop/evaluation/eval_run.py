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

**Outputs** in ``out``: ``eval.json`` (settings), ``episodes.jsonl`` (:class:`~simpop.evaluation.panel.EpisodeRecord`
per line), ``summary.json`` (overall and per-member success with Wilson 95% intervals, per-task breakdown,
policy entropy, error counts; τ² envs: pass^k for k = 1..num_trials; ``heldout_check``: the panel's check against
a training run, with what each look-alike member shares with it), ``report.md`` (tables and the panel card) and
``success.png`` (success per member with interval bars). τ² envs also get one τ² results file per member under
``tau2_results/``.

**Entropy.** Per episode, the policy's own ``entropy([trajectory])`` and what it averages over (decisions
or generated tokens); overall and per member, the weighted mean. Policies without ``entropy`` report none.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simpop.agents.openai_backend import BackendUnavailable
from simpop.evaluation.metrics import wilson_ci
from simpop.files import RUN_LOCK, run_lock, write_atomically
from simpop.evaluation.panel import EnvPool, EpisodeRecord, begin_wave, episode_record, json_safe, transcript_of
from simpop.rollout import Job, RolloutEngine, Trajectory
from simpop.rollout_ray import RayConfig, RayRolloutEngine
from simpop.simulators.panel_wave import MemberError, PanelWave
from simpop.simulators.population import Panel

log = logging.getLogger(__name__)

EPISODES, SUMMARY, REPORT, CHART, SETTINGS = "episodes.jsonl", "summary.json", "report.md", "success.png", "eval.json"
CI_LEVEL = 0.95
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
                        member, len(chunks), type(error).__name__, _first_line(error))
    return [_run_chunk(engine, pool, policy, member, chunk, rng_seed) for chunk, rng_seed in chunks]


def _run_chunk(engine: RolloutEngine, pool: EnvPool, policy: Any, member: str, chunk: list[PlannedEpisode],
               rng_seed: list[int]) -> list[EpisodeRecord]:
    """Run one chunk as one wave; if it raises, run its episodes one by one and record those that still fail."""
    envs = pool.take(len(chunk))
    begin_wave(policy, envs)
    try:
        trajectories = engine.run([Job(e.scenario, e.index, e.seed) for e in chunk], np.random.default_rng(rng_seed))
        views = engine.env_views if isinstance(engine, RayRolloutEngine) else envs
        return [_record(t, views[i], policy, member, chunk[i]) for i, t in enumerate(trajectories)]
    except BackendUnavailable:  # the server is gone: stop, finished chunks kept
        raise
    except Exception as error:
        log.warning("member %s: a chunk of %d episode(s) raised (%s: %s); running them one at a time",
                    member, len(chunk), type(error).__name__, _first_line(error))
    return _run_episodes(engine, pool, policy, member, chunk, rng_seed)


def _run_episodes(engine: RolloutEngine, pool: EnvPool, policy: Any, member: str, chunk: list[PlannedEpisode],
                  rng_seed: list[int]) -> list[EpisodeRecord]:
    """Run a chunk's episodes one at a time; an episode that raises is recorded with its error."""
    records = []
    for j, e in enumerate(chunk):
        env = pool.take(1)[0]
        before = env.transcript
        begin_wave(policy, [env])
        try:
            (t,) = engine.run([Job(e.scenario, e.index, e.seed)], np.random.default_rng([*rng_seed, 1 + j]))
            records.append(_record(t, engine.env_views[0] if isinstance(engine, RayRolloutEngine) else env, policy,
                                   member, e))
        except BackendUnavailable:  # the server is gone: stop, finished chunks kept
            raise
        except Exception as error:
            message = f"{type(error).__name__}: {_first_line(error)}"
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
    begin_wave(policy, envs)
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
                    "one wave, %s one episode at a time", ", ".join(names), len(chunk), _first_line(error),
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
                    "share alone", ", ".join(names), len(chunk), type(error).__name__, _first_line(error))
    records = []
    for name, m in zip(names, members):
        alone = RolloutEngine(pool.factory(), policy, wave.members[m], n_envs=len(chunk))
        records += _run_chunk(alone, pool, policy, name, chunk, rng_seed)
    return records


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else repr(error)


def _record(trajectory: Trajectory, env: Any, policy: Any, member: str, e: PlannedEpisode) -> EpisodeRecord:
    entropy, weight = _episode_entropy(policy, trajectory)
    record = episode_record(trajectory, env, member=member, index=e.index, trial=e.trial, entropy=entropy,
                            entropy_weight=weight)
    if is_tau2(env):
        record.extra["tau2"] = _tau2_payload(env, e.trial)
    return record


def _episode_entropy(policy: Any, trajectory: Trajectory) -> tuple[float | None, int]:
    measure = getattr(policy, "entropy", None)
    if not callable(measure):
        return None, 0
    weight = trajectory.policy_tokens if trajectory.token_ids else trajectory.policy_turns
    try:
        value = float(measure([trajectory]))
    except Exception as error:  # entropy is a diagnostic: a failure is logged, never fatal
        log.warning("policy entropy failed (%s: %s); recorded as none", type(error).__name__, _first_line(error))
        return None, 0
    return (value, int(weight)) if math.isfinite(value) and weight > 0 else (None, 0)


def is_tau2(env: Any) -> bool:
    """Whether ``env`` is a τ² env (its episodes carry τ² messages and pass^k applies)."""
    return type(env).__module__.startswith("simpop.envs.tau2")


def _tau2_payload(env: Any, trial: int) -> dict[str, Any]:
    """The finished τ² episode as τ² sees it: its ``SimulationRun`` (``env.simulation_run``: messages, reward
    info, termination reason, times) or, on an env without it, its messages and reward info."""
    try:
        if callable(getattr(env, "simulation_run", None)):
            return {"domain": env.domain, "simulation": env.simulation_run(trial).model_dump(mode="json")}
        info = env.reward_info
        return {"domain": env.domain, "messages": [m.model_dump(mode="json") for m in env.trajectory()],
                "reward_info": info.model_dump(mode="json") if info is not None else None}
    except Exception as error:
        log.warning("could not keep the τ² trajectory (%s: %s)", type(error).__name__, _first_line(error))
        return {"error": f"{type(error).__name__}: {_first_line(error)}"}


# ---------------------------------------------------------------------------------------------- the file
def read_records(path: str | Path, repair: bool = False) -> list[EpisodeRecord]:
    """Every complete record in ``episodes.jsonl`` (first of any repeated key), in file order.

    A line that does not parse (a write torn by a kill, cut inside a multi-byte character or not; a record whose
    fields have the wrong types) is dropped with a warning; with ``repair`` the file is rewritten atomically
    without it, so that later appends start on a fresh line.
    """
    path = Path(path)
    if not path.exists():
        return []
    records, keys, kept, dropped = [], set(), [], 0
    raw = path.read_bytes()
    for data in raw.split(b"\n"):
        if not data.strip():
            continue
        try:  # a torn line may end inside a multi-byte character, or hold a record with the wrong field types
            line = data.decode("utf-8")
            record = EpisodeRecord.from_json(line)
        except (ValueError, TypeError):
            dropped += 1
            continue
        if record.key in keys:
            continue
        keys.add(record.key)
        records.append(record)
        kept.append(line)
    if dropped:
        log.warning("%s: dropped %d unreadable line(s) (a write cut short by a kill); those episodes run again",
                    path, dropped)
    if repair and (dropped or (raw and not raw.endswith(b"\n"))):
        write_atomically(path, "".join(line + "\n" for line in kept))
    return records


def append_records(path: str | Path, records: Iterable[EpisodeRecord]) -> None:
    """Append ``records`` in one write, flushed and fsynced."""
    text = "".join(r.to_json() + "\n" for r in records)
    if not text:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


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
        summary["tau2"].update(_tau2_extras(out, records, members, settings))
    write_atomically(out / SUMMARY, json.dumps(summary, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    write_atomically(out / REPORT, render_report(summary))
    plot_success(summary, out / CHART)
    return summary


def _rate(records: Sequence[EpisodeRecord]) -> dict[str, Any]:
    n, wins = len(records), sum(bool(r.success) for r in records)
    rate, lo, hi = wilson_ci(wins, n, CI_LEVEL)
    return {"episodes": n, "successes": wins, "success": _num(rate), "ci_low": _num(lo), "ci_high": _num(hi)}


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _entropy(records: Sequence[EpisodeRecord]) -> float | None:
    weighted = [(r.entropy, r.entropy_weight) for r in records if r.entropy is not None and r.entropy_weight > 0]
    total = sum(w for _, w in weighted)
    return float(sum(e * w for e, w in weighted) / total) if total else None


def summarize(records: Sequence[EpisodeRecord], members: Mapping[str, str], settings: Mapping[str, Any],
              planned: int | None = None) -> dict[str, Any]:
    """The summary of ``records`` (in plan order): overall, per member and per task (module docstring).

    ``planned`` is how many episodes the evaluation plans in all (``complete`` says whether all are in).
    """
    by_member = {m: [r for r in records if r.member == m] for m in members}
    tasks: dict[str, list[EpisodeRecord]] = {}
    for r in records:
        tasks.setdefault(r.scenario, []).append(r)
    summary: dict[str, Any] = {
        "env": settings["env"], "env_kwargs": settings["env_kwargs"], "policy": settings["policy"],
        "panel": settings["panel"], "seed": settings["seed"], "episodes_per_member": settings["episodes"],
        "num_trials": settings["num_trials"], "ci": {"level": CI_LEVEL, "method": "wilson"},
        **_rate(records), "errors": sum(r.error is not None for r in records),
        "invalid_actions": sum(r.invalid_actions for r in records), "entropy": _entropy(records),
        "mean_reward": _num(float(np.mean([r.reward for r in records]))) if records else None,
        "members": {}, "tasks": {},
    }
    for m, spec in members.items():
        rs = by_member[m]
        summary["members"][m] = {"spec": spec, **_rate(rs), "errors": sum(r.error is not None for r in rs),
                                 "invalid_actions": sum(r.invalid_actions for r in rs), "entropy": _entropy(rs),
                                 "mean_reward": _num(float(np.mean([r.reward for r in rs]))) if rs else None}
    for task, rs in tasks.items():
        summary["tasks"][task] = {**_rate(rs), "per_member": {
            m: {"episodes": len(x), "successes": sum(bool(r.success) for r in x)}
            for m in members if (x := [r for r in rs if r.member == m])}}
    summary["planned"] = planned
    summary["complete"] = planned is None or len(records) == planned
    summary["tau2"] = {} if settings["env"] and _tau2_env_id(settings["env"]) else None
    return summary


def _tau2_env_id(env_id: str) -> bool:
    from simpop.envs.registration import spec

    try:
        return spec(env_id).entry_point.startswith("simpop.envs.tau2")
    except KeyError:
        return False


def _tau2_extras(out: Path, records: Sequence[EpisodeRecord], members: Mapping[str, str],
                 settings: Mapping[str, Any]) -> dict[str, Any]:
    """pass^k for k = 1..num_trials (per member and overall) and τ² results files, via
    :mod:`simpop.envs.tau2.results`. Missing pieces are reported in the summary and logged, never fatal."""
    extras: dict[str, Any] = {}
    try:
        from simpop.envs.tau2 import results as tau2_results
    except ImportError as error:
        message = f"simpop.envs.tau2.results is not available ({error}); no pass^k or τ² results files"
        log.error(message)
        return {"error": message}
    trials = settings["num_trials"]
    if trials:
        pass_hat_k = getattr(tau2_results, "pass_hat_k", None)
        if pass_hat_k is None:
            extras["error"] = "simpop.envs.tau2.results has no pass_hat_k; pass^k not computed"
            log.error(extras["error"])
        else:
            try:
                per_member = {}
                for m in members:
                    by_task: dict[str, list[bool]] = {}
                    for r in records:
                        if r.member == m:
                            by_task.setdefault(r.scenario, []).append(bool(r.success))
                    per_member[m] = ({str(k): float(pass_hat_k(by_task, k)) for k in range(1, trials + 1)}
                                     if by_task else {})
                # Overall: every (member, task) is one "task" of K trials (the mean over members).
                pooled: dict[str, list[bool]] = {}
                for r in records:
                    pooled.setdefault(f"{r.member}/{r.scenario}", []).append(bool(r.success))
                extras["pass_hat_k"] = ({str(k): float(pass_hat_k(pooled, k)) for k in range(1, trials + 1)}
                                        if pooled else {})
                extras["pass_hat_k_per_member"] = per_member
            except ValueError as error:  # e.g. an incomplete evaluation: some task has fewer than k trials
                extras["error"] = f"pass^k not computed: {_first_line(error)}"
                log.error(extras["error"])
    else:
        extras["pass_hat_k"] = None
        extras["note"] = "pass^k needs --num-trials (every task, K trials)"
    writer = getattr(tau2_results, "write_tau2_results", None)
    if writer is None:
        extras["results_error"] = "simpop.envs.tau2.results has no write_tau2_results; no τ² results files"
        log.error(extras["results_error"])
        return extras
    folder = out / "tau2_results"
    folder.mkdir(exist_ok=True)
    files = {}
    for m, spec in members.items():
        episodes = [r for r in records if r.member == m]
        path = folder / f"{_file_name(m)}.json"
        try:
            limits = {k: settings["env_kwargs"].get(k) for k in ("max_steps", "max_errors")}
            writer(path, episodes=episodes, agent=settings["policy"], user=spec, seed=settings["seed"],
                   num_trials=trials, env_id=settings["env"], **limits)
            files[m] = str(path.relative_to(out))
        except Exception as error:  # the summary and report are still written
            extras.setdefault("results_errors", {})[m] = f"{type(error).__name__}: {_first_line(error)}"
            log.error("τ² results file for member %s not written: %s", m, extras["results_errors"][m])
    extras["results_files"] = files
    return extras


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "member"


def render_report(summary: Mapping[str, Any]) -> str:
    """``report.md``: the panel card, the member table with Wilson intervals, τ² pass^k, per-task results."""
    def pct(x: Any) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    def ci(s: Mapping[str, Any]) -> str:
        return "n/a" if s["ci_low"] is None else f"[{s['ci_low']:.3f}, {s['ci_high']:.3f}]"

    lines = [f"# simpop eval: `{summary['policy']}` on `{summary['env']}`", "",
             f"Panel `{summary['panel']}`, seed {summary['seed']}, "
             + (f"{summary['num_trials']} trial(s) of every task" if summary["num_trials"]
                else f"{summary['episodes_per_member']} episode(s) per member")
             + f". Success with Wilson {int(CI_LEVEL * 100)}% intervals.", "",
             "## Panel card", ""]
    check = summary.get("heldout_check")
    if check:
        alike = check["look_alikes"]
        lines += [f"Held out from the training simulators of `{check['run']}` "
                  + ("(strict: every axis differs)." if check["strict"] else
                     "(no member is a training simulator; what a member shares with one is named)."), "",
                  "| member | spec | shared with training |", "|---|---|---|"]
        lines += [f"| {m} | `{s['spec']}` | {'; '.join(alike.get(m, [])) or '-'} |"
                  for m, s in summary["members"].items()]
    else:
        lines += ["| member | spec |", "|---|---|"]
        lines += [f"| {m} | `{s['spec']}` |" for m, s in summary["members"].items()]
    lines += ["", "## Success", "",
              "| member | episodes | successes | success | 95% CI | errors | invalid actions | mean reward | entropy |",
              "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    rows = [*summary["members"].items(), ("**all**", summary)]
    for m, s in rows:
        lines.append(f"| {m} | {s['episodes']} | {s['successes']} | {pct(s['success'])} | {ci(s)} | {s['errors']} | "
                     f"{s['invalid_actions']} | {pct(s['mean_reward'])} | {pct(s['entropy'])} |")
    tau2 = summary.get("tau2")
    if tau2:
        lines += ["", "## τ² pass^k", ""]
        if tau2.get("pass_hat_k"):
            ks = list(tau2["pass_hat_k"])
            lines += ["| member | " + " | ".join(f"pass^{k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
            for m, values in tau2.get("pass_hat_k_per_member", {}).items():
                lines.append(f"| {m} | " + " | ".join(pct(values.get(k)) for k in ks) + " |")
            lines.append("| **all** | " + " | ".join(pct(tau2["pass_hat_k"][k]) for k in ks) + " |")
        for key in ("note", "error", "results_error"):
            if tau2.get(key):
                lines.append(f"\n{tau2[key]}")
    lines += ["", "## Per task", "", "| task | episodes | successes | success | 95% CI |", "|---|---:|---:|---:|---|"]
    lines += [f"| {t} | {s['episodes']} | {s['successes']} | {pct(s['success'])} | {ci(s)} |"
              for t, s in summary["tasks"].items()]
    lines += ["", f"![success per member]({CHART})", ""]
    return "\n".join(lines)


def plot_success(summary: Mapping[str, Any], path: str | Path) -> Path:
    """A bar per member (and overall) with its Wilson interval as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [*summary["members"].items(), ("all", summary)]
    names = [m for m, _ in rows]
    values = [s["success"] if s["success"] is not None else 0.0 for _, s in rows]
    low = [v - s["ci_low"] if s["ci_low"] is not None else 0.0 for v, (_, s) in zip(values, rows)]
    high = [s["ci_high"] - v if s["ci_high"] is not None else 0.0 for v, (_, s) in zip(values, rows)]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(rows) + 1.5), 3.6))
    colors = ["tab:blue"] * (len(rows) - 1) + ["tab:gray"]
    ax.bar(range(len(rows)), values, yerr=[low, high], capsize=4, color=colors)
    ax.set_xticks(range(len(rows)), names, rotation=30, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"success ({int(CI_LEVEL * 100)}% Wilson CI)")
    ax.set_title(f"{summary['policy']} on {summary['env']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


# ---------------------------------------------------------------------------------------------- compare
def compare_evaluations(a: str | Path, b: str | Path, *, resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Paired differences ``B - A`` of mean success per (member, task), with bootstrap 95% intervals.

    Each pair is one (member, task) present in both folders (its success averaged over that folder's trials or
    repeats). Overall and per member: the mean of the pair differences and a percentile bootstrap interval
    (``resamples`` resamples of the pairs, a generator seeded with ``seed``); per task: the difference
    averaged over members.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    means = []
    for folder in (a, b):
        path = Path(folder) / EPISODES
        if not path.is_file():
            raise FileNotFoundError(f"{folder} is not a simpop eval folder (no {EPISODES})")
        cells: dict[tuple[str, str], list[float]] = {}
        for r in read_records(path):
            cells.setdefault((r.member, r.scenario), []).append(float(bool(r.success)))
        means.append({k: float(np.mean(v)) for k, v in cells.items()})
    mean_a, mean_b = means
    pairs = sorted(set(mean_a) & set(mean_b))
    if not pairs:
        raise ValueError(f"{a} and {b} share no (member, task) pair; compare evaluations of the same panel and env")
    rng = np.random.default_rng(seed)

    def stat(keys: list[tuple[str, str]]) -> dict[str, Any]:
        d = np.array([mean_b[k] - mean_a[k] for k in keys])
        boot = d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
        lo, hi = np.quantile(boot, [(1 - CI_LEVEL) / 2, (1 + CI_LEVEL) / 2])
        return {"pairs": len(keys), "a": float(np.mean([mean_a[k] for k in keys])),
                "b": float(np.mean([mean_b[k] for k in keys])), "diff": float(d.mean()),
                "ci_low": float(lo), "ci_high": float(hi)}

    members = sorted({m for m, _ in pairs})
    tasks = sorted({t for _, t in pairs})
    return {"a": str(a), "b": str(b), "direction": "B - A", "resamples": resamples, "seed": seed,
            "unpaired": {"a_only": len(set(mean_a) - set(mean_b)), "b_only": len(set(mean_b) - set(mean_a))},
            "overall": stat(pairs), "members": {m: stat([p for p in pairs if p[0] == m]) for m in members},
            "tasks": {t: {"pairs": len(ks), "diff": float(np.mean([mean_b[k] - mean_a[k] for k in ks]))}
                      for t in tasks if (ks := [p for p in pairs if p[1] == t])}}


def compare_table(result: Mapping[str, Any], max_tasks: int = 20) -> str:
    """The comparison as markdown: per member and overall, then the tasks that changed most."""
    lines = [f"B - A: B = `{result['b']}`, A = `{result['a']}` (bootstrap {int(CI_LEVEL * 100)}% CI over "
             f"(member, task) pairs, {result['resamples']} resamples)", "",
             "| member | pairs | success A | success B | B - A | 95% CI |", "|---|---:|---:|---:|---:|---|"]
    for m, s in [*result["members"].items(), ("**all**", result["overall"])]:
        lines.append(f"| {m} | {s['pairs']} | {s['a']:.3f} | {s['b']:.3f} | {s['diff']:+.3f} | "
                     f"[{s['ci_low']:+.3f}, {s['ci_high']:+.3f}] |")
    changed = sorted(((t, s) for t, s in result["tasks"].items() if s["diff"] != 0), key=lambda x: -abs(x[1]["diff"]))
    if changed:
        lines += ["", f"Tasks that changed most (of {len(changed)} changed, {len(result['tasks'])} in all; mean over "
                      f"members):", "", "| task | pairs | B - A |", "|---|---:|---:|"]
        lines += [f"| {t} | {s['pairs']} | {s['diff']:+.3f} |" for t, s in changed[:max_tasks]]
    unpaired = result["unpaired"]
    if unpaired["a_only"] or unpaired["b_only"]:
        lines += ["", f"Unpaired (left out): {unpaired['a_only']} in A only, {unpaired['b_only']} in B only."]
    return "\n".join(lines) + "\n"
