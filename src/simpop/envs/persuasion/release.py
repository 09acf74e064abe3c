"""The corpus-fitted persuadees simpop ships, read without a corpus on the machine: ``persuadee:fitted-<i>`` and
persona set ``human-<n>-<seed>``.

simpop ships no P4G corpus file. It ships one JSON file, ``data/p4g-fit-v1.json``, made by
:func:`~simpop.envs.persuasion.fitted.fit_release` from the public corpus (``simpop fit-p4g --corpus DIR``; what it
holds is in :mod:`.fitted`). A new fit is a new file (``p4g-fit-v2.json``); a shipped one never changes, so panels
built on it stay comparable.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from simpop.envs.persuasion.model import PersuadeeParams
from simpop.envs.persuasion.personas import Marginal, PersonaSampler

#: The shipped fit's name (its file is ``data/<FIT_VERSION>.json``).
FIT_VERSION = "p4g-fit-v1"


def release_path(version: str = FIT_VERSION) -> Traversable:
    """The shipped fit's file."""
    return resources.files("simpop.envs.persuasion") / "data" / f"{version}.json"


@functools.lru_cache(maxsize=2)
def load_release(version: str = FIT_VERSION) -> dict[str, Any]:
    """The shipped fit (see :mod:`.fitted` for what it holds)."""
    path = release_path(version)
    if not path.is_file():
        raise ValueError(f"no shipped P4G fit {version!r} (simpop ships {FIT_VERSION})")
    return json.loads(path.read_text(encoding="utf-8"))


def params_of(data: dict[str, Any]) -> PersuadeeParams:
    """:class:`PersuadeeParams` from a fit's ``point`` or ``resamples`` entry."""
    fields: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()}
    return PersuadeeParams(**fields)


def shipped_params(index: int, version: str = FIT_VERSION) -> PersuadeeParams:
    """Bootstrap resample ``index`` of the shipped fit (``persuadee:fitted-<index>`` without a corpus)."""
    fits = load_release(version)["resamples"]
    if not 0 <= index < len(fits):
        raise ValueError(f"the shipped fit {version} has resamples fitted-0 .. fitted-{len(fits) - 1}; got fitted-"
                         f"{index} (or give corpus=DIR to fit a resample of a corpus)")
    return params_of(fits[index])


def human_sampler(version: str = FIT_VERSION) -> PersonaSampler:
    """A persona sampler with the shipped fit's corpus marginals (persona set ``human-<n>-<seed>``)."""
    return PersonaSampler({name: Marginal(m["mean"], m["sd"], m["step"], tuple(m["weights"]))
                           for name, m in load_release(version)["personas"].items()})
