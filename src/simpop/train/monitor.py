"""A collapse early warning: online signals of simulator collapse and one documented rule over them.

Collapse (the policy exploiting its training simulator) shows before held-out success falls: training success
rises while success on other simulators stalls, groups stop carrying signal, the policy's entropy drains and
its success spreads across simulators. :class:`CollapseMonitor` watches those signals during training (any
simpop trainer through :func:`simpop.train.loop.run`, and TRL through
:class:`simpop.train.trl_adapter.CollapseCallback`) and raises a warning by one fixed rule.

**Signals.** Every update (from the trainer's metrics):

- ``zero_var``: the share of GRPO groups whose rewards are all equal (``zero_var_frac``), mean since the last
  probe;
- ``entropy_ratio``: the policy entropy now (mean of the last ``window`` updates) over its mean in the first
  ``window`` updates; ``entropy_slope``: its least-squares slope per update over the last ``window`` updates,
  relative to the first window's mean;
- ``train_success``: the training success, mean since the last probe;
- ``reply_diversity`` (where the metrics carry it, e.g. :class:`simpop.train.pool.AdaptivePoolTrainer`: distinct
  simulator replies over all replies in the batch): its mean since the last probe goes into the probe record; the
  rule does not use it (not every trainer reports it).

Every ``probe_every`` updates, from a small probe panel (simulators training never sees, distinct from the
final held-out panel so that acting on it does not leak the test):

- ``gap``: training success (mean since the last probe) minus probe success;
- ``spread``: the standard deviation of success across probe members;
- ``stall``: probe success has made no new best (by more than ``min_gain``) in the last ``patience`` probes
  while training success rose by at least ``train_rise`` since the probe of that best.

**The rule** (stated before any calibration data was seen). At each probe, five indicators:

1. gap: ``gap >= gap_threshold`` (0.15);
2. degenerate groups: ``zero_var >= zero_var_threshold`` (0.5);
3. entropy collapse: ``entropy_ratio <= entropy_ratio_threshold`` (0.5: the entropy has halved);
4. stall (as above; ``patience`` 2, ``min_gain`` 0.02, ``train_rise`` 0.05);
5. spread: ``spread >= spread_threshold`` (0.2) and at least 1.5 times the first probe's spread.

A probe is *suspicious* when at least ``min_indicators`` (2) hold (and, when ``require`` names indicators, one
of those is among them; the pre-registered rule requires none). The monitor **fires** at the first probe that
is the ``persistence``-th (2) suspicious probe in a row; it then stays fired (one warning per run). Its
record (``collapse_warning``: 1, the indicators that held) goes to ``metrics.jsonl`` / TensorBoard, the log
(``logging.warning``) and the run's report.

**No gradient** (on by default, no probe needed). The ``zero_var`` signal at its extreme: an update whose every
group has equal rewards (``zero_var_frac`` 1.0) gives the policy no gradient. :class:`NoGradientWatch` (run by the
loop for every trainer) warns when that lasts :data:`NO_GRADIENT_WINDOW` updates in a row: one ``logging`` line
saying what to change, and a ``no_gradient_warning`` record in ``metrics.jsonl`` (its first update, ``since``); once
per episode (an update with signal ends one). Trainers without groups (PPO) log no ``zero_var_frac`` and never warn.

**Calibration** (``simpop experiment monitor``, :mod:`simpop.experiments.adaptive`) measures the rule's lead
time on the act-level collapse experiment's frozen condition and its false alarms on the verbalized and
co-training conditions; ``docs/adaptive.md`` has the numbers and discloses any change made after seeing them.
The default stays the pre-registered rule. One variant was defined *after* seeing the first calibration runs:
``MonitorRule(require=("zero_var", "stall"))`` (:data:`POST_HOC_REQUIRE`), because the false alarms there all
came from gap + entropy alone (a probe panel harder than the training simulators, and entropy that halves in
healthy learning too); it is reported separately, on those runs (in-sample) and on fresh seeds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simpop.validation import at_least_one, check_fields

log = logging.getLogger(__name__)

#: The per-update signal of degenerate groups: the share of GRPO groups whose rewards are all equal.
ZERO_VAR = "zero_var_frac"
#: Updates in a row at ``zero_var_frac`` 1.0 before :class:`NoGradientWatch` warns. A policy with success ``p``
#: per dialogue has all ``S`` groups of ``G`` equal in one update with probability ``(p**G + (1-p)**G)**S``: at
#: ``p`` = 5% and 4 x 4 that is 0.44, ten updates in a row 3e-4, so a policy that still succeeds now and then is
#: not flagged, while a 200-update run that has stopped learning hears so within 5% of its length.
NO_GRADIENT_WINDOW = 10
#: The ``metrics.jsonl`` record kind of a :class:`NoGradientWatch` warning.
NO_GRADIENT_KIND = "no_gradient_warning"
#: What to change, from what ``simpop train``'s GRPO-family trainers offer.
NO_GRADIENT_ADVICE = ("pass a larger batch (--group-size, --scenarios-per-update: some group then likely sees "
                      "differing rewards), --algorithm dapo (refills such groups) or --kl-coef > 0 (pulls the policy "
                      "back toward its start)")
#: What the loop does when the monitor fires.
ON_COLLAPSE = ("warn", "stop", "add-simulators")
INDICATORS = ("gap", "zero_var", "entropy", "stall", "spread")
#: The post-hoc variant's required indicators (module docstring).
POST_HOC_REQUIRE = ("zero_var", "stall")


@dataclass(frozen=True)
class MonitorRule:
    """The thresholds of the rule (the module docstring states it; defaults are the pre-registered values)."""

    gap_threshold: float = 0.15
    zero_var_threshold: float = 0.5
    entropy_ratio_threshold: float = 0.5
    patience: int = 2
    min_gain: float = 0.02
    train_rise: float = 0.05
    spread_threshold: float = 0.2
    spread_growth: float = 1.5
    min_indicators: int = 2
    persistence: int = 2
    window: int = 10
    require: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self)
        unknown = sorted(set(self.require) - set(INDICATORS))
        if unknown:
            raise ValueError(f"MonitorRule: require names unknown indicators {unknown}; choose from {INDICATORS}")
        if not 1 <= self.min_indicators <= len(INDICATORS):
            raise ValueError(f"min_indicators must be in 1..{len(INDICATORS)}, got {self.min_indicators}")
        at_least_one(self, ("patience", "persistence", "window"))


@dataclass
class CollapseMonitor:
    """Feed it every update's metrics (:meth:`observe_update`) and every probe (:meth:`observe_probe`).

    Attributes:
        rule: The thresholds.
        fired_at: The update at which the warning fired (None until it does).
        history: One record per probe (signals, indicators, ``suspicious``, ``collapse_warning``).
    """

    rule: MonitorRule = field(default_factory=MonitorRule)
    fired_at: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    _entropy: list[float] = field(default_factory=list)
    _since_probe: list[Mapping[str, float]] = field(default_factory=list)
    _train_at_probe: list[float] = field(default_factory=list)
    _probe: list[float] = field(default_factory=list)
    _streak: int = 0

    @property
    def fired(self) -> bool:
        return self.fired_at is not None

    def observe_update(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Take one update's metrics; returns the per-update signals (``monitor/...``) to log with them."""
        self._since_probe.append({k: float(v) for k, v in metrics.items()
                                  if isinstance(v, (int, float)) and not isinstance(v, bool)})
        entropy = metrics.get("policy_entropy")
        if entropy is not None and math.isfinite(float(entropy)):
            self._entropy.append(float(entropy))
        signals = {"monitor/entropy_ratio": self.entropy_ratio(), "monitor/entropy_slope": self.entropy_slope()}
        return {k: v for k, v in signals.items() if math.isfinite(v)}

    def entropy_ratio(self) -> float:
        """Mean entropy of the last ``window`` updates over that of the first ``window`` (nan before two windows)."""
        w = self.rule.window
        if len(self._entropy) < 2 * w:
            return math.nan
        first = float(np.mean(self._entropy[:w]))
        return float(np.mean(self._entropy[-w:])) / first if first > 0 else math.nan

    def entropy_slope(self) -> float:
        """Least-squares slope of the entropy over the last ``window`` updates, relative to the first window."""
        w = self.rule.window
        if len(self._entropy) < 2 * w:
            return math.nan
        first = float(np.mean(self._entropy[:w]))
        recent = np.asarray(self._entropy[-w:])
        return float(np.polyfit(np.arange(w), recent, 1)[0] / first) if first > 0 else math.nan

    def observe_probe(self, step: int, probe_per_member: Mapping[str, float]) -> dict[str, Any]:
        """Take a probe's success per member; returns the probe record (signals, indicators, warning).

        Raises:
            ValueError: no probe member.
        """
        if not probe_per_member:
            raise ValueError("a probe needs at least one member's success")
        r = self.rule
        recent = self._since_probe
        self._since_probe = []
        mean = lambda key: float(np.mean([m[key] for m in recent if key in m])) if any(  # noqa: E731
            key in m for m in recent) else math.nan
        train, zero_var = mean("success"), mean(ZERO_VAR)
        values = [float(v) for v in probe_per_member.values()]
        probe, spread = float(np.mean(values)), float(np.std(values))
        self._probe.append(probe)
        self._train_at_probe.append(train)
        first_spread = self.history[0]["spread"] if self.history else spread
        gap = train - probe if math.isfinite(train) else math.nan
        indicators = {
            "gap": bool(gap >= r.gap_threshold),
            "zero_var": bool(zero_var >= r.zero_var_threshold),
            "entropy": bool(self.entropy_ratio() <= r.entropy_ratio_threshold),
            "stall": self._stalled(),
            "spread": bool(spread >= r.spread_threshold and spread >= r.spread_growth * first_spread
                           and len(self.history) > 0),
        }
        suspicious = is_suspicious(indicators, r)
        self._streak = self._streak + 1 if suspicious else 0
        fires = not self.fired and self._streak >= r.persistence
        if fires:
            self.fired_at = step
            log.warning("collapse warning at update %d: %s (probe success %.3f, training success %.3f)", step,
                        ", ".join(k for k, v in indicators.items() if v), probe, train)
        record = {"probe_success": probe, "train_success": train, "gap": gap, "spread": spread,
                  "zero_var": zero_var, "entropy_ratio": self.entropy_ratio(),
                  **({"reply_diversity": mean("reply_diversity")} if any("reply_diversity" in m for m in recent)
                     else {}),
                  **{f"indicator/{k}": int(v) for k, v in indicators.items()},
                  "suspicious": int(suspicious), "collapse_warning": int(self.fired),
                  "warning_fired_now": int(fires),
                  **{f"probe/{k}": float(v) for k, v in probe_per_member.items()}}
        self.history.append(record)
        return record

    def _stalled(self) -> bool:
        r = self.rule
        if len(self._probe) <= r.patience:
            return False
        earlier = self._probe[:-r.patience]
        best_index = int(np.argmax(earlier))
        no_new_best = max(self._probe[-r.patience:]) <= earlier[best_index] + r.min_gain
        trains = self._train_at_probe
        rose = (math.isfinite(trains[-1]) and math.isfinite(trains[best_index])
                and trains[-1] - trains[best_index] >= r.train_rise)
        return bool(no_new_best and rose)

    def state_dict(self) -> dict[str, Any]:
        """Everything the rule reads (history, streak, firing step), for checkpoints."""
        return {"fired_at": self.fired_at, "history": list(self.history), "entropy": list(self._entropy),
                "since_probe": [dict(m) for m in self._since_probe], "train_at_probe": list(self._train_at_probe),
                "probe": list(self._probe), "streak": self._streak}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.fired_at = state["fired_at"]
        self.history = list(state["history"])
        self._entropy = list(state["entropy"])
        self._since_probe = [dict(m) for m in state["since_probe"]]
        self._train_at_probe = list(state["train_at_probe"])
        self._probe = list(state["probe"])
        self._streak = int(state["streak"])


@dataclass
class NoGradientWatch:
    """Warns once per episode of updates with no gradient (module docstring, **No gradient**).

    Attributes:
        window: Updates in a row at ``zero_var_frac`` 1.0 that make an episode.
        since: The first update of the current run of such updates (None outside one).
        streak: Updates in that run so far.
        warned: Whether the current episode has been warned about.
    """

    window: int = NO_GRADIENT_WINDOW
    since: int | None = None
    streak: int = 0
    warned: bool = False

    def observe(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any] | None:
        """Take one update's metrics; returns the warning record the first time an episode reaches ``window``."""
        value = metrics.get(ZERO_VAR)
        if value is None:  # no groups (PPO), or not reported: nothing to judge
            return None
        if float(value) < 1.0:
            self.since, self.streak, self.warned = None, 0, False
            return None
        self.since = step if self.since is None else self.since
        self.streak += 1
        if self.warned or self.streak < self.window:
            return None
        self.warned = True
        log.warning("no gradient since update %d: every group's rewards were equal (%s 1.0) for %d updates in a "
                    "row, so training cannot move the policy; %s", self.since, ZERO_VAR, self.streak,
                    NO_GRADIENT_ADVICE)
        return {"since": self.since, "window": self.window}

    def state_dict(self) -> dict[str, Any]:
        """The episode in progress, for checkpoints."""
        return {"window": self.window, "since": self.since, "streak": self.streak, "warned": self.warned}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.window, self.since = int(state["window"]), state["since"]
        self.streak, self.warned = int(state["streak"]), bool(state["warned"])


def no_gradient_note(records: list[Mapping[str, Any]]) -> str | None:
    """The line ``simpop train`` prints under its summary when a run's records hold :class:`NoGradientWatch`
    warnings (None when they hold none)."""
    warnings = [r for r in records if r.get("kind") == NO_GRADIENT_KIND]
    if not warnings:
        return None
    last = [r[ZERO_VAR] for r in records if r.get("kind") == "train" and ZERO_VAR in r][-1:]
    state = "still so at the last update" if last == [1.0] else "it recovered later"
    return (f"warning: no gradient (every group's rewards equal for {warnings[-1]['window']}+ updates in a row) "
            f"from update {', '.join(str(r['since']) for r in warnings)}; {state}; {NO_GRADIENT_ADVICE}")


def is_suspicious(indicators: Mapping[str, bool], rule: MonitorRule) -> bool:
    """Whether a probe with these indicators is suspicious under ``rule`` (module docstring)."""
    held = [k for k, v in indicators.items() if v]
    return len(held) >= rule.min_indicators and (not rule.require or any(k in rule.require for k in held))


def replay(history: list[Mapping[str, Any]], steps: list[int], rule: MonitorRule) -> int | None:
    """The update at which ``rule`` would have fired on a monitor's probe ``history`` (recorded indicators; the
    indicator thresholds are those of the recorded run, only ``min_indicators``, ``require`` and ``persistence``
    are re-applied); None if it would not have."""
    streak = 0
    for record, step in zip(history, steps, strict=True):
        indicators = {k: bool(record[f"indicator/{k}"]) for k in INDICATORS}
        streak = streak + 1 if is_suspicious(indicators, rule) else 0
        if streak >= rule.persistence:
            return step
    return None


def report_section(monitor: CollapseMonitor) -> str:
    """A markdown section on the monitor's verdict, for a run's report."""
    lines = ["## Collapse monitor", ""]
    if not monitor.history:
        return "\n".join(lines + ["No probe was evaluated: the monitor had nothing to judge.", ""])
    lines.append(f"**{'Fired at update ' + str(monitor.fired_at) if monitor.fired else 'Did not fire'}** "
                 f"({len(monitor.history)} probes).")
    lines += ["", "| probe | probe success | train success | gap | spread | zero-var | indicators |",
              "|---|---|---|---|---|---|---|"]
    for i, h in enumerate(monitor.history):
        held = ", ".join(k for k in INDICATORS if h[f"indicator/{k}"]) or "-"
        lines.append(f"| {i} | {h['probe_success']:.3f} | {h['train_success']:.3f} | {h['gap']:.3f} | "
                     f"{h['spread']:.3f} | {h['zero_var']:.3f} | {held} |")
    return "\n".join(lines + [""])
