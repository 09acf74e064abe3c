"""Writes a small corpus in the real P4G file schema (dialogues simulated with the native model)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import openpyxl

from simpop.envs.persuasion.acts import ASKING_ACTS, DONATING_ACTS, render_persuadee, render_persuader
from simpop.envs.persuasion.model import PersuadeeModel, PersuadeeParams, reference_persuader
from simpop.envs.persuasion.personas import PERSONA_FIELDS, PersonaSampler


def write_p4g_corpus(directory: Path, n_dialogues: int = 20, n_annotated: int = 12, seed: int = 0,
                     suffix: str = ".x", params: PersuadeeParams | None = None) -> Path:
    """Write full_dialog.csv, full_info.csv, 300_dialog.xlsx and 300_info.xlsx into ``directory``.

    Persona columns are named ``<attribute><suffix>`` (the real file uses ``.x``). The first
    ``n_annotated`` dialogues also go into the annotated workbooks, with act labels. The persuadees are the
    native model with ``params`` (default: the calibrated defaults).
    """
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sampler, model = PersonaSampler(), PersuadeeModel(params)
    dialog_rows, info_rows, labelled_rows, intended_rows = [], [], [], []
    for d in range(n_dialogues):
        dialogue_id = f"20180904-{d:06d}_{d}_live"
        personas = sampler.sample(rng), sampler.sample(rng)
        state = model.initial_state(personas[1])
        donation, turns = 0.0, 0
        for turn, er_act in enumerate(reference_persuader(rng)):
            state = model.update(state, er_act)
            ee_act, amount = model.respond(state, er_act, rng)
            ee_text = render_persuadee(ee_act, amount if ee_act in DONATING_ACTS else None, rng)
            for role, text, act in ((0, render_persuader(er_act, rng), er_act), (1, ee_text, ee_act)):
                dialog_rows.append([text, turn, role, dialogue_id])
                labelled_rows.append([text, turn, role, dialogue_id, act if role == 0 else "",
                                      act if role == 1 else "", "", "", 0.1, 0.8, 0.1])
            turns = turn + 1
            if er_act in ASKING_ACTS:
                donation = amount or 0.0
                break
        for role, persona in enumerate(personas):
            values = persona.to_dict()
            info_rows.append([dialogue_id, f"user_{2 * d + role}", role, donation if role else 0.0, turns]
                             + [values[f] for f in PERSONA_FIELDS])
            if d < n_annotated:
                intended_rows.append([dialogue_id, f"user_{2 * d + role}", role, donation if role else "",
                                      donation if role else 0.0, turns])
    with (directory / "full_dialog.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["", "Unit", "Turn", "B4", "B2"])
        writer.writerows([i, *row] for i, row in enumerate(dialog_rows))
    with (directory / "full_info.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["B2", "B3", "B4", "B6", "B7"] + [f + suffix for f in PERSONA_FIELDS])
        writer.writerows(info_rows)
    annotated_ids = {f"20180904-{d:06d}_{d}_live" for d in range(n_annotated)}
    write_xlsx(directory / "300_dialog.xlsx",
               ["Unit", "Turn", "B4", "B2", "er_label_1", "ee_label_1", "er_label_2", "ee_label_2", "neg", "neu",
                "pos"], [r for r in labelled_rows if r[3] in annotated_ids])
    write_xlsx(directory / "300_info.xlsx", ["B2", "B3", "B4", "B5", "B6", "B7"], intended_rows)
    return directory


def write_xlsx(path: Path, header: list[str], rows: list[list]) -> None:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(header)
    for row in rows:
        sheet.append(row)
    book.save(path)
