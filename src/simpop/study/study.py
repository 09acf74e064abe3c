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

**Recruitment platforms.** A join may carry the platform's participant, study and session ids (read by the app
from the join URL's query, :data:`ID_PARAMS`); the study keeps only their keyed hashes
(:func:`~simpop.study.storage.keyed_hash` under the folder's secret) in the ledger and the records, and refuses
a second join with a participant id already in the ledger (also after a restart). With ``require_external_id``
a join without one is refused. A participant who has saved all their chats gets a **completion code**
(:meth:`Study.finish`): an HMAC of their pseudonymous id under the folder's secret, so it cannot be guessed, is
the same each time they ask, and :func:`verify_codes` tells a real code from a forged one.
"""

from __future__ import annotations

import base64
import hmac
import logging
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simpop.study import modes, storage
from simpop.study.chat import Arm, Chat, key_digest, now, reads_instructions

#: Query parameters that carry each platform id in a join URL (Prolific, MTurk, generic), first found wins.
ID_PARAMS: dict[str, list[str]] = {"participant": ["PROLIFIC_PID", "workerId", "participant_id"],
                                   "study": ["STUDY_ID", "hitId", "study_id"],
                                   "session": ["SESSION_ID", "assignmentId", "session_id"]}
TEMPLATES = Path(__file__).with_name("templates")
#: Settings a study has unless given (older study folders and hand-built settings lack them).
DEFAULTS: dict[str, Any] = {
    "participant_mode": "persona", "bonus": None, "questionnaire": [], "consent": None, "debrief": None,
    "id_params": ID_PARAMS, "require_external_id": False, "completion_url": None, "attention_check": False,
    "exclusions": {}, "primary_outcome": "success", "questionnaire_to_policy": False}
#: The instructed-response item shown with the ratings when ``attention_check`` is on: (question, answer).
ATTENTION_ITEM = ("This question checks that you read carefully: please choose 2.", 2)
#: Exclusion rules a study may declare (``exclusions`` in ``study.json``) -> what they mean.
EXCLUSION_RULES = {"min_human_s": "fewer seconds typing over a chat than this",
                   "min_mean_chars": "fewer characters per message, on average over a chat, than this",
                   "attention": "failed the instructed-response item (true to apply)"}

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
        self.out, self.settings, self.arms, self.make_env = Path(out), {**DEFAULTS, **settings}, dict(arms), make_env
        self.idle_timeout_s, self.rating_timeout_s = idle_timeout_s, rating_timeout_s
        saved = storage.open_folder(self.out, self.settings, DEFAULTS)
        self._secret = storage.salt(self.out)
        #: participant id -> (join index, chats started)
        self.participants: dict[str, list[int]] = {}
        #: SHA-256 of a participant's key -> participant id
        self._keys: dict[str, str] = {}
        #: participant id -> their ledger entry: hashed platform ids, questionnaire answers, completed
        self.people: dict[str, dict[str, Any]] = {}
        #: keyed hash of a platform participant id -> participant id
        self._external: dict[str, str] = {}
        self._saved: Counter[str] = Counter(r.member for r in saved)
        for event in storage.read_ledger(self.out):
            self._replay(event)
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

    def _replay(self, event: Mapping[str, Any]) -> None:
        participant = str(event.get("participant"))
        if event.get("event") == "joined":
            self.participants.setdefault(participant, [int(event["index"]), 0])
            self._keys[event["key_sha256"]] = participant
            self.people[participant] = {"external": event.get("external") or {}, "questionnaire": None,
                                        "completed": None}
            if (external := (event.get("external") or {}).get("participant")) is not None:
                self._external[external] = participant
        elif participant in self.people and event.get("event") in ("questionnaire", "completed"):
            self.people[participant][event["event"]] = event.get("answers", event.get("time"))

    def _log(self, event: dict[str, Any]) -> None:
        """Append a ledger event and apply it."""
        storage.append_event(self.out, event)
        self._replay(event)

    # ----------------------------------------------------------------- joining
    def register(self, external: Mapping[str, str] | None = None) -> tuple[str, str]:
        """A new participant (who consented): returns their pseudonymous id and secret key.

        Args:
            external: Platform ids by kind (``participant``, ``study``, ``session``), as the join URL gave them.

        Raises:
            StudyError: The study needs a platform participant id and got none (400), or this one joined
                before (409).
        """
        external = {kind: str(value) for kind, value in (external or {}).items() if value}
        hashed = {kind: storage.keyed_hash(self._secret, kind, value) for kind, value in external.items()}
        with self._lock:
            if "participant" not in hashed and self.settings["require_external_id"]:
                names = " or ".join(self.settings["id_params"]["participant"])
                raise StudyError(f"this link lacks your participant id ({names}): open the study from the "
                                 f"recruitment platform's link", 400)
            if hashed.get("participant") in self._external:
                raise StudyError("this participant id has already taken part in this study (each person may "
                                 "join once; to continue, use the browser you started in)", 409)
            key = secrets.token_urlsafe(18)
            participant = f"p-{secrets.token_hex(4)}"
            while participant in self.participants:
                participant = f"p-{secrets.token_hex(4)}"
            self._log({"event": "joined", "participant": participant, "index": self._next_participant,
                       "key_sha256": key_digest(key), "external": hashed, "time": now(),
                       "mode": self.settings["participant_mode"]})
            self._next_participant += 1
        log.info("participant %s joined", participant)
        return participant, key

    def participant_of(self, key: str | None) -> str | None:
        """The participant holding ``key`` (None when unknown)."""
        return self._keys.get(key_digest(key)) if key else None

    def decline(self) -> None:
        """A visitor declined consent: count it, keep nothing else."""
        with self._lock:
            storage.count(self.out, "declined")

    def needs_questionnaire(self, participant: str | None) -> bool:
        """Whether the participant still has the questionnaire to answer before their first chat."""
        person = self.people.get(participant) if participant else None
        return bool(self.settings["questionnaire"]) and person is not None and person["questionnaire"] is None

    def answer(self, key: str, answers: Mapping[str, Any]) -> None:
        """Record the questionnaire's answers (StudyError: unknown key 403, answered already 409, bad 422)."""
        participant = self.participant_of(key)
        if participant is None:
            raise StudyError("unknown participant: reload the page", 403)
        try:
            checked = modes.check_answers(dict(answers), self.settings["questionnaire"])
        except ValueError as error:
            raise StudyError(str(error), 422) from None
        with self._lock:
            if not self.needs_questionnaire(participant):
                raise StudyError("the questionnaire is already answered (or not asked in this study)")
            self._log({"event": "questionnaire", "participant": participant, "answers": checked, "time": now()})

    def finish(self, key: str) -> dict[str, Any]:
        """The completion code, debrief and redirect of a participant who saved all their chats.

        Raises:
            StudyError: Unknown key (403), or chats left (409).
        """
        participant = self.participant_of(key)
        if participant is None:
            raise StudyError("unknown participant: reload the page", 403)
        with self._lock:
            left = self.settings["chats_per_participant"] - self._saved[participant]
            if left > 0:
                raise StudyError(f"you have {left} chat(s) left before the end of the study")
            if participant in self.people and not self.people[participant]["completed"]:
                self._log({"event": "completed", "participant": participant, "time": now()})
        code = completion_code(self._secret, participant)
        url = self.settings["completion_url"]
        return {"code": code, "debrief": self.settings["debrief"] or "",
                "redirect": url.replace("{code}", code) if url else None}

    def join(self, key: str | None, external: Mapping[str, str] | None = None) -> Chat:
        """The open chat of the participant holding ``key``, or their next one (a new participant, with a new
        key, when ``key`` is unknown or None: :meth:`register` with ``external``). The key is ``chat.key``.

        Raises:
            StudyError: The participant has done all their chats or owes the questionnaire; or :meth:`register`'s.
        """
        self.sweep()
        participant = self.participant_of(key)
        if participant is None:
            participant, key = self.register(external)
        if self.needs_questionnaire(participant):
            raise StudyError("please answer the short questionnaire first", 409)
        with self._lock:
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
        answers = self.people.get(participant, {}).get("questionnaire")
        rng = np.random.default_rng([seed, index])
        order = rng.permutation(len(labels))
        scenario_order = rng.permutation(len(scenarios))
        chat = Chat(chat_id=secrets.token_urlsafe(18), participant=participant, key=key, participant_index=index,
                    number=number, index=self._next_index, arm=self.arms[labels[int(order[number % len(labels)])]],
                    scenario=scenarios[int(scenario_order[number % len(scenarios)])],
                    seed=_seed([seed, 3, index, number]), make_env=self.make_env,
                    idle_timeout_s=self.idle_timeout_s, bonus=self.settings["bonus"]
                    if self.settings["participant_mode"] == "self" else None,
                    briefing=modes.briefing(answers) if self.settings["questionnaire_to_policy"] else None)
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
        record = chat.finish(ratings)
        record.extra["study"]["external"] = self.people.get(chat.participant, {}).get("external", {})
        storage.save_chat(self.out, record)
        chat.saved = True
        self._saved[chat.participant] += 1
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


def completion_code(secret: bytes, participant: str) -> str:
    """The participant's completion code: 75 bits of an HMAC of their id, as ``XXXXX-XXXXX-XXXXX``."""
    text = base64.b32encode(hmac.digest(secret, f"code:{participant}".encode(), "sha256")).decode()[:15]
    return "-".join(text[i:i + 5] for i in range(0, 15, 5))


def verify_codes(out: str | Path, codes: Sequence[str]) -> dict[str, str | None]:
    """Code -> the participant who completed the study with it, or None (forged, mistyped, or not completed)."""
    storage.read_settings(out)  # a study folder, or FileNotFoundError
    secret = storage.salt(out)
    done = [e["participant"] for e in storage.read_ledger(out) if e.get("event") == "completed"]
    issued = {completion_code(secret, p): p for p in done}
    return {code: issued.get(code.strip().upper()) for code in codes}


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
               sampling: Any = None, idle_timeout_s: float = 900.0, rating_timeout_s: float = 900.0,
               participant_mode: str = "persona", bonus: float = 2.0, questionnaire: Sequence[str] = (),
               consent: str | Path | None = None, debrief: str | Path | None = None,
               id_params: Mapping[str, Sequence[str]] | None = None, require_external_id: bool = False,
               completion_url: str | None = None, attention_check: bool = False,
               exclusions: Mapping[str, Any] | None = None, primary_outcome: str = "success",
               questionnaire_to_policy: bool = False) -> Study:
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
        participant_mode: ``persona`` (the scenario's card) or ``self`` (people as themselves; :mod:`.modes`).
        bonus: Self mode: the bonus (dollars) a person may pledge part of.
        questionnaire: Persona attributes to ask before the first chat (:data:`.modes.QUESTIONS`).
        consent: A file with the consent page's text (default: the shipped template, ``templates/consent.md``).
        debrief: A file with the debrief page's text (default: ``templates/debrief.md``).
        id_params: Platform id kind -> query parameter names (default :data:`ID_PARAMS`).
        require_external_id: Refuse a join without a platform participant id.
        completion_url: Where the debrief sends the person (``{code}`` becomes their completion code).
        attention_check: Ask the instructed-response item (:data:`ATTENTION_ITEM`) with each chat's ratings.
        exclusions: The exclusion rules (:data:`EXCLUSION_RULES`) the report applies.
        primary_outcome: ``success``, ``reward`` or a numeric info key (P4G: ``donation``); the report's
            primary paired comparison.
        questionnaire_to_policy: Show each participant's questionnaire answers to the policies, after their
            instructions (:mod:`.chat`); every policy must read its instructions from the observation.

    Raises:
        ValueError, KeyError: Bad settings (unknown scenario, non-text env, bad policy spec, another study in
            ``out``, a mode the env cannot run, an unknown exclusion rule, questionnaire item or outcome, answers
            shown to a policy that cannot read them).
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
    modes.check_mode(env, participant_mode, bonus, list(questionnaire))
    if primary_outcome not in ("success", "reward"):  # else an info key every chat's record holds (from reset on)
        _, infos = env.reset(seed=0)
        keys = sorted(infos[env.policy_seat])
        if primary_outcome not in keys:
            raise ValueError(f"--primary-outcome {primary_outcome!r}: not success, reward or an info key of {env_id} "
                             f"({', '.join(keys)})")
    unknown_rules = sorted(set(exclusions or {}) - set(EXCLUSION_RULES))
    if unknown_rules:
        raise ValueError(f"unknown exclusion rule(s) {unknown_rules}; the rules are {', '.join(EXCLUSION_RULES)}")
    if completion_url is not None and not completion_url.startswith(("https://", "http://")):
        raise ValueError(f"--completion-url must be an http(s) URL, got {completion_url!r}")
    params = {kind: list(names) for kind, names in (id_params or ID_PARAMS).items()}
    if set(params) != set(ID_PARAMS) or not all(params.values()):
        raise ValueError(f"id parameters: give names for each of {', '.join(ID_PARAMS)}")
    count = len(policies) if chats_per_participant is None else chats_per_participant
    if count < 1:
        raise ValueError(f"chats_per_participant must be >= 1, got {count}")
    arms = {label: Arm(label, spec, load_policy(spec, env, env_id=env_id, sampling=sampling))
            for label, spec in policies.items()}
    if questionnaire_to_policy:
        if not questionnaire:
            raise ValueError("--questionnaire-to-policy shows the questionnaire's answers: ask some with --questionnaire")
        blind = [f"{arm.label}={arm.spec}" for arm in arms.values() if not reads_instructions(arm.policy, env)]
        if blind:
            raise ValueError(f"--questionnaire-to-policy: policy {', '.join(blind)} cannot be shown the answers (it does "
                             f"not read its instructions: act-level, reference and module:attr policies do not); use "
                             f"a text model (smollm2, hf:PATH, openai:..., vllm:..., a text run:DIR) or leave it off")
    settings = {"env": env_id, "env_kwargs": json_safe(kwargs), "policies": dict(policies), "scenarios": chosen,
                "seed": int(seed), "chats_per_participant": count, "participant_mode": participant_mode,
                "bonus": float(bonus) if participant_mode == "self" else None,
                "questionnaire": modes.check_questionnaire(list(questionnaire)),
                "consent": _page_text(consent, "consent"), "debrief": _page_text(debrief, "debrief"),
                "id_params": params, "require_external_id": bool(require_external_id),
                "completion_url": completion_url, "attention_check": bool(attention_check),
                "exclusions": dict(exclusions or {}), "primary_outcome": primary_outcome,
                "questionnaire_to_policy": bool(questionnaire_to_policy)}
    return Study(out, settings, arms, lambda: make(env_id, **kwargs), idle_timeout_s=idle_timeout_s,
                 rating_timeout_s=rating_timeout_s)


def _page_text(path: str | Path | None, page: str) -> str:
    """The text of the consent or debrief page: the researcher's file, else the shipped template."""
    file = Path(path) if path is not None else TEMPLATES / f"{page}.md"
    if path is None:
        log.warning("using the shipped %s template (%s): give your ethics board's text with --%s FILE",
                    page, file, page)
    try:
        text = file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--{page} {file}: not a readable UTF-8 text file ({type(error).__name__})") from None
    if not text:
        raise ValueError(f"--{page} {file} is empty")
    return text
