"""The frozen LLM simulator: a persona prompt, a backend and fixed decoding settings.

The system prompt is the scenario's own ``user_instructions()`` (so the simulator is benchmark-agnostic);
the chat is the user seat's view of the dialogue from the env's JSON text observation (the simulator's
own turns are ``assistant``). Greedy decoding is the default: it is the mode-collapsed baseline that
single-simulator RL overfits to.

Each :meth:`LLMSimulator.act_batch` makes one backend call for all given slots. The call's seed is
drawn from the slots' random generators, so a run with the same seeds is reproducible (a slot's
sample also depends on which slots share its call, because the backend samples a batch with one
generator). Greedy calls send each distinct chat once.

Empty or whitespace-only replies (a known failure of greedy user models, e.g. in τ²) are replaced by
:data:`FALLBACK_REPLY` and counted in ``stats["empty_replies"]``, so an episode never receives an
empty message.

**Closing surveys** (:class:`~simpop.seat.Survey`, e.g. P4G's donation question). The simulator is a
:class:`~simpop.seat.SurveyAnswerer`: :meth:`LLMSimulator.act_batch` answers survey observations with
:meth:`LLMSimulator.answer_survey` and the rest with :meth:`LLMSimulator.reply_batch`. The answer is a
constrained choice: each option is scored as the model's whole reply to the chat (persona + dialogue + the
question as a last user message), i.e. the summed log-probability of the option's tokens and the
template's end of turn (:meth:`LLMSimulator.option_logprobs`); greedy takes the argmax, sampling draws
from ``softmax(log-prob / temperature)`` with the slot's generator. Scoring needs an in-process model:
an HF model behind the backend (``backend.model``, e.g. ``TransformersBackend``: the chat is read once,
then every option in one batched pass over its KV cache) or a backend with ``encode_chat`` and
``token_logprobs`` (all chats' options in one call), or a backend with ``score_replies`` (an
OpenAI-compatible server that returns ``prompt_logprobs``: vLLM, ``simpop serve``). Otherwise (a server
without them raises :class:`~simpop.agents.base.ScoringUnsupported`) the question is asked and the free-text
reply is the answer, for the env to read (strictly, then leniently, else its counted fallback); such answers
are counted in ``stats["survey_unscored"]`` and logged (a warning the first time),
scoring errors in ``stats["survey_errors"]`` (the slot then answers in free text). A :class:`Trainable`
subclass answers by generation instead, so that its answer is a recorded turn that co-training scores.
Subclasses with another notion of their distribution (verbalized sampling) override
:meth:`LLMSimulator.survey_distribution`; :meth:`LLMSimulator.answer_survey` draws from it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from simpop.agents.base import Backend, Chat, SamplingParams, ScoringUnsupported
from simpop.envs.dialogue import parse_observation
from simpop.seat import (SCENARIO_PERSONAS, SURVEY_KEY, BuildContext, Simulator, SimulatorSpec, Survey, TextFormat,
                         Trainable, survey_of)

logger = logging.getLogger(__name__)

#: Sent instead of an empty reply: it keeps the dialogue going without deciding anything.
FALLBACK_REPLY = "Sorry, could you say that again?"


class DialogueFormat:
    """The default :class:`~simpop.seat.TextFormat`: the scenario's user instructions + the dialogue.

    A closing survey (``"survey"`` in the observation) is asked as a last user message: its question.
    """

    counters: tuple[str, ...] = ()

    def chat(self, observation: str, scenario: Any, instructions_suffix: str = "") -> Chat:
        """The simulator's chat: the scenario's user instructions as the system message, then the dialogue (and the
        env's error, if it rejected the last reply).
        """
        view = parse_observation(observation)
        chat: Chat = [{"role": "system", "content": scenario.user_instructions() + instructions_suffix}]
        chat += [{"role": m["role"], "content": m["content"]} for m in view["messages"]]
        if view.get("error"):
            # The env rejected our last message; say why so that the model can repair it.
            chat.append({"role": "user", "content": f"(Your last message was not accepted: {view['error']} "
                                                    f"Please answer again.)"})
        survey = view.get(SURVEY_KEY)
        if isinstance(survey, dict) and isinstance(survey.get("question"), str):
            chat.append({"role": "user", "content": survey["question"]})
        return chat

    def to_action(self, text: str, stats: dict[str, int]) -> str:
        """The action for a generated reply: the text itself."""
        return text


#: The survey counters every LLM simulator's ``stats`` holds (see :class:`LLMSimulator`).
SURVEY_COUNTERS = ("surveys", "survey_scored", "survey_unscored", "survey_errors")


def sampling(spec: SimulatorSpec) -> SamplingParams:
    """The sampling settings a spec's decoding names (temperature, top_p, max_new_tokens)."""
    d = dict(spec.decoding)
    return SamplingParams(max_new_tokens=d["max_new_tokens"], temperature=d["temperature"], top_p=d["top_p"])


def env_format(context: BuildContext) -> TextFormat | None:
    """The env's own :class:`~simpop.seat.TextFormat` (``env.text_format``), or None for the default."""
    return getattr(context.env, "text_format", None)


class LLMSimulator(Simulator):
    """A frozen LLM in the user seat.

    Args:
        backend: The model.
        params: Decoding settings (default: greedy, 64 new tokens). ``seed`` is ignored: each call's
            seed comes from the slots' generators.
        name: Name in logs and populations (default ``frozen:<backend name>``).
        personas: If given, each dialogue plays a persona drawn (with the slot's generator) from these
            instead of the scenario's own; the scenario must be a dataclass with a ``persona`` field.
        persona_set: The name of ``personas`` (part of :attr:`spec`; panels compare it).
        fallback_reply: Sent instead of an empty reply.
        text_format: How observations become chats and replies become actions (default
            :class:`DialogueFormat`; envs with their own expose ``env.text_format``).

    Attributes:
        stats: ``backend_calls``, ``replies``, ``empty_replies``, ``backend_errors`` (faulty backend answers:
            :meth:`raw_generate`) since construction; closing surveys:
            ``surveys`` answered, of which ``survey_scored`` (a constrained choice), ``survey_unscored`` (the
            backend cannot score: a free-text answer) and ``survey_errors`` (scoring failed: free text).
    """

    kind = "frozen"

    def __init__(self, backend: Backend, params: SamplingParams | None = None, *, name: str | None = None,
                 personas: Sequence[Any] | None = None, persona_set: str | None = None,
                 fallback_reply: str = FALLBACK_REPLY, text_format: TextFormat | None = None):
        if personas is not None and not personas:
            raise ValueError("personas is empty; pass None to play the scenario's own persona")
        if personas is not None and (persona_set is None or persona_set == SCENARIO_PERSONAS):
            raise ValueError("name the persona set you pass (persona_set=...), so panels can compare it")
        if not fallback_reply.strip():
            raise ValueError("fallback_reply must not be empty: it replaces empty replies")
        self.backend = backend
        self.params = dataclasses.replace(params or SamplingParams(max_new_tokens=64), seed=None)
        self.name = name or f"{self.kind}:{backend.name}"
        self.personas = list(personas) if personas is not None else None
        self.persona_set = persona_set or SCENARIO_PERSONAS
        self.fallback_reply = fallback_reply
        self.text_format = text_format or DialogueFormat()
        self.stats: dict[str, int] = {"backend_calls": 0, "replies": 0, "empty_replies": 0, "backend_errors": 0,
                                      **{name: 0 for name in self.text_format.counters},
                                      **{name: 0 for name in SURVEY_COUNTERS}}
        self._warned_unscored = False
        self._scenarios: list[Any] = []
        self._rngs: list[np.random.Generator] = []

    @classmethod
    def from_spec(cls, spec: SimulatorSpec, context: BuildContext) -> LLMSimulator:
        """Build from a parsed spec (see :func:`simpop.simulators.registry.build_simulator`)."""
        personas = context.personas(spec.personas)
        return cls(context.backend(spec.model), sampling(spec), personas=personas, persona_set=spec.personas,
                   text_format=env_format(context))

    @property
    def spec(self) -> SimulatorSpec:
        return SimulatorSpec(self.kind, self.backend.name, self.persona_set, self._decoding())

    def _decoding(self) -> dict[str, Any]:
        p = self.params
        return {"temperature": float(p.temperature), "top_p": float(p.top_p), "max_new_tokens": p.max_new_tokens}

    def snapshot(self) -> LLMSimulator:
        """A copy sharing the (frozen) backend, with its own slots and counters."""
        clone = copy.copy(self)
        clone.stats = {key: 0 for key in self.stats}
        clone._scenarios, clone._rngs = [], []
        return clone

    # ----------------------------------------------------------------- slots
    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        if len(scenarios) != len(rngs):
            raise ValueError(f"reset_batch got {len(scenarios)} scenarios but {len(rngs)} generators")
        self._rngs = list(rngs)
        self._scenarios = [self._with_persona(s, r) for s, r in zip(scenarios, rngs)]

    def _with_persona(self, scenario: Any, rng: np.random.Generator) -> Any:
        if self.personas is None:
            return scenario
        if (dataclasses.is_dataclass(scenario) and not isinstance(scenario, type)
                and "persona" in {f.name for f in dataclasses.fields(scenario)}):
            return dataclasses.replace(scenario, persona=self.personas[int(rng.integers(len(self.personas)))])
        raise TypeError(f"persona set {self.persona_set!r} needs scenarios that are dataclasses with a "
                        f"'persona' field; got {type(scenario).__name__}")

    def scenario(self, slot: int) -> Any:
        """The scenario slot ``slot`` plays (with the persona this simulator chose)."""
        return self._scenarios[slot]

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        """Survey observations answered by :meth:`answer_survey`, the others by :meth:`reply_batch`."""
        surveys = [survey_of(obs) for obs in observations]
        asked = [i for i, survey in enumerate(surveys) if survey is not None]
        if not asked or isinstance(self, Trainable):
            # A trainable simulator generates its answer (the chat ends with the question): a recorded turn.
            return self.reply_batch(observations, slots)
        actions: list[Any] = [None] * len(observations)
        answers = self.answer_survey([observations[i] for i in asked], [slots[i] for i in asked],
                                     [surveys[i] for i in asked])  # type: ignore[misc]
        for i, answer in zip(asked, answers, strict=True):
            actions[i] = answer
        rest = [i for i, survey in enumerate(surveys) if survey is None]
        if rest:
            for i, reply in zip(rest, self.reply_batch([observations[i] for i in rest], [slots[i] for i in rest]),
                                strict=True):
                actions[i] = reply
        return actions

    def reply_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        """Dialogue replies for the given slots, in one backend call."""
        chats = [self.chat(obs, slot) for obs, slot in zip(observations, slots)]
        return [self.text_format.to_action(text, self.stats) for text in self.generate(chats, slots, self.params)]

    # ----------------------------------------------------------------- closing surveys
    def survey_chat(self, observation: Any, slot: int, survey: Survey, instructions_suffix: str = "") -> Chat:
        """The chat that asks ``survey``: the slot's chat, ending with the question as a user message."""
        chat = self.chat(observation, slot, instructions_suffix)
        if chat[-1] != {"role": "user", "content": survey.question}:  # a text format that does not ask it
            chat.append({"role": "user", "content": survey.question})
        return chat

    def option_logprobs(self, observations: list[Any], slots: list[int],
                        surveys: list[Survey]) -> list[np.ndarray | None]:
        """Per slot, the log-probability of each option as the model's whole reply to :meth:`survey_chat`.

        None for every slot when the backend cannot score (counted in ``survey_unscored``) or the scoring call
        failed (counted in ``survey_errors``); both logged. Equal chats are scored once.
        """
        if not (surveys and _can_score(self.backend)):
            self.stats["survey_unscored"] += len(surveys)
            if surveys:
                logger.log(logging.DEBUG if self._warned_unscored else logging.WARNING,
                           "%s: backend %s cannot score survey options (no in-process model or token_logprobs); "
                           "the survey is answered in free text for the env to read (%d so far)", self.name,
                           type(getattr(self.backend, "__wrapped__", self.backend)).__name__, self.stats["survey_unscored"])
                self._warned_unscored = True
            return [None] * len(surveys)
        chats = [self.survey_chat(obs, slot, survey) for obs, slot, survey in zip(observations, slots, surveys)]
        keys = [json.dumps([chat, list(survey.options)]) for chat, survey in zip(chats, surveys)]
        unique = {key: (chat, survey.options) for key, chat, survey in zip(keys, chats, surveys)}
        try:
            scored = dict(zip(unique, _score_options(self.backend, list(unique.values()))))
        except ScoringUnsupported as error:  # e.g. a server without prompt_logprobs: said once, then counted
            self.stats["survey_unscored"] += len(surveys)
            logger.log(logging.DEBUG if self._warned_unscored else logging.WARNING,
                       "%s: %s; the survey is answered in free text for the env to read", self.name, error)
            self._warned_unscored = True
            return [None] * len(surveys)
        except Exception as error:  # noqa: BLE001 - a failed survey must not end the run: free text instead
            self.stats["survey_errors"] += len(surveys)
            logger.warning("%s: scoring the survey options failed (%s: %s); answering in free text",
                           self.name, type(error).__name__, error)
            return [None] * len(surveys)
        self.stats["survey_scored"] += len(surveys)
        return [scored[key] for key in keys]

    def survey_distribution(self, observations: list[Any], slots: list[int],
                            surveys: list[Survey]) -> list[list[float] | None]:
        """Per slot, the option probabilities: greedy one-hot on the argmax of :meth:`option_logprobs`,
        sampling ``softmax(log-prob / temperature)``; None where the options could not be scored."""
        return [None if lp is None else choice_probabilities(lp, self.params.temperature)
                for lp in self.option_logprobs(observations, slots, surveys)]

    def answer_survey(self, observations: list[Any], slots: list[int], surveys: list[Survey]) -> list[str]:
        """Per slot, an option drawn from :meth:`survey_distribution` with the slot's generator (a one-hot
        distribution draws nothing), or the model's free-text answer where the distribution is None."""
        answers: list[str | None] = []
        for slot, survey, probs in zip(slots, surveys, self.survey_distribution(observations, slots, surveys),
                                       strict=True):
            if probs is None:
                answers.append(None)
            elif max(probs) >= 1.0:
                answers.append(survey.options[int(np.argmax(probs))])
            else:
                answers.append(survey.options[int(self._rngs[slot].choice(len(probs), p=probs))])
        self.stats["surveys"] += len(answers)
        free = [i for i, answer in enumerate(answers) if answer is None]
        if free:
            chats = [self.survey_chat(observations[i], slots[i], surveys[i]) for i in free]
            for i, text in zip(free, self.generate(chats, [slots[i] for i in free], self.survey_params), strict=True):
                answers[i] = text
        return answers  # type: ignore[return-value]

    @property
    def survey_params(self) -> SamplingParams:
        """Decoding of a free-text survey answer (when no option could be scored): the replies' own."""
        return self.params

    # ----------------------------------------------------------------- helpers for subclasses
    def chat(self, observation: str, slot: int, instructions_suffix: str = "") -> Chat:
        """The chat for ``slot``'s observation (:attr:`text_format`; ``instructions_suffix`` ends the brief)."""
        if not 0 <= slot < len(self._scenarios):
            raise IndexError(f"slot {slot} was not started: reset_batch() started {len(self._scenarios)} slots")
        return self.text_format.chat(observation, self._scenarios[slot], instructions_suffix)

    def call_seed(self, slots: list[int]) -> int:
        """A seed for one backend call, drawn from the generators of the slots it serves."""
        draws = [int(self._rngs[s].integers(2**31)) for s in slots]
        return int(np.random.SeedSequence(draws).generate_state(1)[0] & 0x7FFFFFFF)

    def generate(self, chats: list[Chat], slots: list[int], params: SamplingParams) -> list[str]:
        """One backend call for ``chats`` (one per slot); empty replies replaced and counted."""
        if not chats:
            return []
        params = dataclasses.replace(params, seed=self.call_seed(slots))
        texts = self.raw_generate(chats, params)
        replies = []
        for text in texts:
            text = text.strip()
            if not text:
                self.stats["empty_replies"] += 1
                logger.debug("%s: empty reply replaced by %r", self.name, self.fallback_reply)
                text = self.fallback_reply
            replies.append(text)
        self.stats["replies"] += len(replies)
        return replies

    def raw_generate(self, chats: list[Chat], params: SamplingParams) -> list[str]:
        """The backend's texts for ``chats`` in one call; greedy calls send each distinct chat once.

        A faulty backend answer is repaired and counted in ``stats["backend_errors"]`` (logged): a generation
        whose text is not a string reads as empty (then replaced like any empty reply), missing generations
        read as empty, extra ones are dropped.
        """
        self.stats["backend_calls"] += 1
        if not params.greedy:
            return self._texts(self.backend.generate(chats, params), len(chats))
        keys = [json.dumps(c, sort_keys=True) for c in chats]
        unique = list(dict.fromkeys(keys))
        first = {key: chats[keys.index(key)] for key in unique}
        texts = dict(zip(unique, self._texts(self.backend.generate([first[k] for k in unique], params), len(unique))))
        return [texts[k] for k in keys]

    def _texts(self, generations: Any, expected: int) -> list[str]:
        """Exactly ``expected`` texts from a backend's ``generations`` (faults counted and logged)."""
        generations = list(generations or [])
        texts = [getattr(g, "text", None) for g in generations[:expected]]
        faults = [f"{sum(not isinstance(t, str) for t in texts)} generations without text"] if any(
            not isinstance(t, str) for t in texts) else []
        if len(generations) != expected:
            faults.append(f"{len(generations)} generations for {expected} chats")
        if faults:
            self.stats["backend_errors"] += 1
            logger.warning("%s: faulty backend answer from %s (%s); missing texts read as empty replies",
                           self.name, type(getattr(self.backend, "__wrapped__", self.backend)).__name__, "; ".join(faults))
        return [t if isinstance(t, str) else "" for t in texts] + [""] * (expected - len(texts))


# ---------------------------------------------------------------------------------------- option scoring
def _hf_model(backend: Any) -> Any:
    """The in-process HF causal LM behind ``backend`` (``backend.model`` with a ``config``), or None."""
    model = getattr(backend, "model", None)
    return model if callable(model) and hasattr(model, "config") and callable(getattr(backend, "encode_chat", None)) \
        else None


def _can_score(backend: Any) -> bool:
    return (_hf_model(backend) is not None or callable(getattr(backend, "score_replies", None))
            or (callable(getattr(backend, "encode_chat", None)) and callable(getattr(backend, "token_logprobs", None))))


def _continuations(backend: Any, chat: Chat, options: Sequence[str]) -> tuple[list[int], list[list[int]]]:
    """The chat's prompt ids and, per option, the ids the template adds for it as the assistant's reply."""
    prompt = backend.encode_chat(chat, add_generation_prompt=True)
    out = []
    for option in options:
        full = backend.encode_chat([*chat, {"role": "assistant", "content": option}], add_generation_prompt=False)
        if full[:len(prompt)] != prompt or len(full) == len(prompt):
            raise ValueError("the chat template does not render a reply as an extension of the prompt")
        out.append(full[len(prompt):])
    return prompt, out


def _score_options(backend: Any, items: list[tuple[Chat, Sequence[str]]]) -> list[np.ndarray]:
    """Per (chat, options), each option's summed log-probability as the whole assistant reply."""
    import torch

    model = _hf_model(backend)
    if model is None and callable(getattr(backend, "score_replies", None)):  # a server (OpenAIBackend)
        return [np.array(scores, dtype=float) for scores in backend.score_replies(items)]
    encoded = [_continuations(backend, chat, options) for chat, options in items]
    with torch.no_grad():
        if model is not None:
            return [_score_with_cache(model, backend, prompt, conts) for prompt, conts in encoded]
        rows = [(i, prompt + cont, [0] * len(prompt) + [1] * len(cont))
                for i, (prompt, conts) in enumerate(encoded) for cont in conts]
        scores = backend.token_logprobs([r[1] for r in rows], [r[2] for r in rows])
        totals = (torch.as_tensor(scores.logprobs) * torch.as_tensor(scores.mask)).sum(-1).float().cpu().numpy()
    out: list[list[float]] = [[] for _ in encoded]
    for (i, _, _), total in zip(rows, totals):
        out[i].append(float(total))
    return [np.array(x) for x in out]


def _score_with_cache(model: Any, backend: Any, prompt: list[int], conts: list[list[int]]) -> np.ndarray:
    """Read ``prompt`` once, then score every continuation in one batched pass over its (repeated) KV cache."""
    import torch

    from simpop.agents.kv_buffer import cache_argument

    device = next(model.parameters()).device
    cache_arg = cache_argument(model)
    out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True, logits_to_keep=1)
    first = out.logits[0, -1].float().log_softmax(-1)
    cache = getattr(out, cache_arg)
    cache.batch_repeat_interleave(len(conts))
    width, n = max(map(len, conts)), len(prompt)
    pad = getattr(backend, "pad_token_id", 0) or 0
    ids = torch.full((len(conts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(conts), n + width), dtype=torch.long)
    mask[:, :n] = 1
    for row, cont in enumerate(conts):
        ids[row, :len(cont)] = torch.tensor(cont)
        mask[row, n:n + len(cont)] = 1
    positions = torch.arange(n, n + width).expand(len(conts), width)
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                   use_cache=False, **{cache_arg: cache}).logits.float().log_softmax(-1)
    totals = []
    for row, cont in enumerate(conts):
        later = logits[row, torch.arange(len(cont) - 1), torch.tensor(cont[1:], dtype=torch.long)]
        totals.append(float(first[cont[0]] + later.sum()))
    return np.array(totals)


def choice_probabilities(logprobs: np.ndarray, temperature: float) -> list[float]:
    """Greedy (temperature 0): one-hot on the first argmax; else ``softmax(logprobs / temperature)``."""
    logprobs = np.asarray(logprobs, dtype=float)
    if temperature == 0 or not np.isfinite(logprobs).any():
        probs = np.zeros(len(logprobs))
        probs[int(np.argmax(np.where(np.isfinite(logprobs), logprobs, -np.inf)))] = 1.0
        return [float(p) for p in probs]
    z = np.where(np.isfinite(logprobs), logprobs / temperature, -np.inf)
    z = np.exp(z - z.max())
    return [float(p) for p in z / z.sum()]
