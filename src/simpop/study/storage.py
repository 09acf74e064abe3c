"""A study folder: ``study.json`` (settings) and ``episodes.jsonl`` (one record per chat, ``simpop eval``'s format).

Records are appended with :func:`simpop.evaluation.eval_run.append_records` (one write, flushed and fsynced)
and read with :func:`~simpop.evaluation.eval_run.read_records`, so ``simpop eval``'s tools read a study's
chats too. A server restarted on the same folder continues the study when its settings are the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simpop.evaluation.eval_run import EPISODES, append_records, read_records
from simpop.evaluation.panel import EpisodeRecord

SETTINGS = "study.json"
#: Settings a continued study must share with the study in its folder.
_CONTINUE_KEYS = ("env", "env_kwargs", "policies", "scenarios", "seed", "chats_per_participant")


def open_folder(out: str | Path, settings: dict[str, Any]) -> list[EpisodeRecord]:
    """Create ``out`` or continue the study in it (same settings); write ``study.json``; return the saved chats.

    Raises:
        ValueError: ``out`` holds a study with other settings, or something that is not a study.
    """
    out = Path(out)
    path = out / SETTINGS
    if path.exists():
        saved = json.loads(path.read_text(encoding="utf-8"))
        changed = [f"{k}: {saved.get(k)!r} -> {settings[k]!r}" for k in _CONTINUE_KEYS if saved.get(k) != settings[k]]
        if changed:
            raise ValueError(f"{out} holds a study with other settings ({'; '.join(changed)}); use another --out")
    elif (out / EPISODES).exists():
        raise ValueError(f"{out} holds {EPISODES} but no {SETTINGS}: not a study folder; use another --out")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return read_records(out / EPISODES, repair=True)


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
