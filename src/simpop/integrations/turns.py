"""A seat's next chat message from its text observation: shared by the adapters whose agents chat (verifiers, verl)."""

from __future__ import annotations

from simpop.envs.dialogue import parse_observation
from simpop.seat import SURVEY_KEY

#: The opening user message of a seat that speaks first (a chat model needs one; simpop's own seats see none).
KICKOFF = "(The conversation starts now. Write your first message.)"


def next_message(observation: str) -> str:
    """What the other seat said since this seat's last turn, the env's note when this seat's last message was
    rejected, and the closing-survey question when it is asked (as simpop's own LLM seats see them); else KICKOFF."""
    view = parse_observation(observation)
    messages = view["messages"]
    start = max((i + 1 for i, m in enumerate(messages) if m["role"] == "assistant"), default=0)
    parts = [m["content"] for m in messages[start:]]
    if view.get("error"):
        parts.append(f"(Your last message was not accepted: {view['error']} Please answer again.)")
    survey = view.get(SURVEY_KEY)
    if isinstance(survey, dict) and isinstance(survey.get("question"), str):
        parts.append(survey["question"])
    return "\n\n".join(parts) if parts else KICKOFF


def instructions(observation: str) -> str | None:
    """The seat's system prompt: its ``instructions`` in the text observation (None where the env gives none)."""
    return parse_observation(observation).get("instructions")
