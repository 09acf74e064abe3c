"""The verbalized-sampling simulator: the model states a distribution over its next replies.

Instead of sampling one reply (which a mode-collapsed model answers the same way every time), the
simulator asks the backend for ``k`` candidate replies with probabilities, as JSON, with the prompt of
the Verbalized Sampling paper's dialogue simulation (Zhang et al. 2025, arXiv:2510.01171: the persona and
scenario, then "generate k responses ... with their probabilities, as JSON"; :data:`VERBALIZED_INSTRUCTIONS`)::

    {"responses": [{"text": "...", "probability": 0.4}, ...]}

By default (``constrained=True``) the request carries :func:`verbalized_schema` as
``SamplingParams.json_schema``: an in-process model decodes under it (llguidance) and an
OpenAI-compatible server receives it as ``response_format``, so even a 135M model answers with exactly
``k`` well-formed candidates. The answer is parsed by :func:`parse_verbalized` either way: it reads
constrained output with no format repair and is the robust path for backends without structured output
(``constrained=False`` sends the same prompt without the schema). The candidates are renormalised with a
probability floor and a temperature (:func:`renormalise`: ``p ∝ max(p, floor) ** (1 / tau)``) and one is
sampled with the slot's generator. When the answer is unusable (nothing parses into a non-empty reply),
the slot falls back to ordinary sampling from the backend (``fallback_temperature``, default 1) with the
plain persona prompt; fallbacks are counted in ``stats["fallbacks"]`` out of ``stats["calls"]``
(:attr:`VerbalizedSimulator.fallback_rate`).

A closing survey (:class:`~simpop.seat.Survey`) is answered the same way: the model states a distribution
over the survey's options (constrained: each candidate text is an option), renormalised with the same floor
and temperature, and the answer is drawn from it (:meth:`VerbalizedSimulator.survey_distribution`), so even
a simulator that is greedy in its wording does not answer every survey the same way.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import logging
import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simpop.agents.base import Backend, SamplingParams
from simpop.seat import BuildContext, DistributionalSimulator, Simulator, SimulatorSpec, Survey, choice_rows
from simpop.simulators.llm import FALLBACK_REPLY, LLMSimulator, choice_probabilities, env_format, sampling
from simpop.simulators.registry import inner_or_none

logger = logging.getLogger(__name__)

#: Appended to the scenario's user instructions (the persona and the scenario); ``{k}`` is the number
#: of candidates, ``{max_chars}`` the longest text (:func:`text_budget`). The Verbalized Sampling paper's
#: request for dialogue simulation (k responses coherent with the history and the persona, with their
#: probabilities, as JSON with key "responses" holding "text" and "probability"). No example answer:
#: SmolLM2 copies example texts verbatim.
VERBALIZED_INSTRUCTIONS = """

Generate {k} different responses to your chat partner's last message that are coherent with the chat \
history and true to who you are, as different from each other as the replies of different real people \
would be. Output JSON with the key "responses": a list of {k} objects, each with "text" (the whole message \
you would send, at most {max_chars} characters) and "probability" (how likely you would be to send it, from \
0 to 1; the {k} probabilities sum to 1). Output only the JSON object, no other text."""

#: The closing survey's verbalized request (:meth:`VerbalizedSimulator.survey_distribution`): ``{k}``
#: answers among the listed options, with probabilities, as the same JSON.
VERBALIZED_SURVEY_INSTRUCTIONS = """

When you are asked the closing question, state how likely you are to give each answer. Output JSON with the \
key "responses": a list of {k} objects, each with "text" (one of the answers: {options}) and "probability" \
(how likely you are to give that answer, from 0 to 1; the probabilities sum to 1). Output only the JSON \
object, no other text."""

#: Repairs that fix the *format* of an answer (as opposed to normalising its content: ``rescaled``
#: probabilities that did not sum to one, ``merged_duplicates``). Constrained output needs none.
FORMAT_REPAIRS = ("code_fence", "surrounding_text", "relaxed_syntax", "salvaged_objects", "dropped_items",
                  "imputed_probabilities", "truncated_to_k")

#: A candidate text: printable ASCII but ``"`` and ``\\`` (which JSON escapes with a second character),
#: starting and ending with a visible character. Each character of such text is one character of the
#: JSON and every token of it carries at least one, so ``maxLength`` bounds the text's tokens too (emoji
#: runs, several tokens per character, exhausted SmolLM2's budget at temperature 0.7); no text is blank.
TEXT_PATTERN = r"^[!#-\[\]-~]([ !#-\[\]-~]*[!#-\[\]-~])?$"


def verbalized_schema(k: int, max_chars: int, choices: Sequence[str] | None = None) -> dict[str, Any]:
    """The JSON schema of a verbalized answer: exactly ``k`` ``{"text", "probability"}`` objects, each
    text 1 to ``max_chars`` characters of :data:`TEXT_PATTERN` (or, given ``choices``, one of them), each
    probability a number in [0, 1] with at most two decimals (a small model otherwise spends its budget on
    digits)."""
    if k < 1 or max_chars < 1:
        raise ValueError(f"k and max_chars must be >= 1, got {k} and {max_chars}")
    text = ({"type": "string", "enum": list(choices)} if choices else
            {"type": "string", "minLength": 1, "maxLength": max_chars, "pattern": TEXT_PATTERN})
    candidate = {
        "type": "object",
        "properties": {
            "text": text,
            "probability": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.01},
        },
        "required": ["text", "probability"],
        "additionalProperties": False,
    }
    return {"title": "verbalized_responses", "type": "object",
            "properties": {"responses": {"type": "array", "items": candidate, "minItems": k, "maxItems": k}},
            "required": ["responses"], "additionalProperties": False}


#: Tokens of a candidate's JSON besides its text (``{"text": "``, ``", "probability": 0.25}, ``), of the
#: answer's frame (``{"responses": [``, ``]}``), and characters per text token assumed by :func:`text_budget`.
_ITEM_TOKENS, _FRAME_TOKENS, _CHARS_PER_TOKEN = 14, 8, 3


def text_budget(max_new_tokens: int, k: int) -> int:
    """The longest candidate text (characters) that lets ``k`` candidates fit in ``max_new_tokens``.

    Assumes 3 characters per token (SmolLM2 writes English chat at 3.5 to 5), so a constrained answer
    normally ends within the budget; one that does not is cut, and its complete candidates are salvaged
    (a counted ``salvaged_objects`` repair). Since a token of :data:`TEXT_PATTERN` text carries at least
    one character, the budget is also capped so that the first candidate always completes
    (``max_chars + 22 <= max_new_tokens``): constrained output then always parses. 256 tokens and k=5
    give 105 characters. At least 16 (budgets under 38 tokens lose that guarantee).
    """
    per_item = (max_new_tokens - _FRAME_TOKENS) // k - _ITEM_TOKENS
    return max(16, min(_CHARS_PER_TOKEN * per_item, max_new_tokens - _FRAME_TOKENS - _ITEM_TOKENS))


_TEXT_KEYS = ("text", "response", "reply", "content", "message", "utterance")
_PROB_KEYS = ("probability", "prob", "p", "confidence", "likelihood", "weight")
_FENCE = re.compile(r"```[a-zA-Z]*\s*(.*?)(?:```|$)", re.S)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_FLAT_OBJECT = re.compile(r"\{[^{}]*\}")


@dataclass
class ParseResult:
    """A parsed verbalized answer.

    Attributes:
        candidates: ``(text, probability)`` pairs, texts non-empty and distinct, probabilities the
            stated ones normalised to sum to one (empty when :attr:`error` is set).
        error: Why nothing usable was found, or None.
        repairs: What had to be fixed, with counts (``code_fence``, ``surrounding_text``, ``relaxed_syntax``,
            ``salvaged_objects``, ``dropped_items``, ``imputed_probabilities``, ``merged_duplicates``,
            ``truncated_to_k``, ``rescaled``).
    """

    candidates: list[tuple[str, float]] = field(default_factory=list)
    error: str | None = None
    repairs: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def format_repairs(self) -> int:
        """How many :data:`FORMAT_REPAIRS` the answer needed (0 for well-formed JSON)."""
        return sum(self.repairs.get(key, 0) for key in FORMAT_REPAIRS)


def parse_verbalized(text: str, k: int) -> ParseResult:
    """Parse a model's verbalized distribution; never raises on any input string.

    Accepted, in order of preference: JSON; the same inside a code fence or surrounded by prose;
    Python-literal syntax (single quotes, trailing commas, True/None); the complete ``{...}`` objects of
    a truncated answer. The candidate list is the ``responses`` value, else the first list value of
    the object, else a bare list. Items may be objects (text under ``text``/``response``/``reply``/...,
    probability under ``probability``/``prob``/``p``/...) or bare strings.

    Fixes: items whose text is missing, not a string or blank are dropped; a probability that is
    missing, non-numeric, negative, NaN or infinite is imputed as the mean of the valid ones (uniform
    when none is valid or all are zero); ``"30%"`` is 0.3; duplicates (same text up to whitespace and
    case) are merged by adding their probabilities; more than ``k`` candidates keep the ``k`` most
    probable, in the model's order (fewer than ``k`` are kept as they are); probabilities are
    normalised to sum to one.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    repairs: dict[str, int] = {}
    if not isinstance(text, str):
        return ParseResult(error=f"expected text, got {type(text).__name__}")
    items = _items(_load(text, repairs))
    if items is None:
        items = _salvage(text, repairs)
    if not items:
        return ParseResult(error="no candidate list found" if items is None else "empty candidate list",
                           repairs=repairs)

    pairs: list[tuple[str, float | None]] = []
    for item in items:
        pair = _item(item)
        if pair is None:
            _bump(repairs, "dropped_items")
        else:
            pairs.append(pair)
    if not pairs:
        return ParseResult(error="no candidate has a non-empty text", repairs=repairs)

    valid = [p for _, p in pairs if p is not None]
    missing = len(pairs) - len(valid)
    if missing:
        _bump(repairs, "imputed_probabilities", missing)
    scale = max(valid, default=0.0)
    if scale == 0.0:  # no usable probability: every candidate equally likely
        probs = [1.0] * len(pairs)
    else:
        # Divide by the largest first so that huge stated values cannot overflow the sum.
        scaled = [p / scale for p in valid]
        mean = sum(scaled) / len(scaled)
        probs = [p / scale if p is not None else mean for _, p in pairs]

    merged: dict[str, list[Any]] = {}
    for (candidate, _), p in zip(pairs, probs):
        key = _key(candidate)
        if key in merged:
            merged[key][1] += p
            _bump(repairs, "merged_duplicates")
        else:
            merged[key] = [candidate.strip(), p]
    ranked = list(merged.values())
    if len(ranked) > k:
        _bump(repairs, "truncated_to_k", len(ranked) - k)
        keep = sorted(sorted(range(len(ranked)), key=lambda i: -ranked[i][1])[:k])  # ties: the earlier one
        ranked = [ranked[i] for i in keep]
    total = sum(p for _, p in ranked)
    if total == 0.0:
        ranked = [[c, 1.0] for c, _ in ranked]
        total = float(len(ranked))
    stated = sum(valid)
    if not missing and not math.isclose(stated, 1.0, abs_tol=0.01):
        _bump(repairs, "rescaled")
    return ParseResult([(c, p / total) for c, p in ranked], None, repairs)


def renormalise(probabilities: Sequence[float], floor: float, tau: float) -> list[float]:
    """``p ∝ max(p, floor) ** (1 / tau)``, computed in log space so small ``tau`` cannot underflow.

    Args:
        probabilities: Non-negative, not all zero (they are normalised first).
        floor: Minimum probability before tempering, in [0, 1): keeps unlikely candidates alive.
        tau: Temperature > 0: 1 keeps the stated shape, < 1 sharpens it, > 1 flattens it.
    """
    return [float(x) for x in renormalise_rows(np.asarray([probabilities], dtype=float), floor, tau)[0]]


def renormalise_rows(probabilities: np.ndarray, floor: float, tau: float) -> np.ndarray:
    """:func:`renormalise` of each row of ``probabilities`` ``[n, k]``, elementwise the same operations."""
    if not 0 <= floor < 1:
        raise ValueError(f"floor must be in [0, 1), got {floor}")
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    p = np.asarray(probabilities, dtype=float)
    if p.size == 0 or (p < 0).any() or not np.isfinite(p).all() or (p.sum(axis=1) <= 0).any():
        raise ValueError(f"probabilities must be finite, non-negative and not all zero, got {p.tolist()}"[:300])
    p = np.maximum(p / p.sum(axis=1, keepdims=True), floor)
    with np.errstate(divide="ignore"):
        logits = np.log(p) / tau
    q = np.exp(logits - logits.max(axis=1, keepdims=True))
    return q / q.sum(axis=1, keepdims=True)


def _bump(repairs: dict[str, int], key: str, n: int = 1) -> None:
    repairs[key] = repairs.get(key, 0) + n


def _load(text: str, repairs: dict[str, int]) -> Any:
    """The JSON (or Python literal) value in ``text``, or None."""
    body = text.strip()
    fence = _FENCE.search(body)
    if fence:
        _bump(repairs, "code_fence")
        body = fence.group(1).strip()
    starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
    if not starts:
        return None
    start = min(starts)
    end = max(body.rfind("}"), body.rfind("]")) + 1
    if end <= start:
        return None
    if start > 0 or end < len(body):
        _bump(repairs, "surrounding_text")
    body = body[start:end]
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        pass
    relaxed = _TRAILING_COMMA.sub(r"\1", body)
    for attempt in (lambda: json.loads(relaxed), lambda: ast.literal_eval(_pythonish(relaxed))):
        try:
            value = attempt()
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        _bump(repairs, "relaxed_syntax")
        return value
    return None


def _pythonish(text: str) -> str:
    """JSON's literals spelled as Python's, for ``ast.literal_eval`` (quoted text is left alone)."""
    parts = re.split(r"""("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')""", text)
    table = {"true": "True", "false": "False", "null": "None"}
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"\b(true|false|null)\b", lambda m: table[m.group(1)], parts[i])
    return "".join(parts)


def _items(value: Any) -> list[Any] | None:
    """The candidate list inside a parsed value, or None if there is none."""
    if isinstance(value, list):
        return value
    if not isinstance(value, dict):
        return None
    lowered = {str(key).casefold(): v for key, v in value.items()}
    if isinstance(lowered.get("responses"), list):
        return lowered["responses"]
    for v in value.values():
        if isinstance(v, list):
            return v
    if _item(value) is not None:  # a single candidate object
        return [value]
    return None


def _salvage(text: str, repairs: dict[str, int]) -> list[Any] | None:
    """Complete candidate objects in otherwise unparsable (e.g. truncated) text: JSON objects decoded from
    each ``{`` (braces inside their strings are fine), else flat ``{...}`` objects in relaxed syntax."""
    found = _complete_json_objects(text) or _flat_objects(text)
    if not found:
        return None
    _bump(repairs, "salvaged_objects", len(found))
    return found


def _complete_json_objects(text: str) -> list[Any]:
    """The candidate objects that decode as JSON from a ``{`` of ``text``, left to right, not overlapping."""
    decoder, found, start = json.JSONDecoder(), [], text.find("{")
    while start >= 0:
        try:
            value, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            value, end = None, start + 1
        if isinstance(value, dict) and _item(value) is not None:
            found.append(value)
        else:
            end = start + 1  # a larger object that is no candidate: look inside it
        start = text.find("{", end)
    return found


def _flat_objects(text: str) -> list[Any]:
    """Flat ``{...}`` candidate objects in JSON or Python-literal syntax."""
    found = []
    for match in _FLAT_OBJECT.finditer(text):
        chunk = _TRAILING_COMMA.sub(r"\1", match.group(0))
        for attempt in (lambda chunk=chunk: json.loads(chunk), lambda chunk=chunk: ast.literal_eval(_pythonish(chunk))):
            try:
                value = attempt()
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            if isinstance(value, dict) and _item(value) is not None:
                found.append(value)
            break
    return found


def _item(item: Any) -> tuple[str, float | None] | None:
    """``(text, probability or None)`` of one candidate, or None if it has no usable text."""
    if isinstance(item, str):
        return (item, None) if item.strip() else None
    if not isinstance(item, dict):
        return None
    lowered = {str(key).casefold(): v for key, v in item.items()}
    text = next((lowered[key] for key in _TEXT_KEYS if key in lowered), None)
    if not isinstance(text, str) or not text.strip():
        return None
    raw = next((lowered[key] for key in _PROB_KEYS if key in lowered), None)
    return text, _probability(raw)


def _probability(raw: Any) -> float | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, str):
        s = raw.strip()
        percent = s.endswith("%")
        try:
            value = float(s.rstrip("%").strip()) / (100.0 if percent else 1.0)
        except ValueError:
            return None
    elif isinstance(raw, (int, float)):
        try:
            value = float(raw)
        except OverflowError:  # an int too large for a float
            return None
    else:
        return None
    return value if math.isfinite(value) and value >= 0 else None


class VerbalizedSimulator(LLMSimulator):
    """Verbalized sampling in the user seat.

    Args:
        backend: The model.
        k: Candidates asked for.
        tau: Temperature of the renormalisation (see :func:`renormalise`).
        floor: Probability floor of the renormalisation.
        params: Decoding settings of the verbalized call (default greedy, 256 new tokens: the
            diversity comes from sampling among the stated candidates). ``max_new_tokens`` and ``k``
            set the longest candidate text (:func:`text_budget`).
        constrained: Send :func:`verbalized_schema` with the request (``SamplingParams.json_schema``):
            constrained decoding in process, structured output from a server. False: the same prompt,
            free text, parsed robustly (for servers without structured output).
        fallback_temperature: Temperature of the plain sampling used when the answer is unusable.
        fallback_max_new_tokens: Token budget of a fallback reply.
        name: As for :class:`LLMSimulator`.
        personas: As for :class:`LLMSimulator`.
        persona_set: As for :class:`LLMSimulator`.
        fallback_reply: As for :class:`LLMSimulator`.
        text_format: As for :class:`LLMSimulator`.

    Attributes:
        schema: The JSON schema of an answer (sent only when ``constrained``).
        stats: ``calls`` (verbalized answers requested), ``fallbacks``, ``format_repairs`` (answers that
            needed a :data:`FORMAT_REPAIRS` repair), ``repair:<name>`` (summed
            :attr:`ParseResult.repairs`), closing surveys' ``survey_calls`` and ``survey_fallbacks``
            (:meth:`survey_distribution`), and :class:`LLMSimulator`'s counters.
    """

    kind = "verbalized"

    def __init__(self, backend: Backend, k: int = 5, tau: float = 1.0, floor: float = 0.01,
                 params: SamplingParams | None = None, *, constrained: bool = True, fallback_temperature: float = 1.0,
                 fallback_max_new_tokens: int = 64, name: str | None = None,
                 personas: Sequence[Any] | None = None, persona_set: str | None = None,
                 fallback_reply: str = FALLBACK_REPLY, text_format: Any = None):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        renormalise([1.0], floor, tau)  # validates floor and tau with their own messages
        super().__init__(backend, params or SamplingParams(max_new_tokens=256), name=name, personas=personas,
                         persona_set=persona_set, fallback_reply=fallback_reply, text_format=text_format)
        self.k, self.tau, self.floor, self.constrained = k, tau, floor, constrained
        self.fallback_params = SamplingParams(max_new_tokens=fallback_max_new_tokens,
                                              temperature=fallback_temperature)
        max_chars = text_budget(self.params.max_new_tokens, k)
        self.schema = verbalized_schema(k, max_chars)
        self.params = dataclasses.replace(self.params, json_schema=self.schema if constrained else None)
        self.suffix = VERBALIZED_INSTRUCTIONS.format(k=k, max_chars=max_chars)
        self.stats.update({"calls": 0, "fallbacks": 0, "format_repairs": 0, "survey_calls": 0, "survey_fallbacks": 0})

    @classmethod
    def from_spec(cls, spec: SimulatorSpec, context: BuildContext) -> VerbalizedSimulator:
        """Build from a parsed ``verbalized:MODEL`` spec."""
        d, e = dict(spec.decoding), dict(spec.extra)
        return cls(context.backend(spec.model), d["k"], d["tau"], d["floor"], sampling(spec),
                   constrained=d["constrained"], fallback_temperature=e["fallback_temperature"],
                   fallback_max_new_tokens=e["fallback_max_new_tokens"],
                   personas=context.personas(spec.personas), persona_set=spec.personas, text_format=env_format(context))

    @property
    def spec(self) -> SimulatorSpec:
        decoding = {**self._decoding(), "k": self.k, "tau": float(self.tau), "floor": float(self.floor),
                    "constrained": self.constrained}
        return SimulatorSpec(self.kind, self.backend.name, self.persona_set, decoding,
                             {"fallback_temperature": float(self.fallback_params.temperature),
                              "fallback_max_new_tokens": self.fallback_params.max_new_tokens})

    @property
    def fallback_rate(self) -> float:
        """Fallbacks per verbalized answer so far (0 before the first)."""
        return self.stats["fallbacks"] / self.stats["calls"] if self.stats["calls"] else 0.0

    def parse(self, observations: list[str], slots: list[int]) -> list[ParseResult]:
        """Ask for the verbalized answers of ``slots`` (one backend call) and parse them."""
        chats = [self.chat(obs, slot, self.suffix) for obs, slot in zip(observations, slots)]
        texts = self.raw_generate(chats, dataclasses.replace(self.params, seed=self.call_seed(slots)))
        results = [parse_verbalized(t, self.k) for t in texts]
        self.stats["calls"] += len(results)
        self.stats["fallbacks"] += sum(not r.ok for r in results)
        self.stats["format_repairs"] += sum(r.format_repairs > 0 for r in results)
        for text, r in zip(texts, results):
            if not r.ok:
                logger.debug("%s: unusable verbalized answer (%s), falling back: %.200r", self.name, r.error, text)
            for key, n in r.repairs.items():
                self.stats[f"repair:{key}"] = self.stats.get(f"repair:{key}", 0) + n
        return results

    def reply_batch(self, observations: list[Any], slots: list[int]) -> list[str]:
        """Dialogue replies drawn from the renormalised verbalized candidates (:meth:`LLMSimulator.act_batch`
        routes closing surveys elsewhere)."""
        results = self.parse(observations, slots)
        replies: list[str | None] = [None] * len(slots)
        for i, (result, slot) in enumerate(zip(results, slots)):
            if result.ok:
                texts, probs = zip(*result.candidates)
                p = renormalise(probs, self.floor, self.tau)
                replies[i] = texts[int(self._rngs[slot].choice(len(texts), p=p))]
        failed = [i for i, r in enumerate(replies) if r is None]
        plain = [self.chat(observations[i], slots[i]) for i in failed]
        for i, text in zip(failed, self.generate(plain, [slots[i] for i in failed], self.fallback_params)):
            replies[i] = text
        self.stats["replies"] += len(slots) - len(failed)
        return [self.text_format.to_action(r, self.stats) for r in replies if r is not None]

    def distribution(self, observation: Any, slot: int = 0) -> list[tuple[str, float]]:
        """The renormalised candidates for ``slot``'s observation.

        On an unusable answer (counted as a fallback), the empirical distribution of ``k`` plain
        samples at the fallback temperature, with duplicates merged.
        """
        result = self.parse([observation], [slot])[0]
        if result.ok:
            texts, probs = zip(*result.candidates)
            return list(zip(texts, renormalise(probs, self.floor, self.tau)))
        samples = self.generate([self.chat(observation, slot)] * self.k, [slot] * self.k, self.fallback_params)
        counts: dict[str, int] = {}
        for s in samples:
            counts[s] = counts.get(s, 0) + 1
        return [(text, n / len(samples)) for text, n in counts.items()]


    def survey_distribution(self, observations: list[Any], slots: list[int],
                            surveys: list[Survey]) -> list[list[float] | None]:
        """Per slot, the model's *stated* distribution over the survey's options, renormalised as for replies.

        The model is asked (:data:`VERBALIZED_SURVEY_INSTRUCTIONS`) for ``min(k, options)`` answers with
        probabilities; constrained, each text is one of the options (:func:`verbalized_schema` with
        ``choices``). An option's probability is the sum stated for it (0 when not listed), then
        :func:`renormalise` (floor, tau). An answer naming no option is a counted fallback
        (``stats["survey_fallbacks"]`` of ``stats["survey_calls"]``) to the options' log-probabilities at the
        fallback temperature (:meth:`LLMSimulator.option_logprobs`; None where those cannot be scored either).
        """
        stated: list[list[float] | None] = [None] * len(surveys)
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, survey in enumerate(surveys):
            groups.setdefault(survey.options, []).append(i)
        for options, members in groups.items():  # one backend call per distinct option list
            k = min(self.k, len(options))
            suffix = VERBALIZED_SURVEY_INSTRUCTIONS.format(k=k, options=", ".join(json.dumps(o) for o in options))
            chats = [self.survey_chat(observations[i], slots[i], surveys[i], suffix) for i in members]
            # Seeded by the chats, not the slots' generators: stating the distribution draws nothing.
            params = dataclasses.replace(self.params, seed=zlib.crc32(json.dumps(chats).encode()) & 0x7FFFFFFF,
                                         json_schema=verbalized_schema(k, 1, options) if self.constrained else None)
            index = {_key(option): j for j, option in enumerate(options)}
            for i, text in zip(members, self.raw_generate(chats, params), strict=True):
                probs = [0.0] * len(options)
                for candidate, p in parse_verbalized(text, k).candidates:
                    if _key(candidate) in index:
                        probs[index[_key(candidate)]] += p
                if sum(probs) > 0:
                    stated[i] = renormalise(probs, self.floor, self.tau)
        self.stats["survey_calls"] += len(surveys)
        failed = [i for i, probs in enumerate(stated) if probs is None]
        self.stats["survey_fallbacks"] += len(failed)
        if failed:
            logger.debug("%s: %d verbalized survey answers named no option; scoring the options instead",
                         self.name, len(failed))
            scored = self.option_logprobs([observations[i] for i in failed], [slots[i] for i in failed],
                                          [surveys[i] for i in failed])
            for i, lp in zip(failed, scored, strict=True):
                stated[i] = None if lp is None else choice_probabilities(lp, self.fallback_params.temperature)
        return stated

    @property
    def survey_params(self) -> SamplingParams:
        """A free-text survey answer (no option could be scored) is a plain sample, as for a fallback reply."""
        return self.fallback_params


def _key(text: str) -> str:
    """Texts compared up to whitespace and case (as :func:`parse_verbalized` merges duplicates)."""
    return " ".join(text.split()).casefold()


class Renormalised(Simulator):
    r"""Verbalized sampling over a simulator that states its own distribution (no text to parse).

    Each reply is drawn from ``renormalise(p, floor, tau)`` of the inner simulator's
    :meth:`~simpop.seat.DistributionalSimulator.distribution`, with the slot's own generator; the inner
    simulator then :meth:`~simpop.seat.DistributionalSimulator.commit`\ s the chosen reply.
    Where the inner simulator states many slots' distributions at once (``distribution_batch``, e.g. the
    act-level P4G persuadee), a batch is renormalised and drawn as arrays, with the same numbers and draws.

    Args:
        inner: The simulator whose distribution is renormalised.
        floor: Probability floor (see :func:`renormalise`).
        tau: Renormalisation temperature.
        name: Name in logs and populations.
    """

    def __init__(self, inner: Simulator, floor: float = 0.01, tau: float = 1.0, name: str | None = None):
        if not isinstance(inner, DistributionalSimulator):
            raise TypeError(f"{type(inner).__name__} does not state its distribution (distribution/commit/slot_rng); "
                            f"verbalized sampling of an LLM is verbalized:MODEL")
        renormalise([1.0], floor, tau)  # validates floor and tau with their own messages
        self.inner, self.floor, self.tau = inner, floor, tau
        self.name = name or f"verbalized-{inner.name}"

    @property
    def spec(self) -> SimulatorSpec:
        inner = self.inner.spec
        return SimulatorSpec("verbalized", f"{inner.kind}:{inner.model}", inner.personas,
                             {**dict(inner.decoding), "floor": float(self.floor), "tau": float(self.tau)}, inner.extra)

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        self.inner.reset_batch(scenarios, rngs)

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[Any]:
        if len(observations) != len(slots):
            raise ValueError(f"got {len(observations)} observations for {len(slots)} slots")
        actions: list[Any] = [None] * len(slots)
        left: list[int] = list(range(len(slots)))
        batch = getattr(self.inner, "distribution_batch", None)
        if batch is not None:  # all slots' distributions at once: the same numbers and draws as one by one
            done: list[int] = []
            for rows, options, probs in batch(observations, slots):
                u = np.array([self.inner.slot_rng(slots[i]).random() for i in rows])
                for i, c in zip(rows.tolist(), choice_rows(renormalise_rows(probs, self.floor, self.tau), u).tolist()):
                    actions[i] = options[c]
                done += rows.tolist()
            if done:
                commit = self.inner.commit_batch  # type: ignore[attr-defined]  # beside distribution_batch
                commit([observations[i] for i in done], [slots[i] for i in done], [actions[i] for i in done])
                left = sorted(set(left) - set(done))
        for i in left:
            observation, slot = observations[i], slots[i]
            options = self.inner.distribution(observation, slot)
            p = renormalise([q for _, q in options], self.floor, self.tau)
            actions[i] = options[int(self.inner.slot_rng(slot).choice(len(p), p=p))][0]
            self.inner.commit(observation, slot, actions[i])
        return actions

    def distribution(self, observation: Any, slot: int = 0) -> list[tuple[Any, float]]:
        """The inner simulator's stated distribution for ``slot``, renormalised (floor, then temperature ``tau``)."""
        options = self.inner.distribution(observation, slot)
        return list(zip([a for a, _ in options], renormalise([q for _, q in options], self.floor, self.tau)))

    def commit(self, observation: Any, slot: int, action: Any) -> None:
        """Tell the inner simulator which action was taken in ``slot``."""
        self.inner.commit(observation, slot, action)

    def slot_rng(self, slot: int) -> np.random.Generator:
        """The inner simulator's generator for ``slot``."""
        return self.inner.slot_rng(slot)


def from_spec(spec: SimulatorSpec, context: BuildContext) -> Simulator:
    """The ``verbalized`` kind: :class:`VerbalizedSimulator` for a model, :class:`Renormalised` for a kind."""
    inner = inner_or_none(spec)
    if inner is None:
        return VerbalizedSimulator.from_spec(spec, context)
    d = dict(spec.decoding)
    return Renormalised(context.build(inner), floor=d["floor"], tau=d["tau"])
