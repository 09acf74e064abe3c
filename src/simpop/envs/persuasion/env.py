"""The two P4G envs: free text (``simpop/Persuasion-v1``) and dialogue acts (``simpop/PersuasionAct-v0``).

Both share scenarios (personas + the $2 donation context, from :mod:`.scenario`), seats (``persuader``
= policy, speaks first; ``persuadee`` = user) and the outcome: the episode terminates when the persuadee
states a decision (reward 1 to the persuader if the amount is > 0, else 0). After ``max_turns``
persuader–persuadee exchanges without one (``2 · max_turns`` steps; rejected actions count) the text env
asks the persuadee the closing survey (:data:`~.outcome.SURVEY`, one more persuadee step whose answer is the
outcome: :func:`~.outcome.read_survey_answer`); the act env (and the text env with ``survey=False``, the
``simpop/Persuasion-v0`` behaviour) truncates with reward 0. The package docstring explains the choice.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from simpop.envs.dialogue import NOT_UNICODE, DialogueEnv, Outcome, TextSpace, Turn, is_unicode
from simpop.envs.persuasion.act_wave import DONE, ActWave, why_invalid
from simpop.envs.persuasion.acts import (DONATING_ACTS, PERSUADEE_ACTS, PERSUADER_ACTS, classify_persuader,
                                         render_persuadee, render_persuader)
from simpop.envs.persuasion.codec import N_AMOUNTS, PERSUADEE_OBS_DIM, PERSUADER_OBS_DIM, decode_persuadee_action
from simpop.envs.persuasion.outcome import SURVEY, SurveyAnswer, parse_donation, read_survey_answer
from simpop.envs.persuasion.personas import Persona
from simpop.envs.persuasion.scenario import PersuasionScenario, corpus_scenarios, default_scenarios, persona_set
from simpop.seat import SURVEY_KEY

#: Most persuader turns of a dialogue.
MAX_TURNS = 1000

logger = logging.getLogger(__name__)

#: Where an episode's outcome came from (``info["outcome_source"]``; None while there is none).
DECIDED_IN_DIALOGUE, FROM_SURVEY = "decided_in_dialogue", "survey"

class _PersuasionEnv(DialogueEnv):
    """Shared scenarios, seats and outcome of the two P4G envs."""

    policy_seat = "persuader"
    user_seat = "persuadee"
    first_seat = "persuader"

    #: Whether a dialogue that reaches the turn cap undecided ends with the closing survey.
    survey: bool = False

    def __init__(self, max_turns: int = 10, n_scenarios: int = 200, scenario_seed: int = 2019,
                 corpus_dir: str | Path | None = None, render_mode: str | None = None):
        if not 1 <= max_turns <= MAX_TURNS:
            raise ValueError(f"max_turns must be from 1 to {MAX_TURNS}, got {max_turns}")
        if corpus_dir is None and n_scenarios < 1:
            raise ValueError(f"n_scenarios must be >= 1, got {n_scenarios}")
        self.max_turns = max_turns
        scenarios = (corpus_scenarios(str(Path(corpus_dir).resolve())) if corpus_dir is not None
                     else default_scenarios(n_scenarios, scenario_seed))
        self._scenarios = {s.id: s for s in scenarios}
        self.donation: float | None = None
        self.outcome_source: str | None = None
        #: Steps of the dialogue proper; the survey, when asked, is one more.
        self.dialogue_steps = 2 * max_turns
        super().__init__(max_steps=self.dialogue_steps + int(self.survey), render_mode=render_mode)

    def scenario_ids(self) -> list[str]:
        return list(self._scenarios)

    def persona_set(self, name: str) -> tuple[Persona, ...]:
        """Named persona sets for simulator specs (``personas=NAME``).

        - ``modal``: the persona sampler's modal persona alone (the mode-collapsed population).
        - ``heldout`` = ``heldout-300-4242``; ``heldout-<n>-<seed>``: ``n`` draws from the persona sampler with
          ``seed``, minus every persona of this env's scenarios and the modal persona (people training never sees).
        - ``uniform-<n>-<seed>``: the same with every attribute uniform over its values
          (:meth:`PersonaSampler.uniform`; the robustness panel's people, more of them at the extremes).
        - ``human-<n>-<seed>``: ``n`` draws from the shipped fit's marginals of the real P4G persuadees
          (:func:`.release.human_sampler`, no corpus needed), minus this env's scenario personas.
        - ``corpus:<dir>``: the persuadees of the P4G corpus in folder ``dir`` (:mod:`.corpus`), training's or not.
        - ``region-<n>-<seed>:<clauses>``, ``written-<sha>``: generated from lost dialogues (:mod:`.failures`).
        """
        return persona_set(name, tuple(s.persona for s in self._scenarios.values()))

    def load_scenario(self, scenario_id: str) -> PersuasionScenario:
        return self._scenarios[scenario_id]

    def _start(self) -> None:
        self.donation = None
        self.outcome_source = None

    def _outcome(self) -> Outcome | None:
        if self.donation is None:
            return None
        donated = self.donation > 0
        return Outcome({self.policy_seat: float(donated), self.user_seat: 0.0},
                       {"donation": self.donation, "donated": donated, "outcome_source": self.outcome_source,
                        **self._outcome_extras()})

    def _outcome_extras(self) -> dict[str, Any]:
        """More outcome info (the text env's survey reading)."""
        return {}

    def _truncated_outcome(self) -> Outcome:
        return Outcome({a: 0.0 for a in self.possible_agents},
                       {"donation": None, "donated": False, "outcome_source": None})

    def _base_info(self, seat: str) -> dict[str, Any]:
        info = super()._base_info(seat)
        info.update(donation=self.donation, donated=bool(self.donation), outcome_source=self.outcome_source)
        return info

    def _decide(self, amount: float, source: str) -> None:
        self.donation, self.outcome_source = amount, source


class PersuasionEnv(_PersuasionEnv):
    """P4G with free-text messages.

    Observations are JSON text (:meth:`DialogueEnv.text_observation`) with an extra ``instructions``
    field: the persuader's task (never the persona) or the persuadee's role prompt with its persona.
    Actions are messages of 1..``max_message_chars`` characters. Each persuadee message is read with
    :func:`parse_donation`; the first stated decision ends the episode (``outcome_source =
    "decided_in_dialogue"``).

    **Closing survey.** When ``2 · max_turns`` steps pass without a decision, the persuadee acts once more
    (``info["phase"] == "survey"``): its observation carries ``"survey": {"question", "options"}``
    (:data:`~.outcome.SURVEY`; the persuader's does not), and its action, any text, is read by
    :func:`~.outcome.read_survey_answer` (never rejected; unreadable -> $0, ``info["survey_fallback"]``, counted in
    :attr:`survey_counts` and logged). The answer is the outcome (``outcome_source = "survey"``); it is
    not added to the transcript (P4G's persuader never saw the survey). Outcome info then also holds
    ``survey_answer`` (the option), ``survey_parse`` (strict | lenient | fallback), ``survey_fallback``,
    ``survey_reason`` and ``survey_reply`` (the answer as given, cut to 500 characters).

    Args:
        max_turns: Persuader–persuadee exchanges before the survey (or truncation).
        max_message_chars: Longest accepted message.
        n_scenarios: Size of the default persona set.
        scenario_seed: Seed of the default persona set.
        corpus_dir: Use the P4G corpus's persuadee personas instead (see ``corpus.py``).
        render_mode: ``"ansi"`` or ``"human"``.
        survey: Ask the closing survey (``simpop/Persuasion-v1``); False truncates undecided dialogues
            with reward 0 instead (``simpop/Persuasion-v0``).

    Attributes:
        survey_counts: Since construction: ``surveys`` asked, answers read ``strict``, ``lenient``, and
            ``fallback``.
    """

    metadata = {**DialogueEnv.metadata, "name": "persuasion_v1"}

    def __init__(self, max_turns: int = 10, max_message_chars: int = 1000, n_scenarios: int = 200,
                 scenario_seed: int = 2019, corpus_dir: str | Path | None = None, render_mode: str | None = None,
                 survey: bool = True):
        if max_message_chars < 1:
            raise ValueError(f"max_message_chars must be >= 1, got {max_message_chars}")
        self.max_message_chars = max_message_chars
        self.survey = bool(survey)
        self.survey_counts = {"surveys": 0, "strict": 0, "lenient": 0, "fallback": 0}
        self.phase = "dialogue"
        self.survey_answer: SurveyAnswer | None = None
        self._survey_reply = ""
        super().__init__(max_turns, n_scenarios, scenario_seed, corpus_dir, render_mode)

    def _start(self) -> None:
        super()._start()
        self.phase = "dialogue"
        self.survey_answer = None
        self._survey_reply = ""

    def _outcome(self) -> Outcome | None:
        # The base calls this after every step, before it builds the step's observations: the place to
        # turn an undecided dialogue at the turn cap into the survey turn.
        if (self.donation is None and self.survey and self.phase == "dialogue"
                and self.steps >= self.dialogue_steps):
            self.phase = "survey"
            self.to_act = self.user_seat
            self._errors.pop(self.user_seat, None)  # a rejected last message is not the survey's business
            self.survey_counts["surveys"] += 1
        return super()._outcome()

    def _outcome_extras(self) -> dict[str, Any]:
        answer = self.survey_answer
        return {"survey_answer": answer.option if answer else None, "survey_parse": answer.parse if answer else None,
                "survey_fallback": bool(answer and answer.parse == "fallback"),
                "survey_reason": answer.reason if answer else None,
                "survey_reply": self._survey_reply[:500] if answer else None}

    def _base_info(self, seat: str) -> dict[str, Any]:
        info = super()._base_info(seat)
        info["phase"] = self.phase
        return info

    def step(self, actions: dict[str, Any]):
        """The base's step, with the dialogue's phase (``dialogue`` or ``survey``) in every info."""
        observations, rewards, terminations, truncations, infos = super().step(actions)
        for info in infos.values():  # the phase after the step (the base's infos are begun before it)
            info["phase"] = self.phase
        return observations, rewards, terminations, truncations, infos

    def _make_spaces(self):
        # JSON escapes a control character as 6 characters; instructions take a few thousand.
        obs_limit = 20_000 + self.max_steps * (6 * self.max_message_chars + 64)
        obs = {a: TextSpace(obs_limit) for a in self.possible_agents}
        act = {a: TextSpace(self.max_message_chars, min_length=1) for a in self.possible_agents}
        return obs, act

    def _validate(self, seat: str, action: Any) -> str | None:
        if self.phase == "survey":
            return None  # every answer is read (read_survey_answer), falling back to $0 if need be
        if isinstance(action, str) and not is_unicode(action):
            return NOT_UNICODE
        if not isinstance(action, str):
            return f"action must be a str (the message), got {type(action).__name__}"
        if not action.strip():
            return "empty message: write something"
        if len(action) > self.max_message_chars:
            return f"message has {len(action)} characters; the limit is {self.max_message_chars}"
        return None

    def _apply(self, seat: str, action: str) -> str:
        if self.phase == "survey":
            self._answer_survey(action)
            return self.user_seat
        if seat == self.policy_seat:
            self.transcript.append(Turn(seat, action, act=classify_persuader(action)))
            return self.user_seat
        donation = parse_donation(action)
        self.transcript.append(Turn(seat, action, data={"donation": donation}))
        if donation is not None:
            self._decide(donation, DECIDED_IN_DIALOGUE)
        return self.policy_seat

    def _answer_survey(self, action: Any) -> None:
        if isinstance(action, str) and not is_unicode(action):  # kept in info: unpaired surrogates replaced
            action = action.encode("utf-8", "replace").decode("utf-8")
        answer = read_survey_answer(action)
        self.survey_answer, self._survey_reply = answer, action if isinstance(action, str) else repr(action)
        self.survey_counts[answer.parse] += 1
        if answer.parse == "fallback":
            n = self.survey_counts["fallback"]
            # The first fallback of an env is a warning; later ones are counted and logged quietly.
            logger.log(logging.WARNING if n == 1 else logging.DEBUG,
                       "P4G closing survey: %s in %.200r; recorded as $0 (fallback %d of %d surveys)",
                       answer.reason, self._survey_reply, n, self.survey_counts["surveys"])
        self._decide(answer.amount, FROM_SURVEY)

    def _observe(self, seat: str) -> str:
        instructions = (self.scenario.policy_instructions(self.max_turns) if seat == self.policy_seat
                        else self.scenario.user_instructions())
        if self.phase == "survey" and seat == self.user_seat and self.to_act == seat:
            return self.text_observation(seat, instructions=instructions, **{SURVEY_KEY: SURVEY.as_dict()})
        return self.text_observation(seat, instructions=instructions)

    def render(self) -> str | None:
        """The transcript, then the closing survey's answer if it was asked."""
        text = super().render()
        if text is None or self.survey_answer is None:
            return text
        return f"{text}\n[{self.user_seat}, closing survey] {self.survey_answer.option}".lstrip("\n")


# ---------------------------------------------------------------------------------------------- act level
class PersuasionActEnv(_PersuasionEnv):
    """P4G over dialogue acts: a fast, Box-observation view for RL (SB3 PPO trains on it unmodified).

    Persuader: ``Discrete(14)`` over :data:`PERSUADER_ACTS`; observation ``Box(0, 1, (40,))`` (see
    :data:`~.codec.PERSUADER_OBS_DIM`; the persona is hidden). Persuadee: ``Discrete(23 · 7)`` =
    :data:`PERSUADEE_ACTS` × :data:`~.model.AMOUNT_LEVELS` (the amount matters only for donating acts; see
    :func:`~.codec.encode_persuadee_action`); observation ``Box(0, 1, (31,))``. A donating act ends the episode
    with its amount, a refusing act with $0. Transcript turns hold the act name and a templated text.

    The dialogue's state is a row of an :class:`~.act_wave.ActWave` (a wave of its own, or the rollout engine's wave
    that plays it: :meth:`vector_wave`), and every accepted action is :meth:`ActWave.step` on that row.

    Args: as :class:`PersuasionEnv`, without ``max_message_chars``.
    """

    metadata = {**DialogueEnv.metadata, "name": "persuasion_act_v0"}
    _rendered: int  # steps of the dialogue's row already in the transcript

    def __init__(self, max_turns: int = 10, n_scenarios: int = 200, scenario_seed: int = 2019,
                 corpus_dir: str | Path | None = None, render_mode: str | None = None):
        super().__init__(max_turns, n_scenarios, scenario_seed, corpus_dir, render_mode)
        self._own = ActWave([self])
        self._wave, self._row = self._own, 0

    def _make_spaces(self):
        obs = {self.policy_seat: spaces.Box(0.0, 1.0, (PERSUADER_OBS_DIM,), np.float32),
               self.user_seat: spaces.Box(0.0, 1.0, (PERSUADEE_OBS_DIM,), np.float32)}
        act = {self.policy_seat: spaces.Discrete(len(PERSUADER_ACTS)),
               self.user_seat: spaces.Discrete(len(PERSUADEE_ACTS) * N_AMOUNTS)}
        return obs, act

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        self._wave, self._row = self._own, 0
        return super().reset(seed=seed, options=options)

    def vector_wave(self, envs: list[PersuasionActEnv]) -> ActWave:
        """A stepper that plays a wave of dialogues in ``envs`` (this env among them) as rows of one array state,
        with the same trajectories (:class:`~simpop.envs.persuasion.act_wave.ActWave`; the rollout engine uses it)."""
        return ActWave(envs)

    def play_in(self, wave: ActWave, row: int, seed: int, scenario_id: str) -> None:
        """Start the dialogue ``reset(seed=seed, options={"scenario_id": scenario_id})`` starts (the same draws), with
        its state in row ``row`` of ``wave``, which steps it (:meth:`ActWave.reset`)."""
        if scenario_id not in self._scenarios:
            self.reset(seed=seed, options={"scenario_id": scenario_id})  # raises the env's own KeyError
        self._wave, self._row = wave, row
        self.np_random = np.random.default_rng(seed)
        self._begin(self._scenarios[scenario_id])

    def sync(self) -> None:
        """Take the dialogue's progress (steps, whose turn, the last rejection, the decision) from the row of the wave
        that stepped it (:meth:`ActWave.finish`)."""
        wave, row = self._wave, self._row
        self.steps, to_act = int(wave.steps[row]), int(wave.to_act[row])
        self.to_act = None if to_act == DONE else self.possible_agents[to_act]
        if to_act == DONE:
            self.agents = []
        self._errors = wave.last_error(row)
        if wave.terminated[row]:
            self._decide(float(wave.donation[row]), DECIDED_IN_DIALOGUE)

    def _start(self) -> None:
        super()._start()
        # Phrasings come from the reset seed too, so transcripts are reproducible.
        self._text_seed = int(self.np_random.integers(2**63 - 1))
        self._text_rng: np.random.Generator | None = None
        self._wave.start(self._row)

    @property
    def transcript(self) -> list[Turn]:
        """The accepted turns, rendered as text when first read (training never reads them), with the episode's
        phrasing generator (so the text does not depend on when it is read)."""
        pending = self._wave.accepted(self._row, self._rendered)
        if pending:
            if self._text_rng is None:
                self._text_rng = np.random.default_rng(self._text_seed)
            self._rendered = int(self._wave.steps[self._row])
            for seat, action in pending:
                if seat == self.policy_seat:
                    act = PERSUADER_ACTS[action]
                    self._transcript.append(Turn(seat, render_persuader(act, self._text_rng), act=act))
                else:
                    act, amount = decode_persuadee_action(action)
                    text = render_persuadee(act, amount if act in DONATING_ACTS else None, self._text_rng)
                    self._transcript.append(Turn(seat, text, act=act, data={"donation": amount}))
        return self._transcript

    @transcript.setter
    def transcript(self, turns: list[Turn]) -> None:
        self._transcript = turns
        self._rendered = 0

    def _validate(self, seat: str, action: Any) -> str | None:
        space = self.action_space(seat)
        assert isinstance(space, spaces.Discrete)  # built in _make_spaces
        return why_invalid(action, space)

    def _apply(self, seat: str, action: Any) -> str:
        row = self._row
        self._wave.step(np.array([row]), self.possible_agents.index(seat), [int(action)])
        if self._wave.terminated[row]:  # a donating act or a refusal
            self._decide(float(self._wave.donation[row]), DECIDED_IN_DIALOGUE)
        return self.user_seat if seat == self.policy_seat else self.policy_seat

    def _observe(self, seat: str) -> np.ndarray:
        out = self._wave.observation(np.array([self._row]), self.possible_agents.index(seat))[0]
        out[-1] = self.to_act == seat  # None once the episode is over
        return out
