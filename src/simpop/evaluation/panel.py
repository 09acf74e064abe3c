"""Evaluate a policy on simulators: success per held-out panel member and overall, and policy entropy.

:func:`evaluate` runs ``episodes`` dialogues of the policy against each simulator (a panel member, or
the training simulator) with the :class:`~simpop.rollout.RolloutEngine`, sampling the policy as
it is trained. The same ``seed`` gives every call the same scenarios and env seeds, so conditions and
evaluation points are compared on common random numbers.

Policy entropy is measured on the policy's own decisions in those dialogues by the policy itself
(:class:`~simpop.agents.policy.Policy`): act level, the entropy of its action distribution at each
decision; text level, the mean per-token entropy of its generated tokens. Both are in nats; a policy
without an ``entropy`` method (a remote model, a scripted agent) reports nan.

Every dialogue is also kept as an :class:`EpisodeRecord` (member, scenario, seed, reward, success, the
transcript as ``{seat, text}`` turns, ...), and success rates come with Wilson score 95% intervals
(:func:`~simpop.evaluation.metrics.wilson_ci`), which stay within [0, 1]. ``simpop eval``
(:mod:`simpop.evaluation.eval_run`) writes these records to ``episodes.jsonl``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from simpop.evaluation.metrics import wilson_ci
from simpop.rollout import RolloutEngine, Trajectory
from simpop.seat import Simulator
from simpop.simulators.population import Panel


@dataclass
class EvalResult:
    """Success against each simulator and overall, and the policy's entropy.

    Attributes:
        success: Mean success over all dialogues (every member weighs the same: equal episode counts).
        per_member: Success per simulator name.
        entropy: Mean policy entropy (nats) over its decisions in all dialogues.
        episodes: Dialogues run in total.
        ci: Wilson 95% interval of ``success``.
        per_member_ci: Wilson 95% interval of each member's success.
        outcomes: Every dialogue's success, member by member (the order of ``records``).
        records: Every dialogue, member by member (not compared by ``==``); empty when
            :func:`evaluate` was asked for none.
    """

    success: float
    per_member: dict[str, float] = field(default_factory=dict)
    entropy: float = math.nan
    episodes: int = 0
    ci: tuple[float, float] = (math.nan, math.nan)
    per_member_ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    outcomes: list[bool] = field(default_factory=list)
    records: list[EpisodeRecord] = field(default_factory=list, compare=False, repr=False)


def policy_entropy(policy: Any, trajectories: list[Trajectory]) -> float:
    """Mean entropy of ``policy`` at its own decisions in ``trajectories`` (its ``entropy`` method; nan if it
    has none, e.g. a remote or scripted policy)."""
    entropy = getattr(policy, "entropy", None)
    return float(entropy(trajectories)) if callable(entropy) else math.nan


def evaluate(env_id: str, policy: Any, simulators: Panel | Mapping[str, Simulator] | Simulator, episodes: int,
             seed: int = 0, env_kwargs: dict[str, Any] | None = None, *, pool: EnvPool | None = None,
             records: bool = True) -> EvalResult:
    """Run ``episodes`` dialogues against each simulator and summarise them.

    Args:
        env_id: The registered env.
        policy: The policy (act or text); it is sampled, not made greedy.
        simulators: A :class:`Panel`, a name -> simulator mapping, or one simulator.
        episodes: Dialogues per simulator (distinct scenarios while the env has enough).
        seed: Seeds scenario choice, env resets and the policy's sampling (same seed, same dialogues).
        env_kwargs: Env constructor arguments.
        pool: Envs of ``env_id`` (with ``env_kwargs``) to run in, kept by a caller that evaluates again and again
            (every dialogue resets its env, so results are the same as with fresh envs); None: fresh envs.
        records: Keep an :class:`EpisodeRecord` (transcript included) per dialogue; False keeps only the
            outcomes, for callers that read nothing else.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    members = (dict(simulators.members) if isinstance(simulators, Panel)
               else dict(simulators) if isinstance(simulators, Mapping) else {simulators.name: simulators})
    if pool is None:
        from simpop.envs.registration import make

        pool = EnvPool(lambda: make(env_id, **(env_kwargs or {})))
    result = EvalResult(math.nan)
    everything: list[Trajectory] = []
    for name, simulator in members.items():
        engine = RolloutEngine(pool.factory(), policy, simulator)
        trajectories = engine.collect(episodes, group_size=1, seed=seed)
        outcomes = [bool(t.success) for t in trajectories]
        result.per_member[name] = float(np.mean(outcomes))
        result.per_member_ci[name] = wilson_ci(sum(outcomes), len(outcomes))[1:]
        result.outcomes += outcomes
        if records:
            seen: dict[str, int] = {}  # a scenario drawn again (more episodes than scenarios) is its next trial
            for i, t in enumerate(trajectories):
                result.records.append(episode_record(t, pool.envs[i], member=name, index=i,
                                                     trial=seen.get(t.scenario_id, 0)))
                seen[t.scenario_id] = seen.get(t.scenario_id, 0) + 1
        everything += trajectories
    result.success, result.episodes = float(np.mean(result.outcomes)), len(result.outcomes)
    result.ci = wilson_ci(sum(result.outcomes), result.episodes)[1:]
    result.entropy = policy_entropy(policy, everything)
    return result


# ---------------------------------------------------------------------------------------------- per episode
@dataclass
class EpisodeRecord:
    """One finished (or failed) dialogue of an evaluation, as written to ``episodes.jsonl``.

    Attributes:
        member: The panel member (simulator name) that played the user seat.
        scenario: The scenario (task) id.
        trial: Which trial of this scenario for this member (0, 1, ... with ``--num-trials``; repeats of a
            scenario drawn more than once otherwise).
        index: Position of the episode in the member's plan (the order of an uninterrupted run).
        seed: The env reset seed.
        reward: The policy seat's return (0 for a failed episode).
        success: The env's ``info["success"]`` at the end, else ``reward > 0`` (False for a failed episode).
        turns: Accepted turns in the transcript (both seats).
        policy_turns: Actions the policy took, rejected ones included.
        invalid_actions: Policy actions the env rejected (garbage, wrong format, ...).
        terminated: The task ended (vs. truncated by the turn cap).
        truncated: The turn cap ended the dialogue.
        transcript: The accepted turns, ``[{"seat": ..., "text": ...}]``.
        simulator: The concrete simulator that drove the dialogue (a member of a population member).
        error: ``"ExceptionType: message"`` when the policy or simulator raised; the episode then counts
            as a failure.
        entropy: The policy's mean entropy (nats) at its decisions in this dialogue; None if it cannot say.
        entropy_weight: What ``entropy`` is a mean over (act level: decisions; text: generated tokens).
        info: The env's final info for the policy seat (JSON-safe).
        extra: Benchmark data (τ²: the trajectory as τ² messages and its reward info).
    """

    member: str
    scenario: str
    trial: int
    index: int
    seed: int
    reward: float = 0.0
    success: bool = False
    turns: int = 0
    policy_turns: int = 0
    invalid_actions: int = 0
    terminated: bool = False
    truncated: bool = False
    transcript: list[dict[str, str]] = field(default_factory=list)
    simulator: str = ""
    error: str | None = None
    entropy: float | None = None
    entropy_weight: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, int]:
        """``(member, scenario, trial)``: what identifies an episode across a resumed run."""
        return self.member, self.scenario, self.trial

    def to_json(self) -> str:
        """The record as one JSON line (keys sorted; numpy values made plain)."""
        return json.dumps(asdict(self), ensure_ascii=False, sort_keys=True, default=_json_default)

    @classmethod
    def from_json(cls, line: str) -> EpisodeRecord:
        """A record from one JSON line (unknown keys are ignored, for files written by newer versions).

        Raises:
            ValueError: The line is not a JSON object.
        """
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("an episode record is a JSON object")
        known = {f for f in cls.__dataclass_fields__}
        record = cls(**{k: v for k, v in data.items() if k in known})
        for name, kinds in _FIELD_TYPES.items():
            value = getattr(record, name)
            if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
                raise ValueError(f"an episode record's {name} must be {kinds[0].__name__}, got {value!r}"[:200])
        return record


#: What :meth:`EpisodeRecord.from_json` checks a record's fields against (a record a summary can count).
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "member": (str,), "scenario": (str,), "trial": (int,), "index": (int,), "seed": (int,),
    "reward": (float, int), "success": (bool,), "turns": (int,), "policy_turns": (int,), "invalid_actions": (int,),
    "terminated": (bool,), "truncated": (bool,), "transcript": (list,), "simulator": (str,),
    "error": (str, type(None)), "entropy": (float, int, type(None)), "entropy_weight": (int,), "info": (dict,),
    "extra": (dict,),
}


def transcript_of(env: Any) -> list[dict[str, str]]:
    """The env's transcript as ``[{"seat", "text"}]`` (accepted turns, in order)."""
    return [{"seat": str(t.seat), "text": str(t.text)} for t in getattr(env, "transcript", [])]


def episode_record(trajectory: Trajectory, env: Any, *, member: str, index: int, trial: int,
                   entropy: float | None = None, entropy_weight: int = 0) -> EpisodeRecord:
    """The record of a finished dialogue; ``env`` is the env that ran it (its transcript is read)."""
    info = trajectory.infos[-1] if trajectory.infos else {}
    # The env flags a rejected action in the acting seat's info only: these infos are the policy seat's.
    invalid = sum("invalid_action" in i for i in trajectory.infos)
    return EpisodeRecord(member=member, scenario=trajectory.scenario_id, trial=trial, index=index,
                         seed=int(trajectory.seed), reward=float(trajectory.total_reward),
                         success=bool(trajectory.success), turns=len(getattr(env, "transcript", [])),
                         policy_turns=trajectory.policy_turns, invalid_actions=int(invalid),
                         terminated=trajectory.terminated, truncated=trajectory.truncated,
                         transcript=transcript_of(env), simulator=trajectory.simulator,
                         entropy=entropy, entropy_weight=int(entropy_weight), info=json_safe(info))


def json_safe(value: Any) -> Any:
    """``value`` with everything JSON cannot hold turned into plain values (numpy) or strings."""
    return json.loads(json.dumps(value, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


# ---------------------------------------------------------------------------------------------- env pool
class EnvPool:
    """Envs shared by rollout engines, so that the caller can read each dialogue's env after a wave.

    A :class:`~simpop.rollout.RolloutEngine` built with ``pool.factory()`` runs the ``i``-th dialogue of a
    wave in ``pool.envs[i]`` (the engine asks its env factory for envs in slot order).

    Args:
        make_env: Builds one env.
    """

    def __init__(self, make_env: Callable[[], Any]):
        self.make_env = make_env
        self.envs: list[Any] = []

    def take(self, n: int) -> list[Any]:
        """The first ``n`` envs (built as needed)."""
        while len(self.envs) < n:
            self.envs.append(self.make_env())
        return self.envs[:n]

    def factory(self) -> Callable[[], Any]:
        """An env factory for one engine: its ``k``-th call returns ``envs[k]``."""
        calls = iter(range(1 << 62))
        return lambda: self.take(next(calls) + 1)[-1]
