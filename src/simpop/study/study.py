"""The study: its policies (arms), blinded assignment of participants to chats, and saving the chats.

**Participants.** Each participant gets a pseudonymous id (random, ``p-`` + 8 hex digits; nothing about the
person; the records' ``member``) and a secret key (144 random bits) that their page keeps and sends to join
again: the key, not the id, is the capability for the participant's chats (the study keeps only its SHA-256,
in the records, so a restarted study still knows it). A join with an unknown key makes a new participant.

**Assignment.** Each participant has a join index (the next unused one, also after a restart). Participant ``i``'s
arm order is a permutation of the arms drawn from ``(seed, i)``; their ``k``-th chat plays arm ``order[k % arms]``
on the ``k``-th scenario of a permutation of the study's scenarios drawn from ``(seed, i)``, with an env seed from
``(seed, i, k)``. With ``chats_per_participant`` equal to the number of arms (the default) every participant talks
to every policy once, in random order (a within-participant design: ``simpop study report`` pairs a participant's
chats). The page never learns which arm a chat plays.

**Saving.** A chat is saved once: when the person rates it, or (ratings None) when it was abandoned or left
unrated for ``rating_timeout_s``, or when the server stops (:meth:`Study.close`).
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simpop.study import storage
from simpop.study.chat import Arm, Chat, key_digest

log = logging.getLogger(__name__)


class StudyError(Exception):
    """A request the study refuses (the message is shown to the person); ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.status = status


def _seed(entropy: list[int]) -> int:
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


class Study:
    """A running study (module docstring).

    Args:
        out: The study folder (:mod:`simpop.study.storage`).
        settings: What ``study.json`` records: ``env``, ``env_kwargs``, ``policies`` (label -> spec),
            ``scenarios``, ``seed``, ``chats_per_participant``.
        arms: The loaded policies, by label (the same labels as ``settings["policies"]``).
        make_env: Builds one env of the study.
        idle_timeout_s: A chat whose person does not answer for this long is abandoned.
        rating_timeout_s: A finished chat not rated within this long is saved without ratings.
    """

    def __init__(self, out: str | Path, settings: Mapping[str, Any], arms: Mapping[str, Arm],
                 make_env: Callable[[], Any], *, idle_timeout_s: float = 900.0, rating_timeout_s: float = 900.0):
        if list(arms) != list(settings["policies"]):
            raise ValueError(f"arms {list(arms)} do not match the settings' policies {list(settings['policies'])}")
        if not settings["scenarios"]:
            raise ValueError("a study needs at least one scenario")
        self.out, self.settings, self.arms, self.make_env = Path(out), dict(settings), dict(arms), make_env
        self.idle_timeout_s, self.rating_timeout_s = idle_timeout_s, rating_timeout_s
        saved = storage.open_folder(self.out, self.settings)
        #: participant id -> (join index, chats started)
        self.participants: dict[str, list[int]] = {}
        #: SHA-256 of a participant's key -> participant id
        self._keys: dict[str, str] = {}
        for record in saved:
            study = record.extra.get("study") or {}
            entry = self.participants.setdefault(record.member, [int(study.get("participant_index", 0)), 0])
            entry[1] = max(entry[1], record.trial + 1)
            if isinstance(study.get("key_sha256"), str):
                self._keys[study["key_sha256"]] = record.member
        self.chats: dict[str, Chat] = {}
        self._next_index = max((r.index for r in saved), default=-1) + 1
        # Join indices of participants who never saved a chat leave gaps: a new one gets the next unused index.
        self._next_participant = max((entry[0] for entry in self.participants.values()), default=-1) + 1
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- joining
    def join(self, key: str | None) -> Chat:
        """The open chat of the participant holding ``key``, or their next one (a new participant, with a new
        key, when ``key`` is unknown or None). The participant's key is ``chat.key``.

        Raises:
            StudyError: The participant has done all their chats.
        """
        self.sweep()
        with self._lock:
            participant = self._keys.get(key_digest(key)) if key else None
            if participant is None:
                key = secrets.token_urlsafe(18)
                participant = f"p-{secrets.token_hex(4)}"
                while participant in self.participants:
                    participant = f"p-{secrets.token_hex(4)}"
                self._keys[key_digest(key)] = participant
                self.participants[participant] = [self._next_participant, 0]
                self._next_participant += 1
            open_chat = next((c for c in self.chats.values() if c.participant == participant and not c.saved), None)
            if open_chat is not None:
                return open_chat
            index, number = self.participants[participant]
            if number >= self.settings["chats_per_participant"]:
                raise StudyError("You have finished every chat of this study. Thank you!", 410)
            chat = self._new_chat(participant, key, index, number)  # type: ignore[arg-type]
            self.participants[participant][1] += 1
            self.chats[chat.id] = chat
        log.info("chat %d started (participant %s, chat %d)", chat.index, participant, number)
        chat.start()
        return chat

    def _new_chat(self, participant: str, key: str, index: int, number: int) -> Chat:
        labels, scenarios, seed = list(self.arms), list(self.settings["scenarios"]), int(self.settings["seed"])
        rng = np.random.default_rng([seed, index])
        order = rng.permutation(len(labels))
        scenario_order = rng.permutation(len(scenarios))
        chat = Chat(chat_id=secrets.token_urlsafe(18), participant=participant, key=key, participant_index=index,
                    number=number, index=self._next_index, arm=self.arms[labels[int(order[number % len(labels)])]],
                    scenario=scenarios[int(scenario_order[number % len(scenarios)])],
                    seed=_seed([seed, 3, index, number]), make_env=self.make_env,
                    idle_timeout_s=self.idle_timeout_s)
        self._next_index += 1
        return chat

    def chat(self, chat_id: str) -> Chat:
        """The chat with this id (StudyError 404 if none)."""
        chat = self.chats.get(chat_id)
        if chat is None:
            raise StudyError("unknown chat; reload the page to join again", 404)
        return chat

    # ----------------------------------------------------------------- saving
    def rate(self, chat: Chat, ratings: Mapping[str, Any]) -> None:
        """Save the chat with the person's ratings (StudyError if it runs or was saved)."""
        with self._lock:
            if not chat.done:
                raise StudyError("the chat is still running")
            if chat.saved:
                raise StudyError("this chat is already rated")
            self._save(chat, dict(ratings))

    def _save(self, chat: Chat, ratings: dict[str, Any] | None) -> None:
        storage.save_chat(self.out, chat.finish(ratings))
        chat.saved = True
        log.info("chat %d saved (%s)", chat.index, "rated" if ratings is not None else "without ratings")

    def sweep(self) -> None:
        """Save abandoned chats and chats left unrated for ``rating_timeout_s`` (without ratings)."""
        with self._lock:
            for chat in list(self.chats.values()):
                if not chat.saved and chat.done and (chat.abandoned or chat.ended_for() >= self.rating_timeout_s):
                    self._save(chat, None)
                if chat.saved:
                    del self.chats[chat.id]

    def close(self) -> None:
        """Stop every running chat and save every unsaved one (the server is stopping)."""
        for chat in list(self.chats.values()):
            if not chat.done:
                chat.close()
        with self._lock:
            for chat in list(self.chats.values()):
                if chat.done and not chat.saved:
                    self._save(chat, None)


def check_text_user_seat(env: Any) -> None:
    """A person types messages: the user seat must take text (ValueError otherwise)."""
    from gymnasium import spaces

    if not isinstance(env.action_space(env.user_seat), spaces.Text):
        raise ValueError(f"{type(env).__name__}'s user seat takes {env.action_space(env.user_seat)}, not text: a "
                         f"person can only play a text env (e.g. simpop/Persuasion-v1, simpop/Tau2-mock-v0)")


def parse_policies(items: Sequence[str]) -> dict[str, str]:
    """``["A=SPEC", "B=SPEC"]`` -> ``{"A": "SPEC", ...}`` (ValueError on a bad or repeated label)."""
    policies: dict[str, str] = {}
    for item in items:
        label, sep, spec = item.partition("=")
        label, spec = label.strip(), spec.strip()
        if not sep or not label or not spec or not label.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"--policy {item!r}: write LABEL=SPEC, e.g. A=run:runs/grpo (labels: letters, digits)")
        if label in policies:
            raise ValueError(f"--policy: label {label!r} given twice")
        policies[label] = spec
    if len(policies) < 1:
        raise ValueError("give at least one --policy LABEL=SPEC (two or more for a comparison)")
    return policies


def open_study(out: str | Path, env_id: str, policies: Mapping[str, str], *, scenarios: Sequence[str] | None = None,
               seed: int = 0, chats_per_participant: int | None = None, env_kwargs: Mapping[str, Any] | None = None,
               sampling: Any = None, idle_timeout_s: float = 900.0, rating_timeout_s: float = 900.0) -> Study:
    """Build the env, check it, load the policies and open (or continue) the study in ``out``.

    Args:
        out: The study folder.
        env_id: A registered text env.
        policies: Label -> policy spec (``simpop eval``'s forms).
        scenarios: Scenario ids to draw from (default: every scenario of the env).
        seed: Derives the assignment, scenarios and env seeds.
        chats_per_participant: Chats each participant has (default: one per policy).
        env_kwargs: Env constructor arguments.
        sampling: Decoding of text policies (:class:`~simpop.agents.base.SamplingParams`; default ``simpop eval``'s).
        idle_timeout_s: A chat whose person does not answer for this long is abandoned.
        rating_timeout_s: A finished chat not rated within this long is saved without ratings.

    Raises:
        ValueError, KeyError: Bad settings (unknown scenario, non-text env, bad policy spec, another study in ``out``).
    """
    from simpop.envs.registration import make
    from simpop.evaluation.panel import json_safe
    from simpop.evaluation.policies import load_policy

    kwargs = dict(env_kwargs or {})
    env = make(env_id, **kwargs)
    check_text_user_seat(env)
    known = env.scenario_ids()
    chosen = list(scenarios) if scenarios else known
    unknown = [s for s in chosen if s not in set(known)]
    if unknown:
        raise KeyError(f"unknown scenario(s) {unknown[:5]} for {env_id}; it has {len(known)} (e.g. {known[:3]})")
    count = len(policies) if chats_per_participant is None else chats_per_participant
    if count < 1:
        raise ValueError(f"chats_per_participant must be >= 1, got {count}")
    arms = {label: Arm(label, spec, load_policy(spec, env, env_id=env_id, sampling=sampling))
            for label, spec in policies.items()}
    settings = {"env": env_id, "env_kwargs": json_safe(kwargs), "policies": dict(policies), "scenarios": chosen,
                "seed": int(seed), "chats_per_participant": count}
    return Study(out, settings, arms, lambda: make(env_id, **kwargs), idle_timeout_s=idle_timeout_s,
                 rating_timeout_s=rating_timeout_s)
