"""Persuasion for Good (P4G) — donation persuasion dialogues (Wang et al., ACL 2019).

**The task.** Two crowd workers chat. The *persuader* tries to convince the *persuadee* to donate part
of their $2 task payment ($0–$2) to Save the Children. In the corpus (1,017 dialogues, ≈10 turns each)
53.6% of persuadees donated; the mean donation was $0.35 ($0.65 among donors; 57 gave the full $2).

**Envs** (:mod:`.env`, registered in :mod:`simpop.envs`; both share scenarios, seats and outcome):

- ``simpop/Persuasion-v1`` (text): actions are messages of 1–``max_message_chars`` (1000) characters;
  observations are JSON text (``DialogueEnv.text_observation``) with an extra ``instructions`` field: the
  persuader's task, or the persuadee's role prompt with its persona (never shown to the persuader). An
  undecided dialogue ends with the closing survey (below). ``simpop/Persuasion-v0`` is the same env without
  the survey (``survey=False``: an undecided dialogue is truncated with reward 0), kept so that earlier
  text-level numbers stay reproducible; the survey changes rewards, hence the new version.
- ``simpop/PersuasionAct-v0`` (acts): the persuader acts with ``Discrete(14)`` and observes
  ``Box(0, 1, (40,))`` (last persuadee act one-hot, its own act counts / max_turns, turn fraction, to-act
  flag; the persona is hidden); the persuadee acts with ``Discrete(23 · 7)`` (act × amount level) and
  observes ``Box(0, 1, (31,))`` (the same with the last persuader act).

Seats: ``persuader`` (the policy; speaks first) and ``persuadee`` (the user seat). The single-agent view
``gymnasium.make(id)`` puts the native simulator in the user seat; Stable-Baselines3 PPO trains on the
act level unmodified.

**Acts** (:mod:`.acts`). Persuader: the 10 P4G strategies (logical-, emotion-, credibility-appeal,
foot-in-the-door, self-modeling, personal-story, donation-information, source-, task-, personal-related
inquiry) + proposition-of-donation, ask-donation-amount, greeting, closing. Persuadee: the 23 annotated
acts (ask-org-info, ask-donation-procedure, ask-persuader-donation-intention, agree-donation,
disagree-donation, disagree-donation-more, provide-donation-amount, confirm-donation, positive/neutral/
negative reaction to donation, positive/neutral/negative to inquiry, task-/personal-related inquiry,
greeting, thank, acknowledgement, closing, you-are-welcome, off-task, other). ``classify_persuader``
maps free text to a persuader act by keyword rules; ``render_persuader`` / ``render_persuadee`` realise
acts with several phrasings each (act-level transcripts, the text simulator, the demo).

**Outcome** (:mod:`.outcome`). Every persuadee message is read with ``parse_donation``: a ``[DONATE $N]``
tag decides (last wins), else natural pledges (*I'll give 50 cents*, *a dollar fifty*, *all of it*) or
refusals (*no thanks, I'll pass* = $0); amounts clamp to [0, 2]; no decision → None. The first stated
decision **terminates** the episode: reward 1 to the persuader if the amount is > 0, else 0 (the persuadee
seat's reward is 0). ``max_turns`` (default 10) exchanges = ``2 · max_turns`` steps (rejected actions count)
without one end the dialogue: the text env asks the **closing survey**, whose answer is the outcome; the act
env (and ``Persuasion-v0``) **truncates** with reward 0. ``info`` carries ``donation`` (amount or None),
``donated`` and ``outcome_source``: ``"decided_in_dialogue"``, ``"survey"``, or None (no outcome yet, or
truncated). At the act level, agree-donation / provide-donation-amount / confirm-donation donate their
amount, disagree-donation(-more) states $0.

**Closing survey** (text level; :class:`~.env.PersuasionEnv`, :func:`~.outcome.read_survey_answer`). In P4G the
recorded outcome is the donation each persuadee entered in a survey *after* the chat, not a sentence inside
it; an LLM persuadee (SmolLM2 always) may chat to the turn cap without stating a readable decision, which
scored every such dialogue 0. So after ``2 · max_turns`` undecided steps the persuadee acts once more
(``max_steps = 2 · max_turns + 1``; ``info["phase"] == "survey"``): its observation (only its own: the
persuader never sees the survey) carries ``"survey": {"question", "options"}`` (:data:`~.outcome.SURVEY`: "how
much of your $2 task payment do you donate to Save the Children?", options ``I donate nothing`` and one per
:data:`~.model.AMOUNT_LEVELS` amount, ``I donate $0.05`` … ``I donate $2.00``: the decision comes first, so that
an LLM's probability of giving nothing is not split among the labels that share ``$0.``). The answer is text
naming an option, read strictly (an option label, or an amount equal to one: ``$0.50``, ``0.5``, ``50 cents``),
then leniently
(:func:`parse_donation`, ``nothing``, or the one dollar amount the text names, moved to the nearest option of
the same sign), else it falls back to $0 (empty, not text, off the $0–$2 scale, nothing readable): the episode
still terminates, ``info["survey_fallback"]`` is True with ``survey_reason``, the env counts it in
``survey_counts`` and logs it (a warning the first time). The answer is never rejected and is not added to
the transcript. Outcome info also has ``survey_answer`` (the option), ``survey_parse`` (strict | lenient |
fallback) and ``survey_reply`` (the raw answer). Who answers how: the native :class:`~.simulators.TextPersuadee`
from its model's decision in its current state (what it would decide if asked now; greedy: the mode); LLM
simulators as a constrained choice over the options' log-probabilities (:mod:`simpop.simulators.llm`; a
backend that cannot score answers in free text, counted in ``survey_unscored``). The protocol is
:class:`simpop.seat.SurveyAnswerer`.

**Why the act level has no survey.** At the act level the donation question is an action of the persuader
(proposition-of-donation, ask-donation-amount) and the persuadee answers every ask with a decision, so what
the survey repairs at the text level, a persuadee whose decision cannot be read, cannot happen there. The one
case the two levels score differently is a persuader that never asks: the text level asks the survey, the act
level truncates with reward 0. The corpus does not settle that case (P4G persuaders ask; the calibration's
reference persuader always asks, and the persuadee model was fitted to answer an ask, not to decide unasked),
while every act-level result (the calibration targets, the collapse experiment, its panels and checkpoints)
is defined by the act level's reward. So the act level keeps its semantics and its id
(``simpop/PersuasionAct-v0``). The levels stay consistent where the corpus speaks: the same decision rule
ends both (a stated decision terminates; reward 1 iff > $0), and the native text persuadee answers the survey
with exactly the distribution with which the act persuadee answers an ask in the same state (tested), so a
persuader that asks gets the same outcome distribution at both levels.

**Scenarios** (:mod:`.scenario`). ``scenario_ids()`` are ``p4g-0000`` … ``p4g-0199``: personas drawn from
:class:`PersonaSampler` with a fixed seed (``n_scenarios``, ``scenario_seed``), or with ``corpus_dir=``
one per corpus dialogue (``p4g-corpus-<id>``, the real persuadee's persona). A
:class:`PersuasionScenario` has ``id``, ``persona``, ``context`` (the $2 donation task) and the prompts
``user_instructions()`` (persona, context, and "end with ``[DONATE $N]``") and ``policy_instructions()``.
``persona_set(name)`` gives the named persona sets of simulator specs (``modal``, ``heldout-<n>-<seed>``,
``uniform-<n>-<seed>``, ``corpus:<dir>``).

**Personas and calibration** (:mod:`.personas`, :mod:`.model`). A :class:`Persona` holds the 32 P4G survey
attributes (Big-Five 1–5, moral foundations 1–6, Schwartz values 1–6, decision style 1–5, demographics
with income 1–12). :class:`PersonaSampler` draws them from documented marginals (a table in its
docstring); ``modal_persona()`` is every attribute's mode. The native persuadee
(:class:`PersuadeeModel`) keeps a donation inclination (log-odds) that each persuader act moves with
persona-dependent effects (emotion-appeal scaled by care/agreeableness/intuition, logical-appeal by
rationality/conscientiousness, credibility by respect for authority; repeats give diminishing then
negative returns; asking before any appeal hurts; inquiries build rapport that amplifies appeals). When
asked, it donates with probability sigmoid(inclination), an amount from seven levels ($0.05–$2). Every
parameter lives in :class:`PersuadeeParams` (also a flat vector: ``to_vector``/``from_vector``/``bounds``
for gradient or ES training). ``calibrate`` sets the intercept and amount shift so that a corpus-like
``reference_persuader`` (greeting, strategies at corpus frequencies, a proposition after 5–9 turns)
gets a 53.6% donor rate and a $0.35 mean donation; the defaults are calibrated (tests check both).

**Simulators** (:mod:`.simulators`). ``ActPersuadee`` (act level; a ``DistributionalSimulator``) and
``TextPersuadee`` (text: classify the message, answer with the model, realise the reply; decisions are natural
phrasings without a tag; the closing survey from the model's decision distribution). Decoding ``"sample"``
(with ``temperature``) or ``"greedy"`` (every argmax, donate iff p > 0.5, canonical phrasing);
``ActPersuadee(decoding="greedy", persona_override=modal_persona())`` is the mode-collapsed frozen simulator
of the collapse experiment. Their trainable form, ``TrainableActPersuadee`` (``trainable:persuadee``), is in
:mod:`.trainable`.

**Corpus** (:mod:`.corpus`). ``load_corpus(dir)`` reads the real files: ``full_dialog.csv`` (``Unit``,
``Turn``, ``B4`` role 0 = persuader / 1 = persuadee, ``B2`` dialogue id), ``full_info.csv`` (``B2``, ``B3``,
``B4``, ``B6`` actual donation, ``B7`` turns, and the 32 persona columns, named as the ``Persona`` fields
or with the real file's ``.x`` suffix), and when present ``300_dialog.xlsx`` (adds ``er_label_1``,
``ee_label_1``, ``er_label_2``, ``ee_label_2``, sentiment) and ``300_info.xlsx`` (adds ``B5`` intended
donation; needs ``openpyxl``). ``fit_params(corpus)`` fits response-act tables, strategy effects and the
amount distribution and recalibrates to the corpus. Missing or malformed files raise ``CorpusError``
naming the file, column and row. The corpus is not shipped.

**Demo.** ``simpop demo [--episodes N] [--seed S] [--level text|act]`` prints dialogues between the
reference persuader and the native persuadee.
"""

from simpop.envs.persuasion.env import PersuasionActEnv, PersuasionEnv
from simpop.envs.persuasion.model import PersuadeeModel, PersuadeeParams, calibrate
from simpop.envs.persuasion.outcome import SURVEY, parse_donation, read_survey_answer
from simpop.envs.persuasion.personas import Persona, PersonaSampler, modal_persona
from simpop.envs.persuasion.scenario import PersuasionScenario

__all__ = ["SURVEY", "Persona", "PersonaSampler", "PersuadeeModel", "PersuadeeParams", "PersuasionActEnv",
           "PersuasionEnv", "PersuasionScenario", "calibrate", "modal_persona", "parse_donation", "read_survey_answer"]
