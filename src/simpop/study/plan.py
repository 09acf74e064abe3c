"""``simpop study plan`` and ``simpop study simulate``: how many participants a study needs.

**Plan.** From a study folder (a pilot with people, or a simulated study), per comparison of a policy with the
first: the per-participant paired differences of the declared primary outcome (after the declared exclusions,
as the report computes them: :func:`~simpop.study.report.paired_differences`), their standard deviation, and
the fewest participants with which a two-sided paired t-test at level ``alpha / m`` (``m`` comparisons with
the first policy: Holm's strictest step) detects ``difference`` with probability ``power``: the one power
calculation of simpop (:func:`~simpop.evaluation.metrics.pairs_needed`, also behind ``simpop experiment
collapse --plan``).

**Simulate.** Panel members play the participants through the study's own HTTP API (the app of ``simpop study
serve`` under FastAPI's in-process test client): consent, platform id, questionnaire (left blank), every chat,
the closing survey, the ratings (and the attention item, answered as instructed), the completion code. Each
simulated participant is one member (round robin) playing its own persona (the env scenario of its join
index, as a person in ``self`` mode plays themselves). The folder is an ordinary study folder: ``simpop study
report`` and ``plan`` read it, and the run tests the whole pipeline end to end.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simpop.evaluation.metrics import MAX_PAIRS, paired_power, pairs_needed
from simpop.study import storage
from simpop.study.report import exclusions, outcome, paired_differences
from simpop.study.study import ATTENTION_ITEM, DEFAULTS, Study


def plan(out: str | Path, difference: float, alpha: float = 0.05, target: float = 0.8) -> dict[str, Any]:
    """Per comparison, the paired sd of the primary outcome in ``out`` and the participants needed.

    Raises:
        ValueError: ``difference``, ``alpha`` or ``target`` out of range, or fewer than 2 paired participants.
    """
    if not (math.isfinite(difference) and difference > 0) or not 0 < alpha < 1 or not 0 < target < 1:
        raise ValueError(f"need a difference > 0 and alpha, power in (0, 1); got {difference}, {alpha}, {target}")
    settings = {**DEFAULTS, **storage.read_settings(out)}
    records = storage.read_chats(out)
    excluded, _ = exclusions(records, settings["exclusions"])
    records = [r for r in records if r.member not in excluded]
    labels, primary = list(settings["policies"]), settings["primary_outcome"]
    comparisons = max(len(labels) - 1, 1)
    rows = {}
    for b in labels[1:]:
        mean_a, mean_b = paired_differences(records, labels[0], b, outcome(primary))
        diffs = np.subtract(mean_b, mean_a)
        if len(diffs) < 2:
            raise ValueError(f"{out}: {len(diffs)} participant(s) finished chats with both {labels[0]} and {b}; "
                             f"a plan needs at least 2")
        sd = float(np.std(diffs, ddof=1))
        needed = pairs_needed(difference, sd, alpha / comparisons, target)
        rows[f"{b} - {labels[0]}"] = {"participants": len(diffs), "mean_difference": float(diffs.mean()), "sd": sd,
                                      "needed": needed if needed <= MAX_PAIRS else None,
                                      "power_now": paired_power(len(diffs), difference, sd, alpha / comparisons)}
    if not rows:
        raise ValueError(f"{out} has one policy: nothing to compare")
    return {"primary_outcome": primary, "difference": difference, "alpha": alpha, "power": target,
            "comparisons": comparisons, "excluded": len(excluded), "plan": rows}


def render_plan(result: dict[str, Any], out: str | Path) -> str:
    """The plan as text."""
    lines = [f"Plan from {out}: detect a paired difference of {result['difference']:g} in {result['primary_outcome']} "
             f"with {result['power']:.0%} power, two-sided, alpha {result['alpha']:g} / {result['comparisons']} "
             f"comparison(s) ({result['excluded']} participant(s) excluded by the declared rules)."]
    for name, row in result["plan"].items():
        needed = row["needed"] if row["needed"] is not None else f"> {MAX_PAIRS}"
        lines.append(f"  {name}: {row['participants']} paired participants, mean difference "
                     f"{row['mean_difference']:+.3f}, sd {row['sd']:.3f}: {needed} participants needed "
                     f"(power with the {row['participants']} here: {row['power_now']:.2f})")
    return "\n".join(lines) + "\n"


def simulate(study: Study, simulators: Sequence[Any], participants: int, seed: int = 0,
             token: str = "simulated-study-token") -> list[str]:
    """Run ``participants`` simulated participants through ``study``'s HTTP API; returns their completion codes.

    Raises:
        RuntimeError: The API refused a step (the message names it): the pipeline is broken.
    """
    from fastapi.testclient import TestClient

    from simpop.study.app import create_app

    if participants < 1 or not simulators:
        raise ValueError("a simulated study needs at least one participant and one simulator")
    app = create_app(study, token, message_rate="1000/second", join_rate="100000/minute")
    env = study.make_env()
    scenarios = env.scenario_ids()
    codes, first = [], len(study.participants)  # a continued simulation goes on with new ids
    with TestClient(app) as client:
        def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
            response = client.post(path, json=body)
            if response.status_code != 200:
                raise RuntimeError(f"simulated participant: {path} answered {response.status_code}: "
                                   f"{response.text[:300]}")
            return response.json()

        for i in range(first, first + participants):
            member = simulators[i % len(simulators)]
            info = call("/api/study", {"token": token})
            view = call("/api/join", {"token": token, "consent": True, "params": {"PROLIFIC_PID": f"sim-{i}"}})
            key = view["key"]
            if view["stage"] == "questionnaire":
                call("/api/questionnaire", {"key": key, "answers": {}})
            for _ in range(info["chats"]):
                view = call("/api/join", {"token": token, "key": key})
                member.reset_batch([env.load_scenario(scenarios[i % len(scenarios)])],
                                   [np.random.default_rng([seed, i, view["number"]])])
                while view["turn"] != "done":
                    if view["turn"] == "agent":
                        response = client.get(f"/api/chat/{view['chat']}", params={"wait": 1})
                        view = response.json()
                        continue
                    (reply,) = member.act_batch([_observation(env, view)], [0])
                    view = call(f"/api/chat/{view['chat']}/message", {"text": str(reply)[:view["max_message_chars"]]})
                ratings: dict[str, Any] = {"naturalness": 3, "would_talk_again": True}
                if info["attention"]:
                    ratings["attention"] = ATTENTION_ITEM[1]
                call(f"/api/chat/{view['chat']}/rating", ratings)
            codes.append(call("/api/finish", {"key": key})["code"])
    return codes


def _observation(env: Any, view: dict[str, Any]) -> str:
    """The user seat's text observation rebuilt from the page's view (what the person sees)."""
    roles = {"you": "assistant", "tool": "tool"}
    messages = [{"role": roles.get(m["from"], "user"), "content": m["text"]} for m in view["messages"]]
    payload: dict[str, Any] = {"seat": env.user_seat, "to_act": env.user_seat, "messages": messages,
                               "error": view["error"], "instructions": view["instructions"]}
    if view["survey"]:
        payload["survey"] = view["survey"]
    return json.dumps(payload, ensure_ascii=False)
