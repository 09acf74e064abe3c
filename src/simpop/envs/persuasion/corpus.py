"""Loader for the real Persuasion-for-Good files, and fitting the native persuadee to them.

Files in one directory (the corpus is not shipped; point ``load_corpus`` at a copy):

- ``full_dialog.csv`` (required): one sentence a row; columns ``Unit`` (text), ``Turn``, ``B4`` (role:
  0 persuader, 1 persuadee), ``B2`` (dialogue id). Other columns (the real file starts with an unnamed
  index) are ignored.
- ``full_info.csv`` (required): two rows per dialogue (one per role); ``B2``, ``B3`` (user id), ``B4``,
  ``B6`` (actual donation after the task), ``B7`` (turns), and the 32 persona columns. Persona columns
  are named like :data:`~simpop.envs.persuasion.personas.PERSONA_FIELDS` (``extrovert`` ...
  ``ideology``); the real file spells them with a ``.x`` suffix (``extrovert.x``), accepted too.
- ``300_dialog.xlsx`` (optional, needs ``openpyxl``): the annotated dialogues, same columns plus
  ``er_label_1``, ``ee_label_1`` (most salient act) and optionally ``er_label_2``, ``ee_label_2``
  and sentiment columns. Its rows replace those dialogues' rows from ``full_dialog.csv``.
- ``300_info.xlsx`` (optional): ``B2``, ``B4``, ``B5`` (intended donation stated in the chat).

A missing file or column, or a malformed number, raises :class:`CorpusError` naming the file, column
and row. An empty/``NA`` persona cell never costs the dialogue (nor its outcome): it is imputed with that
attribute's median (numbers) or most frequent value (categories; ties: the first in sort order) over the
corpus's persuadee rows that have it (the default sampler's modal value if none has), listed in
:attr:`Dialogue.imputed` (:attr:`Dialogue.persuader_imputed` for the persuader's row) and named, dialogue id
and column, in one warning. Dialogues without a persuadee info row or with an empty donation (``B6``, the
outcome itself) or a donation above the $2 task payment (the real file has 35 such rows, up to 700: not
donations the task allowed) are skipped, counted in :attr:`Corpus.skipped` and named in a warning (an empty
``B7`` is replaced by the turns counted).
"""

from __future__ import annotations

import csv
import functools
import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from collections.abc import Iterable, Iterator

import numpy as np

from simpop.envs.persuasion.acts import PERSUADEE_ACTS, PERSUADER_ACTS, STRATEGIES
from simpop.envs.persuasion.model import AMOUNT_LEVELS, PersuadeeParams, calibrate
from simpop.envs.persuasion.personas import (CATEGORICAL, PERSONA_FIELDS, EmpiricalPersonaSampler, Persona,
                                             modal_persona)

log = logging.getLogger(__name__)

FULL_DIALOG, FULL_INFO = "full_dialog.csv", "full_info.csv"
ANNOTATED_DIALOG, ANNOTATED_INFO = "300_dialog.xlsx", "300_info.xlsx"
ROLES = {0: "persuader", 1: "persuadee"}
#: Annotated persuader labels outside the 14 modelled acts that have a modelled equivalent.
ER_LABEL_ALIASES = {"thank": "closing", "you-are-welcome": "closing", "ask-donate-more": "ask-donation-amount",
                    "confirm-donation": "ask-donation-amount"}
_MISSING = {"", "na", "nan", "none", "null"}
#: What a persuadee could give: their task payment, in dollars (the real B6 column holds a few larger numbers).
TASK_PAYMENT = AMOUNT_LEVELS[-1]
#: Dialogue ids (and imputed cells) named in one warning before it says "and N more".
_NAMED_IN_WARNING = 10


class CorpusError(ValueError):
    """A corpus file is missing or malformed (the message names the file, column and row)."""


@dataclass(frozen=True)
class Utterance:
    """One corpus row (a sentence). ``labels`` are its annotated acts (empty outside the annotated set)."""

    turn: int
    role: str
    text: str
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class Dialogue:
    """One P4G dialogue.

    Attributes:
        id: ``B2``.
        utterances: Rows in order.
        persuadee_persona: The persuadee's 32 attributes.
        persuader_persona: The persuader's, when its row is complete.
        donation: The persuadee's actual donation (``B6``) in dollars.
        intended: The donation stated in the chat (``B5``; annotated set only).
        n_turns: ``B7``.
        imputed: Persuadee persona attributes whose cells were empty/``NA`` and were imputed (see the
            module docstring); empty when the row was complete.
        persuader_imputed: The same for the persuader's row.
    """

    id: str
    utterances: tuple[Utterance, ...]
    persuadee_persona: Persona
    persuader_persona: Persona | None
    donation: float
    intended: float | None
    n_turns: int
    imputed: tuple[str, ...] = ()
    persuader_imputed: tuple[str, ...] = ()

    @property
    def donated(self) -> bool:
        return self.donation > 0

    @property
    def annotated(self) -> bool:
        return any(u.labels for u in self.utterances)


@dataclass(frozen=True)
class Corpus:
    """The loaded dialogues; ``skipped`` counts dialogues left out for a missing info row or donation."""

    dialogues: tuple[Dialogue, ...]
    skipped: int = 0

    @property
    def annotated(self) -> tuple[Dialogue, ...]:
        return tuple(d for d in self.dialogues if d.annotated)

    @property
    def imputed(self) -> tuple[Dialogue, ...]:
        """Dialogues whose persuadee persona has imputed attributes."""
        return tuple(d for d in self.dialogues if d.imputed)

    @property
    def donor_rate(self) -> float:
        return float(np.mean([d.donated for d in self.dialogues]))

    @property
    def mean_donation(self) -> float:
        return float(np.mean([d.donation for d in self.dialogues]))

    def personas(self) -> list[Persona]:
        """The persuadees' personas, one per dialogue."""
        return [d.persuadee_persona for d in self.dialogues]

    def persona_sampler(self) -> EmpiricalPersonaSampler:
        """A sampler that resamples the corpus's persuadee personas."""
        return EmpiricalPersonaSampler(self.personas())

    def resample(self, seed: int, index: int) -> Corpus:
        """Bootstrap resample ``index`` of the dialogues (generator seeded with ``[seed, index]``)."""
        rng = np.random.default_rng([seed, index])
        n = len(self.dialogues)
        return Corpus(tuple(self.dialogues[i] for i in rng.integers(n, size=n)))


# ---------------------------------------------------------------------------------------------- reading
class _Table:
    """Rows of one file as dicts, with column checks and typed access that name the file on error."""

    def __init__(self, path: Path, header: list[str], rows: list[list[str]]):
        self.path, self.header, self.rows = path, header, rows
        self.index = {name: i for i, name in enumerate(header)}

    def require(self, *columns: str) -> None:
        for column in columns:
            if column not in self.index:
                raise CorpusError(f"{self.path.name}: missing column {column!r} (found {', '.join(self.header)})")

    def column(self, *names: str) -> str:
        """The first of ``names`` present in the header."""
        for name in names:
            if name in self.index:
                return name
        raise CorpusError(f"{self.path.name}: missing column {' or '.join(repr(n) for n in names)}")

    def records(self) -> Iterator[tuple[int, dict[str, str]]]:
        for n, row in enumerate(self.rows, start=2):
            yield n, {name: (row[i] if i < len(row) else "") for name, i in self.index.items()}

    def number(self, record: dict[str, str], column: str, row: int, optional: bool = False) -> float | None:
        raw = record[column].strip()
        if raw.lower() in _MISSING:
            if optional:
                return None
            raise CorpusError(f"{self.path.name}: row {row}, column {column!r} is empty; expected a number")
        try:
            value = float(raw)
        except ValueError:
            raise CorpusError(f"{self.path.name}: row {row}, column {column!r} has {raw!r}; expected a number") from None
        if not math.isfinite(value):
            raise CorpusError(f"{self.path.name}: row {row}, column {column!r} has {raw!r}; expected a finite number")
        return value


def _read_csv(path: Path) -> _Table:
    if not path.is_file():
        raise CorpusError(f"{path.name}: not found in {path.parent} (P4G corpus files: {FULL_DIALOG}, {FULL_INFO})")
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except (UnicodeDecodeError, csv.Error) as e:
        raise CorpusError(f"{path.name}: not a readable UTF-8 CSV file ({e})") from None
    if not rows:
        raise CorpusError(f"{path.name}: empty file (expected a header row)")
    return _Table(path, [h.strip() for h in rows[0]], rows[1:])


def _read_xlsx(path: Path) -> _Table:
    try:
        import openpyxl
    except ImportError:
        raise ImportError(f"reading {path.name} needs openpyxl: pip install openpyxl (or simpop[all])") from None
    try:
        book = openpyxl.load_workbook(path, read_only=True, data_only=True)
    except Exception as e:  # openpyxl raises several unrelated types for a damaged file
        raise CorpusError(f"{path.name}: not a readable .xlsx workbook ({type(e).__name__}: {e})") from None
    try:
        rows = [["" if v is None else str(v) for v in row] for row in book.active.iter_rows(values_only=True)]
    finally:
        book.close()
    if not rows:
        raise CorpusError(f"{path.name}: empty sheet (expected a header row)")
    return _Table(path, [h.strip() for h in rows[0]], rows[1:])


def _persona(table: _Table, record: dict[str, str], row: int, columns: dict[str, str],
             fill: dict[str, object]) -> tuple[Persona, tuple[str, ...]]:
    """The row's persona and the attributes whose empty/NA cells were filled from ``fill``; malformed values raise."""
    values: dict[str, object] = {}
    missing: list[str] = []
    for name, column in columns.items():
        raw = record[column].strip()
        if raw.lower() in _MISSING:
            missing.append(name)
            values[name] = fill[name]
        else:
            values[name] = raw if name in CATEGORICAL else table.number(record, column, row)
    try:
        return Persona.from_mapping(values), tuple(missing)
    except ValueError as e:
        raise CorpusError(f"{table.path.name}: row {row}: {e}") from None


def _imputation(table: _Table, rows: list[tuple[dict[str, str], int]], columns: dict[str, str]) -> dict[str, object]:
    """Each attribute's fill value: the median (numbers) or most frequent value (categories) over ``rows``
    that have it, else the default sampler's modal value."""
    default = modal_persona()
    fill: dict[str, object] = {}
    for name, column in columns.items():
        present = [(record, row) for record, row in rows if record[column].strip().lower() not in _MISSING]
        if not present:
            fill[name] = getattr(default, name)
        elif name in CATEGORICAL:
            column_values = [record[column].strip() for record, _ in present]
            fill[name] = max(sorted(set(column_values)), key=column_values.count)
        else:
            fill[name] = float(np.median([table.number(record, column, row) for record, row in present]))
    return fill


def _named(items: list[str]) -> str:
    shown = "; ".join(items[:_NAMED_IN_WARNING])
    return shown + (f"; and {len(items) - _NAMED_IN_WARNING} more" if len(items) > _NAMED_IN_WARNING else "")


def _utterances(table: _Table, labelled: bool) -> dict[str, list[Utterance]]:
    table.require("Unit", "Turn", "B4", "B2")
    label_columns: dict[int, list[str]] = {0: [], 1: []}
    if labelled:
        table.require("er_label_1", "ee_label_1")
        label_columns = {0: [c for c in ("er_label_1", "er_label_2") if c in table.index],
                         1: [c for c in ("ee_label_1", "ee_label_2") if c in table.index]}
    out: dict[str, list[Utterance]] = {}
    for row, record in table.records():
        if not any(v.strip() for v in record.values()):
            continue
        role = int(table.number(record, "B4", row))  # type: ignore[arg-type]  # required: never None
        if role not in ROLES:
            raise CorpusError(f"{table.path.name}: row {row}, column 'B4' has {record['B4']!r}; expected 0 or 1")
        labels = tuple(_normalise_label(record[c]) for c in label_columns[role] if record[c].strip().lower()
                       not in _MISSING)
        out.setdefault(record["B2"].strip(), []).append(
            Utterance(int(table.number(record, "Turn", row)), ROLES[role], record["Unit"], labels))  # type: ignore[arg-type]
    return out


def _normalise_label(label: str) -> str:
    return "-".join(label.strip().lower().replace("_", " ").split())


def load_corpus(directory: str | Path) -> Corpus:
    """Read the P4G files in ``directory`` (see the module docstring)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CorpusError(f"corpus directory {directory} does not exist; it must hold {FULL_DIALOG} and {FULL_INFO}")
    utterances = _utterances(_read_csv(directory / FULL_DIALOG), labelled=False)
    info = _read_csv(directory / FULL_INFO)
    info.require("B2", "B3", "B4", "B6", "B7")
    persona_columns = {name: info.column(name, f"{name}.x") for name in PERSONA_FIELDS}

    annotated_path = directory / ANNOTATED_DIALOG
    if annotated_path.exists():
        utterances.update(_utterances(_read_xlsx(annotated_path), labelled=True))
    intended: dict[str, float | None] = {}
    intended_path = directory / ANNOTATED_INFO
    if intended_path.exists():
        table = _read_xlsx(intended_path)
        table.require("B2", "B4", "B5")
        for row, record in table.records():
            if record["B2"].strip() and table.number(record, "B4", row) == 1:
                intended[record["B2"].strip()] = table.number(record, "B5", row, optional=True)

    rows: dict[str, dict[int, tuple[dict[str, str], int]]] = {}
    for row, record in info.records():
        if record["B2"].strip():
            rows.setdefault(record["B2"].strip(), {})[int(info.number(record, "B4", row))] = (record, row)  # type: ignore[arg-type]

    fill = _imputation(info, [roles[1] for dialogue_id, roles in rows.items() if dialogue_id in utterances
                              and 1 in roles], persona_columns)
    dialogues: list[Dialogue] = []
    skipped: list[str] = []
    imputed: list[str] = []
    for dialogue_id, utts in utterances.items():
        roles = rows.get(dialogue_id, {})
        if 1 not in roles:
            skipped.append(f"{dialogue_id} (no persuadee row, B4 = 1, in {FULL_INFO})")
            continue
        record, row = roles[1]
        donation = info.number(record, "B6", row, optional=True)
        if donation is None:
            skipped.append(f"{dialogue_id} ({FULL_INFO} row {row}: empty donation, column 'B6')")
            continue
        if donation < 0:
            raise CorpusError(f"{FULL_INFO}: row {row}, column 'B6' has {donation}; a donation cannot be negative")
        if donation > TASK_PAYMENT:
            skipped.append(f"{dialogue_id} ({FULL_INFO} row {row}: donation {donation:g} is more than the task's "
                           f"${TASK_PAYMENT:g})")
            continue
        persona, missing = _persona(info, record, row, persona_columns, fill)
        persuader, persuader_missing = None, tuple[str, ...]()
        if 0 in roles:
            persuader, persuader_missing = _persona(info, *roles[0], persona_columns, fill)
        persuader_row = roles[0][1] if 0 in roles else 0
        for role, names, at in (("persuadee", missing, row), ("persuader", persuader_missing, persuader_row)):
            if names:
                imputed.append(f"dialogue {dialogue_id} {role} ({FULL_INFO} row {at}): "
                               + ", ".join(repr(persona_columns[n]) for n in names))
        turns = info.number(record, "B7", row, optional=True)
        dialogues.append(Dialogue(dialogue_id, tuple(utts), persona, persuader, donation, intended.get(dialogue_id),
                                  len({u.turn for u in utts}) if turns is None else int(turns), missing,
                                  persuader_missing))
    if imputed:
        log.warning("P4G corpus %s: imputed empty persona cells (median / most frequent value) in %d rows, "
                    "dialogues kept: %s", directory, len(imputed), _named(imputed))
    if skipped:
        log.warning("P4G corpus %s: skipped %d dialogues: %s", directory, len(skipped), _named(skipped))
    if not dialogues:
        raise CorpusError(f"{FULL_DIALOG}/{FULL_INFO}: no dialogue has both utterances and a persuadee row with "
                          f"a donation")
    return Corpus(tuple(dialogues), len(skipped))


def cached_corpus(directory: str | Path) -> Corpus:
    """:func:`load_corpus`, once per process and folder (the simulators, panels and scenarios built from one corpus
    share it; a :class:`Corpus` is immutable)."""
    return _cached_corpus(str(Path(directory).resolve()))


@functools.lru_cache(maxsize=4)
def _cached_corpus(directory: str) -> Corpus:
    return load_corpus(directory)


# ---------------------------------------------------------------------------------------------- fitting
def response_counts(dialogues: Iterable[Dialogue]) -> np.ndarray:
    """Counts of persuadee acts (columns) answering each persuader act (rows) in annotated dialogues.

    A persuadee label counts against the latest persuader act before it; persuader labels outside the
    14 modelled acts (and without an alias in :data:`ER_LABEL_ALIASES`) break the chain.
    """
    counts = np.zeros((len(PERSUADER_ACTS), len(PERSUADEE_ACTS)))
    for dialogue in dialogues:
        last: int | None = None
        for u in dialogue.utterances:
            if not u.labels:
                continue
            if u.role == "persuader":
                act = ER_LABEL_ALIASES.get(u.labels[0], u.labels[0])
                last = PERSUADER_ACTS.index(act) if act in PERSUADER_ACTS else None
            elif last is not None:
                for label in u.labels:
                    if label in PERSUADEE_ACTS:
                        counts[last, PERSUADEE_ACTS.index(label)] += 1
    return counts


def strategy_effects(dialogues: Iterable[Dialogue], prior: np.ndarray, ridge: float = 1.0,
                     iterations: int = 50) -> np.ndarray:
    """Per-use log-odds effect of each strategy: ridge logistic regression of donated ~ strategy counts.

    The ridge pulls coefficients towards ``prior`` (the default effects), so a small corpus moves them
    only as far as its evidence goes; the intercept is free. Newton's method on the penalised likelihood, each step
    halved until the objective improves (a full Newton step can overshoot on real data and overflow).
    """
    dialogues = list(dialogues)
    x = np.array([[sum(s in u.labels for u in d.utterances if u.role == "persuader") for s in STRATEGIES]
                  for d in dialogues], dtype=float)
    y = np.array([d.donated for d in dialogues], dtype=float)
    design = np.hstack([np.ones((len(x), 1)), x])
    beta = np.concatenate([[0.0], prior])
    penalty = np.diag([0.0] + [ridge] * len(STRATEGIES))
    target = np.concatenate([[0.0], prior])

    def objective(b: np.ndarray) -> float:  # penalised log-likelihood, overflow-free
        z = design @ b
        return float(np.sum(y * z - np.logaddexp(0.0, z)) - 0.5 * (b - target) @ penalty @ (b - target))

    current = objective(beta)
    for _ in range(iterations):
        p = 0.5 * (1.0 + np.tanh(0.5 * (design @ beta)))  # the logistic function without exp overflow
        gradient = design.T @ (y - p) - penalty @ (beta - target)
        hessian = design.T @ (design * (p * (1 - p))[:, None]) + penalty + 1e-9 * np.eye(len(beta))
        step = np.linalg.solve(hessian, gradient)
        for _ in range(30):
            value = objective(beta + step)
            if value >= current:
                break
            step = step / 2
        else:
            break  # no step improves it any more: converged
        beta, current = beta + step, value
        if np.max(np.abs(step)) < 1e-8:
            break
    return beta[1:]


def fit_params(corpus: Corpus, base: PersuadeeParams | None = None, smoothing: float = 1.0,
               ridge: float = 1.0) -> PersuadeeParams:
    """Native persuadee parameters fitted to ``corpus``.

    - ``response_logits``: log of the Laplace-smoothed (``smoothing``) response-act frequencies per
      persuader act, from the annotated dialogues (kept from ``base`` if there are none);
    - strategy ``act_effects``: :func:`strategy_effects` on the annotated dialogues, shrunk to ``base``;
    - ``amount_logits``: donors' actual donations, rounded to the nearest amount level, Laplace-smoothed;
    - ``intercept`` / ``amount_shift``: :func:`calibrate` on the corpus's personas to its own donor rate
      and mean donation.
    """
    base = base or PersuadeeParams()
    params = base
    annotated = corpus.annotated
    if annotated:
        counts = response_counts(annotated)
        logits = np.log((counts + smoothing) / (counts.sum(axis=1, keepdims=True) + smoothing * counts.shape[1]))
        effects = np.array(base.act_effects)
        effects[:len(STRATEGIES)] = strategy_effects(annotated, effects[:len(STRATEGIES)], ridge)
        params = replace(params, response_logits=tuple(logits.ravel()), act_effects=tuple(effects))
    donations = [d.donation for d in corpus.dialogues if d.donated]
    if donations:
        levels = np.array(AMOUNT_LEVELS)
        hist = np.bincount([int(np.argmin(np.abs(levels - a))) for a in donations], minlength=len(levels))
        params = replace(params, amount_logits=tuple(np.log((hist + smoothing) / (hist.sum() + smoothing * len(levels)))))
    rate = corpus.donor_rate
    if not 0 < rate < 1:
        raise CorpusError(f"corpus donor rate is {rate:.0%}; fitting needs both donors and non-donors")
    return calibrate(params, personas=corpus.personas(), target_rate=rate, target_mean=corpus.mean_donation)
