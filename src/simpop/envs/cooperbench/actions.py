"""The CooperBench action language: JSON objects carried in text actions.

Canonical forms (one JSON object per action)::

    {"type": "message", "text": "I'll add the helper at the end of utils.py"}
    {"type": "view", "path": "pkg/utils.py"}          # a file's content, or a directory's listing
    {"type": "write", "path": "pkg/utils.py", "content": "...whole new file..."}
    {"type": "delete", "path": "pkg/old.py"}
    {"type": "test"}                                  # run your own feature's tests on your copy
    {"type": "submit"}                                # your work is done; your copy becomes your patch

Lenient forms, accepted because models produce them: the object inside a Markdown code fence
(with prose around it); ``"action"`` instead of ``"type"``; ``"message"`` or ``"content"``
instead of ``"text"`` for messages; ``"file"`` instead of ``"path"``; and the bare words
``submit`` and ``test``. Anything else is rejected with a message saying what was expected.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

ACTION_TYPES = ("message", "view", "write", "delete", "test", "submit")

ACTIONS_HELP = """Reply with exactly one JSON object (one action) per turn:
{"type": "message", "text": "..."}                  send a message to your teammate
{"type": "view", "path": "FILE_OR_DIR"}             read a file or list a directory
{"type": "write", "path": "FILE", "content": "..."}  replace a file's whole content (creates it if new)
{"type": "delete", "path": "FILE"}                  delete a file
{"type": "test"}                                    run your feature's tests on your copy
{"type": "submit"}                                  finish: your copy becomes your patch"""

_FENCE_RE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


class ActionError(ValueError):
    """An action that cannot be parsed or is malformed (the message says how to fix it)."""


@dataclass(frozen=True)
class Action:
    """One parsed action (fields unused by its type are None)."""

    type: str
    text: str | None = None
    path: str | None = None
    content: str | None = None

    def to_json(self) -> str:
        """The action in the JSON action language (its set fields only)."""
        payload = {"type": self.type}
        for key in ("text", "path", "content"):
            if getattr(self, key) is not None:
                payload[key] = getattr(self, key)
        return json.dumps(payload, ensure_ascii=False)


def parse_action(text: str) -> Action:
    """Parse one action (canonical or lenient form); raise :class:`ActionError` otherwise."""
    if not isinstance(text, str):
        raise ActionError(f"an action is a string holding a JSON object, got {type(text).__name__}")
    stripped = text.strip()
    if stripped.lower() in ("submit", "test"):
        return Action(stripped.lower())
    obj = _load_object(stripped)
    if obj is None:
        raise ActionError('expected one JSON object such as {"type": "view", "path": "README.md"}; '
                          f"types: {', '.join(ACTION_TYPES)}")
    return _from_object(obj)


def find_action(text: str) -> Action | None:
    """The first valid action anywhere in free text (model output), or None."""
    try:
        return parse_action(text)
    except ActionError:
        pass
    for candidate in _json_objects(text):
        try:
            return _from_object(candidate)
        except ActionError:
            continue
    return None


def _from_object(obj: dict) -> Action:
    kind = obj.get("type", obj.get("action"))
    if not isinstance(kind, str) or kind.lower() not in ACTION_TYPES:
        raise ActionError(f"unknown action type {kind!r}; use one of {', '.join(ACTION_TYPES)}")
    kind = kind.lower()
    path = obj.get("path", obj.get("file"))
    if kind == "message":
        body = next((obj[k] for k in ("text", "message", "content") if k in obj), None)
        if not isinstance(body, str) or not body.strip():
            raise ActionError('a message needs a non-empty "text" string')
        return Action("message", text=body)
    if kind in ("view", "write", "delete"):
        if not isinstance(path, str) or not path.strip():
            raise ActionError(f'a {kind} action needs a "path" string (relative to the repository root)')
        if kind == "write":
            content = obj.get("content")
            if not isinstance(content, str):
                raise ActionError('a write action needs a "content" string (the whole new file)')
            return Action("write", path=path.strip(), content=content)
        return Action(kind, path=path.strip())
    return Action(kind)


def _load_object(text: str) -> dict | None:
    """The JSON object that is ``text``, or the one in its first code fence."""
    for candidate in (text, *(m.group(1).strip() for m in _FENCE_RE.finditer(text))):
        try:
            obj = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def _json_objects(text: str):
    """Every JSON object that starts at some ``{`` in ``text``, in order."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            yield obj
        start = text.find("{", start + 1)
