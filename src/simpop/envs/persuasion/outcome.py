"""The P4G outcome: reading a donation decision out of a persuadee message, and the closing survey's answer.

Rule (``parse_donation``), in order:

1. **Tag.** ``[DONATE $N]`` (case-insensitive; ``$`` and spaces optional, ``[DONATE: 0.5]`` also works)
   decides. With several tags the last one wins. ``N`` is clamped to [0, 2].
2. **Natural language**, when there is no tag. The message is split into sentences (a ``.`` before a
   digit, as in ``$0.50``, does not end one) and sentences into clauses at *but* / *however* /
   *instead*. Questions (``?``) state nothing. Within a clause:

   - a **refusal** states $0: a negated giving verb (*won't / will not / not going to / don't want to /
     can't / would rather not ... donate / give / contribute / spare / afford*), *not donating*,
     *no thanks*, *no thank you*, *I'll pass*, *not today*, *not interested*, *keep my money*,
     *I decline*, *rather not*;
   - a **pledge** states an amount: a first-person giving verb in the present or future (*I'll /
     I will / I'd like to / I can / I'm going to ... donate / give / contribute / pledge / spare / chip
     in / do / go with*; also *let me*, *count me in for*, *put me down for*, *my donation is*) followed
     in the same clause by an amount: ``$1.50``, ``50 cents``, ``2 dollars``, number words (*one
     dollar*, *fifty cents*, *a dollar fifty*, *one dollar and twenty cents*), coins (*a penny*, *a
     nickel*, *a dime*, *a quarter*), *half a dollar* (0.5), *half* (of the $2: 1.0), *all of it* /
     *everything* / *the full $2* / *the whole amount* (2.0), *nothing* / ``$0`` (0.0). A bare number
     after the verb is dollars when it has a decimal point or is at most 2 (``donate 1``, ``donate
     .5``) and cents otherwise (``donate 50``). Past tense (*I donated $5 last year*) is not a pledge.
     A pledge without an amount (*sure, I'll donate*) is not yet a decision.

   The last decision in the message wins; amounts are clamped to [0, 2].
3. Otherwise ``None``: no decision stated.

``0.0`` is a decision (the persuadee refused); ``None`` means the dialogue goes on.

The closing survey (:data:`SURVEY`, asked when the dialogue ends undecided) is answered with one of
:data:`SURVEY_OPTIONS`; :func:`read_survey_answer` reads any answer strictly, then leniently, else as a $0 fallback.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from simpop.envs.persuasion.model import AMOUNT_LEVELS
from simpop.seat import Survey

#: The most a persuadee can give: their whole task payment.
MAX_DONATION = 2.0

_TAG = re.compile(r"\[\s*donate\s*:?\s*\$?\s*(\d+(?:\.\d*)?|\.\d+)\s*\]", re.IGNORECASE)

_UNITS = {"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
          "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
          "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30,
          "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90, "a": 1, "an": 1}
_TENS = "twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety"
_DIGITS = "one|two|three|four|five|six|seven|eight|nine"
_WORD = (rf"(?:(?:{_TENS})(?:[\s-](?:{_DIGITS}))?|zero|{_DIGITS}|ten|eleven|twelve|thirteen|fourteen|fifteen|"
         r"sixteen|seventeen|eighteen|nineteen)")
_NUM_NO_A = rf"(?:\d+(?:\.\d+)?|\.\d+|{_WORD})"
_NUM = rf"(?:{_NUM_NO_A}|an?)"
_CENTS = r"(?:cents?|¢)"
_DOLLARS = r"(?:dollars?|bucks?|usd)"

_AMOUNT = re.compile(
    r"(?P<all>\ball of it\b|\ball of (?:my|the|your)\s+(?:\w+\s+)?(?:money|payment|pay|bonus|earnings|reward)\b"
    r"|\beverything\b|\bthe (?:full|whole|entire) (?:\$\s*2(?:\.00)?|two dollars|amount|payment|bonus|thing|sum)"
    r"|\ball (?:\$\s*2(?:\.00)?|two dollars)|\bfull amount\b|\b100 ?%)"
    r"|(?P<halfdollar>\bhalf(?:\s+of)?\s+a\s+dollar\b|\bhalf[\s-]dollar\b)"
    r"|(?P<half>\bhalf\b)"
    r"|(?P<coin>\b(?:a|one)\s+(?:penny|nickel|dime|quarter)\b)"
    r"|(?P<zero>\bnothing\b|\bnot a (?:penny|cent|dime)\b|\$\s*0(?:\.0+)?(?!\.?\d))"
    r"|\$\s*(?P<sign>\d+(?:\.\d+)?|\.\d+)"
    rf"|\b(?P<dollars>{_NUM})\s*{_DOLLARS}\b(?:\s*(?:and\s+)?(?P<extra>a half\b|{_NUM_NO_A}(?:\s*{_CENTS})?))?"
    rf"|\b(?P<cents>{_NUM})\s*{_CENTS}"
    r"|(?P<bare>(?<![\w$.])(?:\d+(?:\.\d+)?|\.\d+)(?![\w%]|\.\d))",
    re.IGNORECASE)

_COINS = {"penny": 0.01, "nickel": 0.05, "dime": 0.10, "quarter": 0.25}

_GIVE = r"(?:donate|donating|give|giving|contribute|contributing|pledge|pledging|chip in|spare|offer|go with)"
_PLEDGE = re.compile(
    rf"\b(?:(?:i|we)(?:\s+|')(?:(?!not\b|n't\b|can't(?! wait)|cannot)[\w']+\s+){{0,4}}?{_GIVE}\b"
    r"|\b(?:i|we)(?:'ll| will| can| could)\s+do\b|\blet me\b|\bcount me in\b|\bput me down\b|\bsign me up\b|\bmy donation (?:is|will be)\b|\bi'?m in for\b)",
    re.IGNORECASE)

_REFUSE = re.compile(
    r"(?:\b(?:won'?t|will not|not going to|n'?t going to|not gonna|don'?t (?:want|plan|intend|feel like)"
    r"|do not (?:want|plan|intend|feel like)|can'?t(?! wait)|cannot|can not|couldn'?t|could not|shouldn'?t"
    r"|rather not|decline to|unable to|not able to|don'?t think i(?:'ll| will| can| should))\b"
    r"[^.!?;]{0,30}?\b(?:donat\w*|give|giving|contribut\w*|spare|afford|part with|be able)\b"
    r"|\bnot (?:be )?(?:donating|giving|contributing)\b|\bno,? thanks?\b|\bno,? thank you\b"
    r"|\bi(?:'ll| will| am going to|'m going to)? pass\b|\bnot today\b|\bnot interested\b"
    r"|\bkeep (?:all of )?(?:my|the) (?:money|payment|bonus|earnings|pay)\b|\bi decline\b|\brather not\b)",
    re.IGNORECASE)

_SENTENCE = re.compile(r"(?:[^.!?;\n]|\.(?=\d))+[.!?;]*")
_CLAUSE_BREAK = re.compile(r"\b(?:but|however|instead)\b", re.IGNORECASE)


def parse_donation(text: str) -> float | None:
    """The donation decision a persuadee message states: an amount in [0, 2], or None if none.

    See the module docstring for the rule. Never raises on a string.
    """
    if not isinstance(text, str):
        return None
    tags = _TAG.findall(text)
    if tags:
        return _clamp(float(tags[-1]))
    text = text.replace("\u2019", "'").replace("\u2018", "'")
    decision: float | None = None
    for sentence in _SENTENCE.findall(text):
        if sentence.rstrip().endswith("?"):
            continue
        for clause in _CLAUSE_BREAK.split(sentence):
            found = _clause_decision(clause)
            if found is not None:
                decision = found
    return decision


def _clause_decision(clause: str) -> float | None:
    """The last decision stated in one clause (a refusal or a pledge with an amount), or None."""
    events: list[tuple[int, float]] = []
    for m in _REFUSE.finditer(clause):
        events.append((m.start(), 0.0))
    for m in _PLEDGE.finditer(clause):
        amount = _first_amount(clause[m.end():])
        if amount is not None:
            events.append((m.start(), amount))
    if not events:
        return None
    return max(events, key=lambda e: e[0])[1]


def _first_amount(text: str) -> float | None:
    m = _AMOUNT.search(text)
    if m is None:
        return None
    groups = m.groupdict()
    if groups["all"]:
        return MAX_DONATION
    if groups["halfdollar"]:
        return 0.5
    if groups["half"]:
        return MAX_DONATION / 2
    if groups["coin"]:
        return _COINS[groups["coin"].split()[-1].lower()]
    if groups["zero"]:
        return 0.0
    if groups["sign"]:
        return _clamp(float(groups["sign"]))
    if groups["dollars"]:
        value = _number(groups["dollars"])
        extra = groups["extra"]
        if extra:
            value += 0.5 if extra.lower().startswith("a half") else _number(re.sub(_CENTS, "", extra, flags=re.I)) / 100
        return _clamp(value)
    if groups["cents"]:
        return _clamp(_number(groups["cents"]) / 100)
    bare = groups["bare"]
    value = float(bare)
    return _clamp(value if "." in bare or value <= MAX_DONATION else value / 100)


def _number(token: str) -> float:
    token = token.strip().lower()
    try:
        return float(token)
    except ValueError:
        return float(sum(_UNITS[w] for w in re.split(r"[\s-]+", token) if w))


def _clamp(value: float) -> float:
    return min(max(value, 0.0), MAX_DONATION)


# ---------------------------------------------------------------------------------------------- closing survey
#: The closing survey's answers in dollars: nothing, or one of the amount levels.
SURVEY_AMOUNTS: tuple[float, ...] = (0.0, *AMOUNT_LEVELS)
#: Their labels, one per amount: ``I donate nothing``, ``I donate $0.05`` ... ``I donate $2.00``. Stating the
#: decision first keeps "nothing" apart from every amount from the first differing token on; as ``$0.00`` it
#: would share the ``$0.`` prefix with four small amounts and an LLM's probability of giving nothing would be
#: split among them (SmolLM2: P($0.00) ≈ 0.04 where P(I donate nothing) ≈ 0.1-0.4 on the same chats).
SURVEY_OPTIONS: tuple[str, ...] = ("I donate nothing", *(f"I donate ${a:.2f}" for a in AMOUNT_LEVELS))
#: The question P4G asked every persuadee after the chat, with the options spelled out.
SURVEY = Survey(
    "The chat is over. Closing survey: how much of your $2 task payment do you donate to Save the Children? "
    f"Answer with exactly one of: {', '.join(SURVEY_OPTIONS)}.", SURVEY_OPTIONS)

_BARE_AMOUNT = re.compile(r"(?P<sign>[-\u2212])?\s*\$?\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*"
                          r"(?P<unit>dollars?|usd|bucks?|cents?|¢)?", re.IGNORECASE)
_NAMED_AMOUNT = re.compile(r"(?P<sign>[-\u2212])?\$\s*(?P<num>\d+(?:\.\d*)?|\.\d+)")
_ZERO_WORDS = {"nothing", "none", "zero", "no donation"}
#: How much of a survey answer is read.
SURVEY_READ_CHARS = 2000


@dataclass(frozen=True)
class SurveyAnswer:
    """How the env read a closing-survey answer.

    Attributes:
        amount: The donation: one of :data:`SURVEY_AMOUNTS`.
        parse: ``"strict"`` (an option label or an amount equal to one), ``"lenient"`` (a decision
            :func:`parse_donation` reads, or the one dollar amount the text names, moved to the nearest
            option of the same sign), or ``"fallback"`` ($0: nothing readable, an off-scale amount, not text).
        reason: Why it fell back (None otherwise).
    """

    amount: float
    parse: str
    reason: str | None = None

    @property
    def option(self) -> str:
        return SURVEY_OPTIONS[SURVEY_AMOUNTS.index(self.amount)]


def _nearest_option(amount: float) -> float:
    """The survey amount closest to ``amount`` in [0, 2], keeping its sign ($0 only for exactly nothing)."""
    if amount <= 0:
        return 0.0
    return min(AMOUNT_LEVELS, key=lambda level: (abs(level - amount), level))


def _level(amount: float) -> float | None:
    return next((a for a in SURVEY_AMOUNTS if math.isclose(a, amount, abs_tol=1e-9)), None)


def read_survey_answer(answer: Any) -> SurveyAnswer:
    """Read a closing-survey answer: strictly first, then leniently, else a $0 fallback; never raises.

    1. **Strict**: the answer (stripped of whitespace, quotes and a final ``.``/``!``) is an option label
       (``I donate $0.50``, any case) or an amount equal to an option's (``$0.50``, ``0.5``, ``$.50``, ``50
       cents``, ``2 dollars``, ``$0``).
       A bare amount off the $0–$2 scale (``$5``, ``-1``) falls back.
    2. **Lenient**: :func:`parse_donation` reads a decision (``I'll give 50 cents``, ``[DONATE $1]``, ``no
       thanks``), else the text is ``nothing`` / ``none`` / ``zero``, else it names exactly one distinct dollar
       amount (``$0.50, because kids matter``); an amount between options moves to the nearest option of the
       same sign (a positive amount never becomes $0); a named amount off the scale falls back.
    3. **Fallback**: $0, with the reason (empty, not text, off-scale, nothing readable).

    Only the first :data:`SURVEY_READ_CHARS` characters are read (an answer is a few words).
    """
    if not isinstance(answer, str):
        return SurveyAnswer(0.0, "fallback", f"the answer is not text (got {type(answer).__name__})")
    text, before = answer[:SURVEY_READ_CHARS], None
    while text != before:  # "$0.50". or **$0.50** or '$0.50!'
        before, text = text, text.strip().strip("\"'`*").rstrip(".!")
    if not text:
        return SurveyAnswer(0.0, "fallback", "empty answer")
    folded = text.casefold()
    for label, amount in zip(SURVEY_OPTIONS, SURVEY_AMOUNTS):
        if folded == label.casefold():
            return SurveyAnswer(amount, "strict")
    bare = _BARE_AMOUNT.fullmatch(text)
    if bare:
        value = float(bare["num"]) / (100.0 if (bare["unit"] or "").lower() in ("cent", "cents", "¢") else 1.0)
        value = -value if bare["sign"] else value
        if (level := _level(value)) is not None:
            return SurveyAnswer(level, "strict")
        if not 0.0 <= value <= MAX_DONATION:
            return SurveyAnswer(0.0, "fallback", f"off-scale amount {text!r} (the options are $0-$2)")
        return SurveyAnswer(_nearest_option(value), "lenient")
    decision = parse_donation(text)
    if decision is not None:
        return SurveyAnswer(_nearest_option(decision), "lenient")
    if folded in _ZERO_WORDS:
        return SurveyAnswer(0.0, "lenient")
    named = {(-1.0 if m["sign"] else 1.0) * float(m["num"]) for m in _NAMED_AMOUNT.finditer(text)}
    if len(named) == 1:
        (value,) = named
        if not 0.0 <= value <= MAX_DONATION:
            return SurveyAnswer(0.0, "fallback", f"off-scale amount ${value:g} (the options are $0-$2)")
        return SurveyAnswer(_nearest_option(value), "lenient")
    return SurveyAnswer(0.0, "fallback", "no option, amount or donation decision found"
                        + (f" (it names {len(named)} different amounts)" if named else ""))
