"""simpop.files.write_json: strict JSON, written whole or not at all."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from simpop.files import write_json


def _strict(text: str):
    return json.loads(text, parse_constant=lambda constant: pytest.fail(f"{constant} in JSON"))


def test_non_finite_numbers_become_null_and_numpy_values_plain_ones(tmp_path):
    value = {"nan": math.nan, "inf": -math.inf, "np_nan": np.float64("nan"), "count": np.int64(3),
             "rows": np.array([[0.5, np.inf], [1.0, 2.0]]), "pair": (1, math.nan), "text": "Spende 2 €", "ok": 0.25}
    write_json(tmp_path / "summary.json", value, indent=1)
    raw = (tmp_path / "summary.json").read_text(encoding="utf-8")
    assert _strict(raw) == {"nan": None, "inf": None, "np_nan": None, "count": 3, "rows": [[0.5, None], [1.0, 2.0]],
                            "pair": [1, None], "text": "Spende 2 €", "ok": 0.25}
    assert raw.endswith("}\n") and "€" in raw
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left beside it


def test_a_value_json_cannot_hold_leaves_the_old_file_as_it_was(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, {"runs": 1})
    with pytest.raises(TypeError, match="set"):
        write_json(path, {"runs": {1, 2}})
    assert _strict(path.read_text()) == {"runs": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
