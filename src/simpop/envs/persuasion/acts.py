"""P4G dialogue acts: the persuader's 14, the persuadee's 23, a persuader-text classifier, and realisers.

Persuader acts are the corpus's 10 persuasion strategies plus the four non-strategy acts an episode
needs (proposing the donation, asking the amount, opening and closing). Persuadee acts are the 23
labels of the annotated corpus. :func:`classify_persuader` maps free text to a persuader act with
keyword rules (so the native simulator can answer any policy), and :func:`render_persuader` /
:func:`render_persuadee` realise acts as text with several phrasings each; persuadee decisions are
phrased so that :func:`~simpop.envs.persuasion.outcome.parse_donation` reads them back.
"""

from __future__ import annotations

import re

import numpy as np

STRATEGIES = ("logical-appeal", "emotion-appeal", "credibility-appeal", "foot-in-the-door", "self-modeling",
              "personal-story", "donation-information", "source-related-inquiry", "task-related-inquiry",
              "personal-related-inquiry")
PERSUADER_ACTS = STRATEGIES + ("proposition-of-donation", "ask-donation-amount", "greeting", "closing")
#: Persuader acts that ask for the decision (the persuadee answers with agree/disagree).
ASKING_ACTS = ("proposition-of-donation", "ask-donation-amount")
INQUIRIES = ("source-related-inquiry", "task-related-inquiry", "personal-related-inquiry")

PERSUADEE_ACTS = (
    "ask-org-info", "ask-donation-procedure", "ask-persuader-donation-intention",
    "agree-donation", "disagree-donation", "disagree-donation-more", "provide-donation-amount", "confirm-donation",
    "positive-reaction-to-donation", "neutral-reaction-to-donation", "negative-reaction-to-donation",
    "positive-to-inquiry", "neutral-to-inquiry", "negative-to-inquiry",
    "task-related-inquiry", "personal-related-inquiry",
    "greeting", "thank", "acknowledgement", "closing", "you-are-welcome", "off-task", "other",
)
#: Persuadee acts that state a positive amount / a refusal (the episode's outcome).
DONATING_ACTS = ("agree-donation", "provide-donation-amount", "confirm-donation")
REFUSING_ACTS = ("disagree-donation", "disagree-donation-more")
DECISION_ACTS = DONATING_ACTS + REFUSING_ACTS

# ---------------------------------------------------------------------------------------------- classifier
# Ordered rules: the first that matches wins. Asking for the decision comes first because it is what
# the persuadee must answer; openings/closings next; questions (inquiries) before statements.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((act, re.compile(pattern, re.IGNORECASE)) for act, pattern in (
    ("ask-donation-amount",
     r"\bhow much (?:would|will|could|can|do|are) you\b|\bwhat amount\b|\bhow much of your\b"),
    ("proposition-of-donation",
     r"\b(?:would|will|could|can) you (?:like to |be willing to |consider |please )?(?:donat|give|contribut|make a donation)"
     r"|\bare you willing to (?:donat|give)|\bplease (?:consider )?donat|\bwould you consider (?:a |making a )?donation"
     r"|\bhow about (?:donating|a donation|making a donation)|\bwill you join me in donating"),
    ("greeting", r"^\W*(?:hi|hello|hey|good (?:morning|afternoon|evening)|greetings)\b|\bhow are you\b"),
    ("closing", r"\bthank(?:s| you) for (?:your time|chatting|talking)|\bhave a (?:great|nice|good|wonderful) "
                r"(?:day|evening|night)|\bgoodbye\b|\bbye\b|\bnice (?:talking|chatting)"),
    ("source-related-inquiry",
     r"\b(?:have|had) you (?:ever )?heard (?:of|about) (?:save the children|this (?:charity|organi[sz]ation))"
     r"|\bare you familiar with\b|\bdo you know (?:about |of )?(?:save the children|this charity)"),
    ("task-related-inquiry",
     r"\b(?:have|do) you (?:ever |usually |often |regularly )?(?:donated?|given|give) to (?:a |any )?charit"
     r"|\bhow do you feel about (?:donating|charit|giving)|\bwhat do you think (?:about|of) (?:donating|charit|giving)"
     r"|\bdo you (?:usually |ever )?(?:donate|give)\b[^?]*\?"),
    ("personal-related-inquiry",
     r"\bdo you have (?:any )?(?:kids|children)\b|\bare you a (?:parent|mom|dad)\b|\bwhere are you from\b"
     r"|\bwhat do you do\b|\bhow (?:was|is) your (?:day|week|weekend)\b|\btell me about yourself\b"),
    ("foot-in-the-door",
     r"\beven a (?:small|tiny|little) (?:amount|donation|bit)|\bjust a few cents\b|\bevery little bit\b"
     r"|\bstart (?:with|small)|\bas little as\b|\bonly a few cents\b"),
    ("self-modeling",
     r"\bi(?:'m| am) (?:going to |planning to )?donat|\bi(?:'ll| will| plan to) (?:donate|give)\b"
     r"|\bi(?:'ve| have) (?:already )?donated\b|\bi donate (?:to|every)"),
    ("donation-information",
     r"\b(?:deducted|taken|come) (?:directly )?(?:from|out of) your\b|\bresearch team will\b"
     r"|\bdonate (?:any amount|between|up to)\b|\b(?:payment|bonus) (?:for|of) this task\b|\$0 (?:to|and) \$2"),
    ("personal-story",
     r"\bwhen i was\b|\bmy (?:friend|sister|brother|mother|mom|father|dad|family|cousin|neighbou?r|niece|nephew)\b"
     r"|\bi once\b|\bi remember\b|\bi (?:saw|visited|met|volunteered)\b"),
    ("credibility-appeal",
     r"\bfounded in\b|\bcharity navigator\b|\btranspar|\b(?:90|ninety|86|eighty)[ -]?(?:%|percent)"
     r"|\breputable\b|\btrusted\b|\b(?:100|hundred) years\b|\baccredited\b|\btrack record\b|\baudited\b"),
    ("emotion-appeal",
     r"\bimagine\b|\bheartbreak|\bsuffer|\bstarv|\bdying\b|\bdie\b|\btragic|\bterrif|\bafraid\b|\bhopeless"
     r"|\bbreaks? (?:my|your) heart\b|\bwar zones?\b|\bhow (?:good|great) (?:you will|you'll|it will) feel"),
    ("logical-appeal",
     r"\bdifference\b|\bimpact\b|\bhelp(?:s)? (?:provide|ensure|fund|pay)|\bevery dollar\b|\bbecause\b"
     r"|\bstatistic|\bevidence\b|\beffective\b|\bgo(?:es)? (?:a long way|directly)\b"
     r"|\bsave the children\b|\bdonat|\bcharit|\bchildren\b"),
))
#: What text no rule recognises (small talk, gibberish) counts as: social, not persuasive.
FALLBACK_ACT = "greeting"
#: A question that no rule recognises is an inquiry about the person.
FALLBACK_QUESTION_ACT = "personal-related-inquiry"


def classify_persuader(text: str) -> str:
    """The persuader act that ``text`` performs (first matching keyword rule; see :data:`_RULES`)."""
    for act, pattern in _RULES:
        if pattern.search(text):
            return act
    return FALLBACK_QUESTION_ACT if text.rstrip().endswith("?") else FALLBACK_ACT


# ---------------------------------------------------------------------------------------------- realisers
PERSUADER_TEMPLATES: dict[str, tuple[str, ...]] = {
    "logical-appeal": (
        "Your donation can make a real difference: Save the Children uses it to provide food, health care and "
        "schooling.",
        "Even a modest gift has an impact, because the money goes directly to programs for children in need.",
        "Every dollar helps provide clean water and vaccines, so your money is used where it counts most.",
    ),
    "emotion-appeal": (
        "Imagine a child in a war zone going to bed hungry tonight.",
        "It breaks my heart that so many children suffer from hunger and never get to see a doctor.",
        "Think of how good you will feel knowing a child is not starving because of you.",
    ),
    "credibility-appeal": (
        "Save the Children was founded in 1919 and has helped children in over 100 countries.",
        "They are highly rated by Charity Navigator and very transparent about their spending.",
        "About 90 percent of their funds go straight to programs; they are one of the most trusted charities.",
    ),
    "foot-in-the-door": (
        "Even a small amount helps, just a few cents would already mean something.",
        "You could start small; every little bit adds up.",
        "It can be as little as ten cents, nothing big is needed.",
    ),
    "self-modeling": (
        "I'm donating part of my own payment today.",
        "I've already donated to them myself, and I'll give again this time.",
        "I am going to donate as well, it feels right.",
    ),
    "personal-story": (
        "When I was younger, my family relied on help from a charity like this one.",
        "My friend volunteered with them abroad and told me how much a small donation changed for a family.",
        "I once met a teacher whose school was rebuilt by this organization.",
    ),
    "donation-information": (
        "Any donation will be deducted directly from your payment for this task.",
        "You can donate any amount between $0 and $2 of your task payment, and the research team will send it "
        "on to the charity.",
        "The research team will collect all donations and pass them on; it simply comes out of your bonus.",
    ),
    "source-related-inquiry": (
        "Have you ever heard of Save the Children?",
        "Are you familiar with the charity Save the Children?",
        "Do you know about Save the Children and their work?",
    ),
    "task-related-inquiry": (
        "Have you ever donated to a charity before?",
        "How do you feel about donating to charities in general?",
        "Do you usually give to charity?",
    ),
    "personal-related-inquiry": (
        "Do you have any kids yourself?",
        "Where are you from, if you don't mind me asking?",
        "How was your day so far?",
    ),
    "proposition-of-donation": (
        "Would you like to donate some of your task payment to Save the Children?",
        "Would you be willing to donate part of your earnings to help these children?",
        "Will you join me in donating to Save the Children today?",
    ),
    "ask-donation-amount": (
        "How much would you like to donate?",
        "How much of your payment would you be willing to give?",
        "What amount would you like to contribute?",
    ),
    "greeting": (
        "Hello! How are you doing today?",
        "Hi there, how are you?",
        "Good morning! Nice to meet you.",
    ),
    "closing": (
        "Thank you for your time, have a great day!",
        "It was nice talking to you. Goodbye!",
        "Thanks for chatting with me, have a nice evening.",
    ),
}

#: Persuadee phrasings; ``{amount}`` is filled by :func:`format_amount`.
PERSUADEE_TEMPLATES: dict[str, tuple[str, ...]] = {
    "ask-org-info": ("What exactly does Save the Children do?", "Where do they work?",
                     "Can you tell me more about the organization?"),
    "ask-donation-procedure": ("How would the donation work?", "Would it come out of my task payment?",
                               "How does the money get to them?"),
    "ask-persuader-donation-intention": ("Are you donating too?", "How much are you giving yourself?",
                                         "Did you donate as well?"),
    "agree-donation": ("Okay, you convinced me. I'll donate {amount}.", "Sure, I'd like to give {amount}.",
                       "Alright, I will contribute {amount} to Save the Children."),
    "disagree-donation": ("No thanks, I'll pass.", "Sorry, but I won't donate this time.",
                          "I don't want to donate anything today."),
    "disagree-donation-more": ("I'm sorry, I'm not going to donate anything.", "No thank you, I'll pass on this.",
                               "I would rather not give anything."),
    "provide-donation-amount": ("I can give {amount}.", "Let's say I'll donate {amount}.",
                                "I'll contribute {amount} of my payment."),
    "confirm-donation": ("Yes, I confirm: I'll donate {amount}.", "Great, then I will give {amount}.",
                         "Okay, count me in for {amount}."),
    "positive-reaction-to-donation": ("That sounds like a great cause.", "That really matters, I agree.",
                                      "I like what they are doing."),
    "neutral-reaction-to-donation": ("I see.", "Okay, that's interesting.", "Hmm, I had not thought about that."),
    "negative-reaction-to-donation": ("I'm skeptical about big charities.",
                                      "Money is tight for me right now.",
                                      "I'm not sure the money really reaches the children."),
    "positive-to-inquiry": ("Yes, and I like to help when I can.", "Pretty good, thanks for asking!",
                            "I do, it is something I care about."),
    "neutral-to-inquiry": ("Sometimes, it depends.", "A little, I guess.", "So-so, nothing special."),
    "negative-to-inquiry": ("Not really.", "No, not much.", "Nope, I have not."),
    "task-related-inquiry": ("Why this charity in particular?", "Is this part of the study?",
                             "Who are you collecting for exactly?"),
    "personal-related-inquiry": ("What about you?", "Do you have kids?", "Where are you from?"),
    "greeting": ("Hi! I'm doing well, how about you?", "Hello there.", "Good morning to you too!"),
    "thank": ("Thank you for the information.", "Thanks for letting me know.", "Thank you."),
    "acknowledgement": ("Okay.", "Got it.", "Alright, I understand."),
    "closing": ("Have a nice day!", "Goodbye!", "Take care."),
    "you-are-welcome": ("You're welcome.", "No problem.", "Anytime."),
    "off-task": ("The weather is really warm here today.", "I just got back from work.",
                 "This HIT is taking a while."),
    "other": ("Hmm.", "Interesting.", "Haha."),
}


def _pick(options: tuple[str, ...], rng: np.random.Generator | None) -> str:
    """A phrasing chosen by ``rng``; without one, the first (canonical) phrasing, for greedy decoding."""
    return options[0] if rng is None else options[int(rng.integers(len(options)))]


def render_persuader(act: str, rng: np.random.Generator | None) -> str:
    """One phrasing of persuader ``act``, chosen by ``rng`` (None: the canonical phrasing)."""
    return _pick(PERSUADER_TEMPLATES[act], rng)


def render_persuadee(act: str, amount: float | None, rng: np.random.Generator | None) -> str:
    """One phrasing of persuadee ``act`` (None rng: canonical); donating acts need the ``amount`` they state."""
    template = _pick(PERSUADEE_TEMPLATES[act], rng)
    if "{amount}" in template:
        if amount is None or amount <= 0:
            raise ValueError(f"persuadee act {act!r} states a donation: pass its amount (> 0), got {amount!r}")
        template = template.format(amount=format_amount(amount, rng))
    return template


_WORD_AMOUNTS = {0.05: ("5 cents", "a nickel"), 0.1: ("10 cents", "a dime"), 0.25: ("25 cents", "a quarter"),
                 0.5: ("50 cents", "half a dollar"), 1.0: ("one dollar", "a dollar"),
                 1.5: ("a dollar fifty", "$1.50"), 2.0: ("the full $2", "all of it")}


def format_amount(amount: float, rng: np.random.Generator | None) -> str:
    """A phrasing of ``amount`` dollars (digits or words; None rng: digits) that ``parse_donation`` reads back."""
    words = _WORD_AMOUNTS.get(round(amount, 2))
    digits = f"${amount:.2f}" if amount != int(amount) else f"${int(amount)}"
    return _pick((digits, *words) if words else (digits,), rng)
