"""A study folder: settings, chats, the participant ledger, the salt and the decline count.

- ``study.json``: the settings (:class:`~simpop.study.study.Study`), written when the study opens. Once a
  participant has joined, a restart with other settings is refused (the exclusion rules, consent text and
  every other setting are fixed from the first participant on); before that they may still change.
- ``episodes.jsonl``: one record per chat, ``simpop eval``'s format, appended with
  :func:`simpop.evaluation.eval_records.append_records` (one write, flushed and fsynced) and read with
  :func:`~simpop.evaluation.eval_records.read_records`, so ``simpop eval``'s tools read a study's chats too.
- ``participants.jsonl``: the ledger, one JSON event per line (``joined`` with the salted hashes of the
  platform ids, ``questionnaire``, ``completed``), appended the same way; it makes one platform id join only
  once, across restarts.
- ``salt``: the study's secret (random, made once): it salts the platform ids' hashes and keys the
  completion codes. It is never written to ``episodes.jsonl`` or the reports.
- ``counts.json``: how many visitors declined consent (nothing else about them is kept).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from pathlib import Path
from typing import Any

from simpop.evaluation.eval_records import EPISODES, append_records, read_records
from simpop.evaluation.panel import EpisodeRecord
from simpop.files import append_durably, write_atomically

SETTINGS = "study.json"
LEDGER = "participants.jsonl"
SALT = "salt"
COUNTS = "counts.json"


def open_folder(out: str | Path, settings: dict[str, Any], defaults: dict[str, Any] | None = None) -> list[EpisodeRecord]:
    """Create ``out`` or continue the study in it; write ``study.json``; return the saved chats.

    A setting a saved ``study.json`` lacks (written before the setting existed) counts as its ``defaults`` value.

    Raises:
        ValueError: ``out`` holds a study that people joined under other settings, or something that is not
            a study.
    """
    out = Path(out)
    path = out / SETTINGS
    if path.exists():
        saved = {**(defaults or {}), **json.loads(path.read_text(encoding="utf-8"))}
        changed = [f"{k}: {_short(saved.get(k))} -> {_short(settings.get(k))}"
                   for k in sorted(set(saved) | set(settings)) if saved.get(k) != settings.get(k)]
        if changed and (read_ledger(out) or (out / EPISODES).exists()):
            raise ValueError(f"{out} holds a study that participants joined under other settings "
                             f"({'; '.join(changed)}); settings (exclusion rules included) are fixed once the "
                             f"first participant joins: use another --out")
    elif (out / EPISODES).exists():
        raise ValueError(f"{out} holds {EPISODES} but no {SETTINGS}: not a study folder; use another --out")
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(settings, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return read_records(out / EPISODES, repair=True)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_settings(out: str | Path) -> dict[str, Any]:
    """``study.json`` of a study folder (FileNotFoundError names what is missing)."""
    path = Path(out) / SETTINGS
    if not path.is_file():
        raise FileNotFoundError(f"{out} is not a study folder (no {SETTINGS}); run simpop study serve --out {out}")
    return json.loads(path.read_text(encoding="utf-8"))


def read_chats(out: str | Path) -> list[EpisodeRecord]:
    """Every saved chat of the study in ``out``, in file order."""
    return [r for r in read_records(Path(out) / EPISODES) if isinstance(r.extra.get("study"), dict)]


def save_chat(out: str | Path, record: EpisodeRecord) -> None:
    """Append one finished chat."""
    append_records(Path(out) / EPISODES, [record])


# ----------------------------------------------------------------- the ledger, the salt, the counts
def append_event(out: str | Path, event: dict[str, Any]) -> None:
    """Append one ledger event in one write, flushed and fsynced."""
    append_durably(Path(out) / LEDGER, json.dumps(event, sort_keys=True, ensure_ascii=False) + "\n")


def read_ledger(out: str | Path) -> list[dict[str, Any]]:
    """The ledger's events in order (a last line cut by a kill is skipped)."""
    path = Path(out) / LEDGER
    if not path.is_file():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def salt(out: str | Path) -> bytes:
    """The study's secret, made (32 random bytes, hex, mode 600) on first use."""
    path = Path(out) / SALT
    if not path.exists():
        write_atomically(path, secrets.token_hex(32) + "\n")  # a temporary file is mode 600
    return bytes.fromhex(path.read_text().strip())


def keyed_hash(secret: bytes, kind: str, value: str) -> str:
    """HMAC-SHA256 of ``kind:value`` under the study's secret (hex)."""
    return hmac.new(secret, f"{kind}:{value}".encode(), hashlib.sha256).hexdigest()


def count(out: str | Path, name: str) -> int:
    """Add one to ``counts.json[name]``; return the new count."""
    path = Path(out) / COUNTS
    counts = read_counts(out)
    counts[name] = counts.get(name, 0) + 1
    write_atomically(path, json.dumps(counts, sort_keys=True) + "\n")
    return counts[name]


def read_counts(out: str | Path) -> dict[str, int]:
    """``counts.json`` (empty when absent)."""
    path = Path(out) / COUNTS
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
