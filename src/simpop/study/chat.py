"""One study chat: a person in the user seat, a blinded policy in the other, run by the rollout engine.

A :class:`Chat` runs its dialogue in a background thread through :class:`~simpop.rollout.RolloutEngine` (the
engine of training and ``simpop eval``) with a :class:`~simpop.study.human.HumanSeat` in the user seat, so the
env steps and scores the dialogue exactly as in training (P4G: a stated decision, else the closing survey the
person answers; τ²: τ²'s evaluator). Web requests read the person's view (:meth:`Chat.view`), send messages
(:meth:`Chat.send`) and wait for the policy's reply. The finished dialogue is an
:class:`~simpop.evaluation.panel.EpisodeRecord`, as ``simpop eval`` writes it, with the study's data under
``extra["study"]``: participant, policy label and spec, ratings, timings.

**What the policy is told.** Only what the env shows its seat, unless the study shows it the participant's
questionnaire (``questionnaire_to_policy``): then the chat's policy reads the answers (:func:`~.modes.briefing`)
after its instructions, the observation field every text policy takes its task from (a :class:`TextPolicy`'s
system message, a token policy's ``system_prompt``). :func:`reads_instructions` says which policies can.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, UTC
from typing import Any

import numpy as np

from simpop.agents.policy import TokenPolicy
from simpop.envs.dialogue import parse_observation
from simpop.evaluation.panel import EpisodeRecord, episode_record, transcript_of
from simpop.rollout import Job, RolloutEngine
from simpop.seat import survey_of
from simpop.study import modes
from simpop.study.human import Abandoned, HumanSeat

log = logging.getLogger(__name__)

#: ``EpisodeRecord.error`` prefix of a chat the person left (excluded from success and ratings in reports).
ABANDONED = "Abandoned"


@dataclass
class Arm:
    """One policy of the study, known to the person only as "the agent".

    Attributes:
        label: The researcher's name for it (``A``, ``B``, ...), revealed only in the results.
        spec: Its policy spec (:mod:`simpop.evaluation.policies`).
        policy: The loaded policy; each chat plays a shallow copy (dialogue-aware policies keep per-dialogue
            state, the model is shared).
        lock: One policy call at a time: chats share the arm's model (re-entrant: a token policy's ``act_batch``
            calls its own ``generate_ids``).
    """

    label: str
    spec: str
    policy: Any
    lock: threading.RLock = field(default_factory=threading.RLock)


def _chat_policy(arm: Arm, briefing: str | None = None) -> Any:
    """The arm's policy for one chat: a shallow copy (dialogue-aware policies keep per-wave state; the model is
    shared) whose model calls (``act_batch``, ``generate_ids``) hold the arm's lock, since chats run in threads,
    and which reads ``briefing`` after its instructions (module docstring)."""
    policy = copy.copy(arm.policy)
    for name in ("act_batch", "generate_ids"):
        method = getattr(policy, name, None)
        if callable(method):
            setattr(policy, name, _holding(arm.lock, method))
    if briefing is not None:
        copied: Any = policy  # this chat's copy: its methods may be replaced
        if isinstance(policy, TokenPolicy):  # its act_batch reads the system prompt from the observation
            system_prompt = policy.system_prompt
            copied.system_prompt = lambda observation: system_prompt(_briefed(observation, briefing))
        else:
            act_batch = policy.act_batch
            copied.act_batch = lambda observations, *rest: act_batch(
                [json.dumps(_briefed(parse_observation(o), briefing), ensure_ascii=False) for o in observations], *rest)
    return policy


def _briefed(view: dict[str, Any], briefing: str) -> dict[str, Any]:
    """A parsed text observation with ``briefing`` after its instructions."""
    return {**view, "instructions": "\n\n".join(filter(None, [view.get("instructions"), briefing]))}


def reads_instructions(policy: Any, env: Any) -> bool:
    """Whether ``policy`` takes its task from the observation's instructions, where the study's briefing goes: a
    token policy whose system prompt is the observation's (not a fixed one), or a :class:`TextPolicy` on an env
    without its own text format. Act-level, reference and other ``module:attr`` policies do not."""
    from simpop.evaluation.policies import TextPolicy

    if isinstance(policy, TokenPolicy):
        probe = "(instructions)"
        return probe in (policy.system_prompt({"instructions": probe, "messages": []}) or "")
    return isinstance(policy, TextPolicy) and getattr(env, "text_format", None) is None


def _holding(lock: threading.RLock, method: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return method(*args, **kwargs)

    return call


def key_digest(key: str) -> str:
    """What the study keeps of a participant's key (in memory and in the records): its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()


def now() -> str:
    """The time now, UTC, to the second (ISO 8601)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


class Chat:
    """One participant's dialogue with one arm (see the module docstring).

    Args:
        chat_id: Unguessable id (the capability the page uses for this chat).
        participant: The pseudonymous participant id (the record's ``member``).
        key: The participant's secret key (their capability; the record keeps its SHA-256 only).
        participant_index: The participant's join order (derives the assignment).
        number: Which of the participant's chats this is (0, 1, ...; the record's ``trial``).
        index: The chat's position among all the study's chats (the record's ``index``).
        arm: The blinded policy.
        scenario: The scenario id.
        seed: The env reset seed.
        make_env: Builds the env.
        idle_timeout_s: How long the seat waits for the person before the chat is abandoned.
        bonus: Self mode (:mod:`.modes`): the person's own bonus, shown on the card instead of the persona; None
            in persona mode.
        briefing: What the policy reads of the participant after its instructions (None: nothing).

    Attributes:
        over_bonus: Messages refused because they pledged more than the bonus (self mode).
    """

    def __init__(self, *, chat_id: str, participant: str, key: str, participant_index: int, number: int, index: int,
                 arm: Arm, scenario: str, seed: int, make_env: Callable[[], Any], idle_timeout_s: float,
                 bonus: float | None = None, briefing: str | None = None):
        self.id, self.participant, self.key, self.participant_index = chat_id, participant, key, participant_index
        self.number, self.index, self.arm, self.scenario, self.seed = number, index, arm, scenario, seed
        self.bonus, self.briefing, self.over_bonus = bonus, briefing, 0
        self.seat = HumanSeat(idle_timeout_s)
        self.env = make_env()
        self.record: EpisodeRecord | None = None
        self.saved = False
        self.timings: dict[str, Any] = {"joined": now()}
        self._ended_at: float | None = None
        self._thread = threading.Thread(target=self._run, name=f"study-chat-{index}", daemon=True)

    # ----------------------------------------------------------------- the dialogue thread
    def start(self) -> None:
        """Start the chat's dialogue thread (it waits for the participant at each user turn)."""
        self._thread.start()

    def _run(self) -> None:
        policy = _chat_policy(self.arm, self.briefing)
        engine = RolloutEngine(lambda: self.env, policy, self.seat, n_envs=1)
        started = time.monotonic()
        try:
            (trajectory,) = engine.run([Job(self.scenario, 0, self.seed)], np.random.default_rng(self.seed))
            record = episode_record(trajectory, self.env, member=self.participant, index=self.index,
                                    trial=self.number)
        except Exception as error:
            abandoned = isinstance(error, Abandoned)
            if not abandoned:
                log.warning("chat %d (%s) failed: %s: %s", self.index, self.arm.label, type(error).__name__, error)
            transcript = transcript_of(self.env)
            record = EpisodeRecord(member=self.participant, scenario=self.scenario, trial=self.number,
                                   index=self.index, seed=self.seed, transcript=transcript, turns=len(transcript),
                                   error=f"{ABANDONED if abandoned else type(error).__name__}: {error}",
                                   policy_turns=sum(t["seat"] == self.env.policy_seat for t in transcript))
        record.simulator = self.seat.name
        self.timings.update(ended=now(), chat_s=round(time.monotonic() - started, 3),
                            policy_s=round(engine.stats.policy_s, 3), human_s=round(sum(self.seat.turn_s), 3),
                            human_turn_s=[round(s, 3) for s in self.seat.turn_s])
        self._ended_at = time.monotonic()
        self.record = record
        self.seat.notify()

    # ----------------------------------------------------------------- what requests do
    @property
    def done(self) -> bool:
        return self.record is not None

    @property
    def abandoned(self) -> bool:
        return self.record is not None and (self.record.error or "").startswith(ABANDONED)

    def ended_for(self) -> float:
        """Seconds since the dialogue ended (0 while it runs)."""
        return 0.0 if self._ended_at is None else time.monotonic() - self._ended_at

    def ready(self, after: int = -1) -> bool:
        """Whether the person is asked (for the ``after``-th time or later) or the dialogue has ended."""
        return self.done or (self.seat.observation is not None and self.seat.asks > after)

    def wait_turn(self, timeout_s: float, after: int = -1) -> bool:
        """Wait (blocking this thread) until :meth:`ready`; False on timeout."""
        return self.seat.wait(lambda: self.ready(after), timeout_s)

    def post(self, text: str) -> int:
        """Hand the person's message (or survey answer) to the dialogue; returns the turn count to wait past.

        Raises:
            RuntimeError: It is not the person's turn (or the chat is over).
            ValueError: Self mode: the message pledges more than the person's bonus (counted in :attr:`over_bonus`).
        """
        if self.done:
            raise RuntimeError("this chat is over")
        observation = self.seat.observation
        if self.bonus is not None and isinstance(observation, str):
            refused = modes.over_bonus(text, self.bonus, survey=survey_of(observation) is not None)
            if refused:
                self.over_bonus += 1
                raise ValueError(refused)
        asked = self.seat.asks
        self.seat.reply(text)
        return asked

    def send(self, text: str, timeout_s: float) -> None:
        """:meth:`post`, then wait up to ``timeout_s`` for the person's next turn or the end."""
        self.wait_turn(timeout_s, after=self.post(text))

    def close(self, timeout_s: float = 5.0) -> None:
        """End the dialogue now (a pending turn is abandoned) and wait for its record."""
        self.seat.close()
        self._thread.join(timeout_s)

    def view(self) -> dict[str, Any]:
        """What the person sees: the brief, the messages, whose turn it is, a survey, the last error.

        Never the policy's label, spec, reward or the env's info.
        """
        observation = self.seat.observation
        if isinstance(observation, str):
            parsed = json.loads(observation)
            survey = survey_of(observation)
            messages = parsed.get("messages", [])
            turn, error = "you", parsed.get("error")
            instructions = parsed.get("instructions") or ""
            if self.bonus is not None:
                instructions = modes.self_card(self.bonus)
                if survey is not None:
                    survey = modes.self_survey(survey, self.bonus)
        else:
            survey, error = None, None
            messages = self.env.chat_view(self.env.user_seat) if self.env.scenario is not None else []
            turn = "done" if self.done else "agent"
            instructions = self._instructions()
        return {"chat": self.id, "number": self.number, "turn": turn, "instructions": instructions,
                "messages": [{"from": _speaker(m.get("role")), "text": str(m.get("content", ""))} for m in messages],
                "survey": survey.as_dict() if survey is not None else None, "error": error,
                "abandoned": self.abandoned, "rated": self.saved}

    def _instructions(self) -> str:
        if self.bonus is not None:
            return modes.self_card(self.bonus)
        scenario = self.env.scenario
        return scenario.user_instructions() if scenario is not None else ""

    def finish(self, ratings: dict[str, Any] | None) -> EpisodeRecord:
        """The finished record with the study's data (``extra["study"]``); ``ratings`` None when not given."""
        if self.record is None:
            raise RuntimeError("the chat is still running")
        self.timings.setdefault("rated", now() if ratings is not None else None)
        self.record.extra["study"] = {"participant": self.participant, "participant_index": self.participant_index,
                                      "key_sha256": key_digest(self.key),
                                      "chat": self.number, "policy": self.arm.label, "policy_spec": self.arm.spec,
                                      "ratings": ratings, "timings": self.timings, "effort": self._effort(),
                                      "briefed": self.briefing is not None}
        return self.record

    def _effort(self) -> dict[str, Any]:
        """The person's effort in this chat: messages, their lengths, seconds spent typing (self mode: pledges
        above the bonus they restated)."""
        lengths = [len(t["text"]) for t in (self.record.transcript if self.record else [])
                   if t["seat"] == self.env.user_seat]
        return {"messages": len(lengths), "chars": sum(lengths),
                "mean_chars": round(sum(lengths) / len(lengths), 1) if lengths else 0.0,
                "human_s": round(sum(self.seat.turn_s), 3),
                **({"over_bonus": self.over_bonus} if self.bonus is not None else {})}


def _speaker(role: Any) -> str:
    """Who wrote a message of the user seat's chat view: the person's own turns are ``assistant``."""
    return {"assistant": "you", "tool": "tool"}.get(str(role), "agent")
