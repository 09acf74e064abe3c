"""``episodes.jsonl``, an evaluation's store: one :class:`~simpop.evaluation.panel.EpisodeRecord` per line, appended a
chunk at a time (one write, flushed and fsynced: a kill loses at most the chunk in flight) and read back with torn lines
dropped. ``simpop eval``, ``simpop eval compare`` and ``simpop study`` read and write it."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from simpop.evaluation.panel import EpisodeRecord
from simpop.files import append_durably, write_atomically

log = logging.getLogger(__name__)

EPISODES = "episodes.jsonl"


def read_records(path: str | Path, repair: bool = False) -> list[EpisodeRecord]:
    """Every complete record in ``episodes.jsonl`` (first of any repeated key), in file order.

    A line that does not parse (a write torn by a kill, cut inside a multi-byte character or not; a record whose
    fields have the wrong types) is dropped with a warning; with ``repair`` the file is rewritten atomically
    without it, so that later appends start on a fresh line.
    """
    path = Path(path)
    if not path.exists():
        return []
    records, keys, kept, dropped = [], set(), [], 0
    raw = path.read_bytes()
    for data in raw.split(b"\n"):
        if not data.strip():
            continue
        try:  # a torn line may end inside a multi-byte character, or hold a record with the wrong field types
            line = data.decode("utf-8")
            record = EpisodeRecord.from_json(line)
        except (ValueError, TypeError):
            dropped += 1
            continue
        if record.key in keys:
            continue
        keys.add(record.key)
        records.append(record)
        kept.append(line)
    if dropped:
        log.warning("%s: dropped %d unreadable line(s) (a write cut short by a kill); those episodes run again",
                    path, dropped)
    if repair and (dropped or (raw and not raw.endswith(b"\n"))):
        write_atomically(path, "".join(line + "\n" for line in kept))
    return records


def append_records(path: str | Path, records: Iterable[EpisodeRecord]) -> None:
    """Append ``records`` in one write, flushed and fsynced."""
    append_durably(path, "".join(r.to_json() + "\n" for r in records))

