"""Validation of chats (lists of ``{"role", "content"}`` messages), shared by every backend."""

from __future__ import annotations

from typing import Any

from simpop.agents.base import Chat


def check_chat(chat: Any) -> Chat:
    """Return ``chat`` if it is a non-empty list of ``{"role": str, "content": str}`` messages.

    Raises:
        ValueError: Naming the first malformed message.
    """
    if not isinstance(chat, list) or not chat:
        raise ValueError("a chat is a non-empty list of {'role': ..., 'content': ...} messages")
    for index, message in enumerate(chat):
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise ValueError(f"message {index} is {message!r}; expected {{'role': str, 'content': str}}")
    return chat
