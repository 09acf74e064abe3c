"""Populations of simulators, checkpoint pools of a trainable simulator, and held-out panels.

- :class:`Population` is itself a :class:`Simulator`: at ``reset_batch`` every slot draws the member
  that will drive it (with the slot's generator) by a sampling rule, and ``act_batch`` makes one call
  per member. ``feedback`` records the policy's result against the member that drove the dialogue,
  which the ``prioritised`` rule uses.
- :class:`CheckpointPool` is a population of frozen snapshots of one trainable simulator, bounded in
  size (the oldest leaves first) and sampled with more weight on recent snapshots.
- :class:`Panel` is a named set of simulators that training never sees; it refuses a member that is a training
  simulator (a leak) and names members that only share an axis with one (look-alikes); a strict option refuses
  any shared axis (see :meth:`Panel.check_disjoint` for the exact rules).

A population also tracks what each member contributes to training (:meth:`Population.record_groups`,
:meth:`Population.contributions`): the share of its dialogues that sat in *informative* GRPO groups (rewards
not all equal: the only groups with a gradient) and the policy's improvement against it (success in the newer
half of its remembered dialogues minus the older half). :meth:`Population.reweight` sets weights from that,
:meth:`Population.prune` retires members that give no signal and keeps the pool within a cap; neither ever
removes the last member.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from simpop.seat import Simulator
from simpop.seat import SimulatorSpec

RULES = ("uniform", "weighted", "prioritised", "rotate")


@dataclass
class _Entry:
    simulator: Simulator
    weight: float
    outcomes: deque = field(default_factory=deque)  # 1 = the policy failed, 0 = it succeeded
    groups: deque = field(default_factory=deque)  # per dialogue: (informative group?, success)


@dataclass(frozen=True)
class Contribution:
    """What one member gave training lately (see :meth:`Population.contributions`).

    Attributes:
        dialogues: Dialogues remembered (at most the population's ``window``).
        informative_share: Share of them in GRPO groups whose rewards were not all equal (nan with none).
        improvement: Policy success against the member in the newer half minus the older half (nan below 4).
        success: Policy success against the member over the remembered dialogues (nan with none).
    """

    dialogues: int
    informative_share: float
    improvement: float
    success: float


class Population(Simulator):
    """Weighted simulators and a rule for choosing one per dialogue.

    Rules (probability of choosing member ``i``):

    - ``uniform``: ``1 / K``.
    - ``weighted``: ``w_i / sum(w)``.
    - ``prioritised``: members the policy fails against more often are chosen more often. The
      failure rate over the member's last ``window`` finished dialogues is smoothed with a Beta(1, 1)
      prior, ``f_i = (failures + 1) / (n + 2)`` (0.5 before any feedback), then
      ``q_i ∝ w_i * f_i`` is mixed with a floor so that no member starves:
      ``p_i = min_probability + (1 - K * min_probability) * q_i``.
    - ``rotate``: no draw; members take turns in order. With ``rotate_every = 0`` round robin per dialogue
      (the ``n``-th dialogue started is driven by member ``n mod K``); with ``rotate_every = N >= 1`` every
      dialogue of update ``u`` (0-based) is driven by member ``(u // N) mod K``, where the trainer ends each
      update with :meth:`end_update`. The position is part of :meth:`pool_state`, so a resumed run continues
      the schedule exactly. Members may be any kinds, models and backends (multi-model rotation).

    A dialogue counts as a failure when the policy's reward is ``<= failure_threshold``.

    Args:
        members: The simulators (distinct objects with distinct names).
        weights: Non-negative member weights (default all 1).
        rule: One of :data:`RULES`.
        window: Finished dialogues remembered per member for ``prioritised``.
        min_probability: Floor of every member's probability under ``prioritised`` (K * floor <= 1).
        failure_threshold: Rewards at or below it are failures.
        rotate_every: Under ``rotate``: 0 = round robin per dialogue, N >= 1 = the next member every N updates.
        name: Name in logs.
    """

    def __init__(self, members: Sequence[Simulator], weights: Sequence[float] | None = None,
                 rule: str = "uniform", *, window: int = 50, min_probability: float = 0.05,
                 failure_threshold: float = 0.0, rotate_every: int = 0, name: str = "population"):
        if rule not in RULES:
            raise ValueError(f"unknown population rule {rule!r}; choose one of {', '.join(RULES)}")
        if isinstance(rotate_every, bool) or not isinstance(rotate_every, int) or rotate_every < 0:
            raise ValueError(f"rotate_every must be an integer >= 0 (0: round robin per dialogue), got {rotate_every!r}")
        self.rotate_every = rotate_every
        self.position = 0  # under rotate: dialogues started (rotate_every = 0) or updates ended (>= 1)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if min_probability < 0:
            raise ValueError(f"min_probability must be >= 0, got {min_probability}")
        if weights is not None and len(weights) != len(members):
            raise ValueError(f"got {len(weights)} weights for {len(members)} members")
        self.rule, self.window, self.min_probability = rule, window, min_probability
        self.failure_threshold = failure_threshold
        self.name = name
        self._entries: list[_Entry] = []
        self._slots: list[tuple[_Entry, int]] = []
        for i, member in enumerate(members):
            self.add(member, 1.0 if weights is None else weights[i])

    def _check_floor(self, size: int) -> None:
        if self.min_probability * size > 1:
            raise ValueError(f"min_probability * members must be in [0, 1]; got {self.min_probability} * {size}; "
                             f"lower min_probability")

    # ----------------------------------------------------------------- members
    @property
    def members(self) -> list[Simulator]:
        return [e.simulator for e in self._entries]

    def add(self, simulator: Simulator, weight: float = 1.0) -> None:
        """Add a member (distinct object, distinct name, non-negative weight)."""
        if not np.isfinite(weight) or weight < 0:
            raise ValueError(f"member weights must be finite and >= 0, got {weight} for {simulator.name!r}")
        if any(e.simulator is simulator for e in self._entries):
            raise ValueError(f"{simulator.name!r} is already a member; a simulator object can drive only one "
                             f"set of slots (build a second one)")
        if any(e.simulator.name == simulator.name for e in self._entries):
            raise ValueError(f"two members are named {simulator.name!r}; give each member a unique name")
        self._check_floor(len(self._entries) + 1)
        self._entries.append(_Entry(simulator, float(weight), deque(maxlen=self.window), deque(maxlen=self.window)))

    def remove(self, name: str) -> Simulator:
        """Retire the member named ``name`` (never the last one).

        Raises:
            KeyError: no such member.
            ValueError: it is the last member.
        """
        index = next((i for i, e in enumerate(self._entries) if e.simulator.name == name), None)
        if index is None:
            raise KeyError(f"population {self.name!r} has no member {name!r}")
        if len(self._entries) == 1:
            raise ValueError(f"population {self.name!r}: cannot remove its last member {name!r}")
        return self._entries.pop(index).simulator

    def pool_state(self) -> dict[str, Any]:
        """The members' names, weights and recorded outcomes and contributions, the rule and the rotation position
        (for checkpoints)."""
        return {"rule": self.rule, "rotate_every": self.rotate_every, "position": self.position,
                "members": [{"name": e.simulator.name, "weight": e.weight, "outcomes": list(e.outcomes),
                             "groups": [list(g) for g in e.groups]} for e in self._entries]}

    def load_pool_state(self, state: Mapping[str, Any], build: Callable[[str], Simulator]) -> None:
        """Restore :meth:`pool_state`: members kept by name, missing ones made by ``build(name)``, order, weights
        and records as saved."""
        current = {e.simulator.name: e for e in self._entries}
        entries = []
        for saved in state["members"]:
            entry = current.get(saved["name"]) or _Entry(build(saved["name"]), 1.0, deque(maxlen=self.window),
                                                         deque(maxlen=self.window))
            entry.simulator.name = saved["name"]
            entry.weight = float(saved["weight"])
            entry.outcomes = deque(saved["outcomes"], maxlen=self.window)
            entry.groups = deque((tuple(g) for g in saved["groups"]), maxlen=self.window)
            entries.append(entry)
        if not entries:
            raise ValueError("a saved population state has no members")
        self._entries, self.rule = entries, state["rule"]
        self.rotate_every, self.position = int(state.get("rotate_every", 0)), int(state.get("position", 0))

    # ----------------------------------------------------------------- contributions
    def record_groups(self, members: Sequence[str], groups: Sequence[Any], rewards: Sequence[float],
                      successes: Sequence[bool] | None = None) -> None:
        """Record one update's dialogues: who drove each (member name), its GRPO group and its reward.

        A dialogue is informative when its group's rewards are not all equal. Names of members no longer in
        the population (or never in it) are ignored.
        """
        if not len(members) == len(groups) == len(rewards):
            raise ValueError(f"record_groups needs one member, group and reward per dialogue; got {len(members)}, "
                             f"{len(groups)}, {len(rewards)}")
        successes = [r > self.failure_threshold for r in rewards] if successes is None else successes
        by_group: dict[Any, list[float]] = {}
        for g, r in zip(groups, rewards):
            by_group.setdefault(g, []).append(float(r))
        informative = {g: len(rs) > 1 and max(rs) > min(rs) for g, rs in by_group.items()}
        entries = {e.simulator.name: e for e in self._entries}
        for name, g, ok in zip(members, groups, successes):
            if name in entries:
                entries[name].groups.append((informative[g], bool(ok)))

    def contributions(self) -> dict[str, Contribution]:
        """Each member's :class:`Contribution` over its last ``window`` recorded dialogues."""
        out = {}
        for e in self._entries:
            seen = list(e.groups)
            n = len(seen)
            informative = float(np.mean([i for i, _ in seen])) if n else float("nan")
            success = float(np.mean([s for _, s in seen])) if n else float("nan")
            improvement = (float(np.mean([s for _, s in seen[n - n // 2:]]) - np.mean([s for _, s in seen[:n // 2]]))
                           if n >= 4 else float("nan"))
            out[e.simulator.name] = Contribution(n, informative, improvement, success)
        return out

    def reweight(self, floor: float = 0.05) -> dict[str, float]:
        """Set each member's weight to its informative share (at least ``floor``; members with no record keep 1)
        and switch a ``uniform`` population to ``weighted``; returns the new weights."""
        if not 0 < floor <= 1:
            raise ValueError(f"floor must be in (0, 1], got {floor}")
        contributions = self.contributions()
        for e in self._entries:
            share = contributions[e.simulator.name].informative_share
            e.weight = 1.0 if not np.isfinite(share) else max(floor, share)
        if self.rule == "uniform":
            self.rule = "weighted"
        return {e.simulator.name: e.weight for e in self._entries}

    def prune(self, cap: int, min_informative: float = 0.05, min_dialogues: int = 16,
              protected: Collection[str] = ()) -> list[str]:
        """Retire members that give no signal, then the least informative until at most ``cap`` remain.

        A member gives no signal when it has at least ``min_dialogues`` recorded dialogues and an informative
        share below ``min_informative``. Over the cap, members are retired in order of informative share (a
        member without enough records counts as fully informative: it has not been judged yet), oldest first
        on ties. ``protected`` names are never retired; neither is the last member. Returns the retired names.

        Raises:
            ValueError: ``cap`` < 1.
        """
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        contributions = self.contributions()

        def score(e: _Entry) -> float:
            c = contributions[e.simulator.name]
            return c.informative_share if c.dialogues >= min_dialogues else 1.0

        removed = []
        for e in list(self._entries):
            if (len(self._entries) > 1 and e.simulator.name not in protected
                    and contributions[e.simulator.name].dialogues >= min_dialogues and score(e) < min_informative):
                self.remove(e.simulator.name)
                removed.append(e.simulator.name)
        candidates = sorted((e for e in self._entries if e.simulator.name not in protected), key=score)
        while len(self._entries) > max(cap, 1) and candidates:
            name = candidates.pop(0).simulator.name
            self.remove(name)
            removed.append(name)
        return removed

    def failure_rates(self) -> list[float]:
        """Smoothed failure rate of the policy against each member (see the class docstring)."""
        return [(sum(e.outcomes) + 1) / (len(e.outcomes) + 2) for e in self._entries]

    def probabilities(self) -> list[float]:
        """Each member's probability of being chosen for a new dialogue under the rule."""
        if not self._entries:
            raise ValueError(f"population {self.name!r} has no members")
        k = len(self._entries)
        if self.rule == "rotate" and self.rotate_every:
            return [float(i == self.rotation_index()) for i in range(k)]
        if self.rule in ("uniform", "rotate"):  # round robin per dialogue: each member's long-run share
            return [1.0 / k] * k
        weights = np.array(self._weights(), dtype=float)
        if self.rule == "prioritised":
            weights = weights * np.array(self.failure_rates())
        if weights.sum() <= 0:
            raise ValueError(f"population {self.name!r}: every member weight is zero")
        q = weights / weights.sum()
        if self.rule == "prioritised":
            q = self.min_probability + (1 - k * self.min_probability) * q
        return list(q)

    def _weights(self) -> list[float]:
        return [e.weight for e in self._entries]

    # ----------------------------------------------------------------- rotation
    def rotation_index(self, offset: int = 0) -> int:
        """Under ``rotate``: the index of the member that drives the next dialogue (``offset`` dialogues later)."""
        if self.rotate_every:
            return (self.position // self.rotate_every) % len(self._entries)
        return (self.position + offset) % len(self._entries)

    def end_update(self, members: Sequence[str], successes: Sequence[bool]) -> dict[str, Any]:
        """End one training update whose dialogues were driven by ``members`` (leaf names) with ``successes``.

        Under ``rotate`` it advances a per-update schedule and returns the update's record: ``rotation_member``
        (who played; a per-dialogue round robin names each member that did) and ``rotation_success/<member>``;
        under the other rules it does nothing and returns ``{}``.
        """
        if self.rule != "rotate":
            return {}
        if len(members) != len(successes):
            raise ValueError(f"end_update needs one success per dialogue; got {len(members)} and {len(successes)}")
        played = list(dict.fromkeys(members))
        record: dict[str, Any] = {"rotation_member": played[0] if len(played) == 1 else played}
        for name in played:
            record[f"rotation_success/{name}"] = float(np.mean([s for m, s in zip(members, successes) if m == name]))
        if self.rotate_every:
            self.position += 1
        return record

    # ----------------------------------------------------------------- Simulator
    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        if len(scenarios) != len(rngs):
            raise ValueError(f"reset_batch got {len(scenarios)} scenarios but {len(rngs)} generators")
        if not self._entries:
            raise ValueError(f"population {self.name!r} has no members")
        if self.rule == "rotate":
            chosen = [self._entries[self.rotation_index(i)] for i in range(len(rngs))]
            if not self.rotate_every:
                self.position += len(rngs)
        else:
            p = self.probabilities()
            chosen = [self._entries[int(rng.choice(len(p), p=p))] for rng in rngs]
        self._slots = []
        for entry in self._entries:
            mine = [i for i, e in enumerate(chosen) if e is entry]
            if mine:
                entry.simulator.reset_batch([scenarios[i] for i in mine], [rngs[i] for i in mine])
        counters = {id(e): 0 for e in self._entries}
        for entry in chosen:
            self._slots.append((entry, counters[id(entry)]))
            counters[id(entry)] += 1

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[Any]:
        actions: list[Any] = [None] * len(slots)
        groups: dict[int, list[int]] = {}
        for i, slot in enumerate(slots):
            groups.setdefault(id(self._slot(slot)[0]), []).append(i)
        for indices in groups.values():
            entry = self._slot(slots[indices[0]])[0]
            answers = entry.simulator.act_batch([observations[i] for i in indices],
                                                [self._slot(slots[i])[1] for i in indices])
            for i, answer in zip(indices, answers):
                actions[i] = answer
        return actions

    def _slot(self, slot: int) -> tuple[_Entry, int]:
        if not 0 <= slot < len(self._slots):
            raise IndexError(f"slot {slot} was not started: reset_batch() started {len(self._slots)} slots")
        return self._slots[slot]

    def feedback(self, slots: list[int], rewards: list[float]) -> None:
        for slot, reward in zip(slots, rewards):
            entry, member_slot = self._slot(slot)
            entry.outcomes.append(1 if reward <= self.failure_threshold else 0)
            entry.simulator.feedback([member_slot], [reward])

    def member(self, slot: int) -> Simulator:
        entry, member_slot = self._slot(slot)
        return entry.simulator.member(member_slot)

    def success_probability(self, slot: int) -> float | None:
        entry, member_slot = self._slot(slot)
        return entry.simulator.success_probability(member_slot)

    @property
    def spec(self) -> SimulatorSpec:
        leaves = leaf_simulators([self])
        return SimulatorSpec("population", "+".join(sorted({s.spec.model for s in leaves})),
                             "+".join(sorted({s.spec.personas for s in leaves})),
                             extra={"rule": self.rule, "members": ",".join(s.name for s in self.members),
                                    **({"rotate_every": self.rotate_every} if self.rule == "rotate" else {})})


@runtime_checkable
class Snapshottable(Protocol):
    """A simulator that makes its own frozen copies (e.g. saving only its LoRA adapter)."""

    def snapshot(self) -> Simulator:
        """A frozen copy of the current parameters that later training does not change."""
        ...


class CheckpointPool(Population):
    """A bounded pool of frozen snapshots of one trainable simulator, sampled toward recent ones.

    The newest snapshot has weight 1, the one before ``recency``, then ``recency**2`` ... (``recency``
    = 1 samples uniformly). When the pool is full, adding a snapshot drops the oldest (or the entry the caller
    names, e.g. the co-trainer's most redundant one).

    Args:
        max_size: Snapshots kept.
        recency: Weight decay per step of age, in (0, 1].
        name: Name in logs; snapshots are named ``<simulator name>@<step>``.
    """

    def __init__(self, max_size: int = 5, recency: float = 0.5, name: str = "pool"):
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        if not 0 < recency <= 1:
            raise ValueError(f"recency must be in (0, 1], got {recency}")
        super().__init__([], rule="weighted", min_probability=0.0, name=name)
        self.max_size, self.recency = max_size, recency

    def add_snapshot(self, simulator: Simulator, step: int, evict: int = 0) -> Simulator:
        """Freeze ``simulator`` (its ``snapshot()``, else a deep copy) as of ``step`` and add it; a full pool first
        drops its entry at index ``evict`` (default the oldest)."""
        frozen = simulator.snapshot() if isinstance(simulator, Snapshottable) else copy.deepcopy(simulator)
        if frozen is simulator:
            raise ValueError(f"{type(simulator).__name__}.snapshot() returned the simulator itself; "
                             f"it must return a frozen copy")
        frozen.name = f"{simulator.name}@{step}"
        if len(self._entries) == self.max_size:
            if not 0 <= evict < len(self._entries):
                raise IndexError(f"evict={evict} is not an entry of a pool of {len(self._entries)}")
            del self._entries[evict]
        self.add(frozen)
        return frozen

    def _weights(self) -> list[float]:
        n = len(self._entries)
        return [self.recency ** (n - 1 - i) for i in range(n)]


def leaf_simulators(simulators: Sequence[Simulator]) -> list[Simulator]:
    """The concrete simulators inside ``simulators``, populations (and pools) expanded recursively."""
    leaves: list[Simulator] = []
    for s in simulators:
        leaves.extend(leaf_simulators(s.members) if isinstance(s, Population) else [s])
    return leaves


#: Spec settings (``extra``) that choose a model's parameters along with its name (the act-level persuadee's
#: held-out, shuffled and fitted models: :func:`simpop.envs.persuasion.simulators.model_params`).
MODEL_SETTINGS = ("jitter", "model_seed", "corpus")


def model_key(spec: SimulatorSpec) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """The model parameters a spec plays, comparable (:meth:`Panel.check_disjoint`'s "same model"): the model of
    the innermost wrapped spec, without a LoRA adapter suffix (``M+lora:A`` -> ``M``), with its
    :data:`MODEL_SETTINGS`."""
    while True:
        try:
            spec = spec.inner()
        except (ValueError, KeyError):  # not a wrapper (or a kind no string builds: population, custom)
            break
    extra = dict(spec.extra)
    return spec.model.partition("+lora:")[0], tuple((k, extra[k]) for k in MODEL_SETTINGS if k in extra)


@dataclass(frozen=True)
class LookAlike:
    """A held-out panel member that shares axes with a training simulator without being it
    (:meth:`Panel.check_disjoint`): it is evaluated, and the panel card and the report name what it shares.

    Attributes:
        member: The panel member's label.
        training: The training simulator's name.
        shared: What they share, e.g. ``("decoding settings {'decoding': 'sample', 'temperature': 0.8}",)``.
    """

    member: str
    training: str
    shared: tuple[str, ...]

    def __str__(self) -> str:
        return f"shares {' and '.join(self.shared)} with training simulator {self.training!r}"


def look_alike_lines(look_alikes: Sequence[LookAlike]) -> dict[str, list[str]]:
    """Panel member label -> what it shares with training (one line per training simulator), for cards."""
    lines: dict[str, list[str]] = {}
    for item in look_alikes:
        lines.setdefault(item.member, []).append(str(item))
    return lines


class PanelOverlapError(ValueError):
    """A held-out panel member is not held out from training (see :meth:`Panel.check_disjoint`)."""


def check_name(name: Any, what: str) -> None:
    """Refuse a name that cannot label a line of a report: not a string, blank, or with line breaks or other
    control characters."""
    text = str(name)
    if not text.strip() or not text.isprintable():
        raise ValueError(f"{what} name {text[:80]!r}: names must be printable text (no line breaks or control "
                         f"characters), not blank")


class Panel:
    """A named set of held-out simulators: the ones training never sees.

    Args:
        members: Simulators (named by their ``name``) or a name -> simulator mapping.
        name: The panel's name in reports.
        training: If given, :meth:`check_disjoint` runs at construction (its look-alikes: :attr:`look_alikes`).
        strict: Check ``training`` by the all-axes rule (:meth:`check_disjoint`).
    """

    def __init__(self, members: Sequence[Simulator] | Mapping[str, Simulator], name: str = "heldout",
                 training: Population | Sequence[Simulator] | None = None, strict: bool = False):
        items = dict(members) if isinstance(members, Mapping) else {m.name: m for m in members}
        if not isinstance(members, Mapping) and len(items) != len(members):
            raise ValueError("panel members need distinct names")
        if not items:
            raise ValueError(f"panel {name!r} has no members")
        check_name(name, "panel")
        for member in items:
            check_name(member, "panel member")
        self.name = name
        self.members: dict[str, Simulator] = items
        self.look_alikes = [] if training is None else self.check_disjoint(training, strict=strict)

    def __iter__(self) -> Iterator[tuple[str, Simulator]]:
        return iter(self.members.items())

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, name: str) -> Simulator:
        return self.members[name]

    def check_disjoint(self, training: Population | Sequence[Simulator], shared_model: Collection[str] = (), *,
                       strict: bool = False) -> list[LookAlike]:
        """Raise :class:`PanelOverlapError` for a panel member that leaks training; return the look-alikes.

        Populations on either side are expanded to their concrete members. For a panel member ``P`` and each
        training simulator ``T``:

        - **leak** (refused): ``P`` is ``T`` (the same object), has a spec equal to ``T``'s (the same simulator
          built twice), or plays the same model parameters (:func:`model_key`) with the same persona set,
          whatever the decoding: then it is ``T`` sampled another way.
        - **look-alike** (evaluated, returned): ``P`` shares an axis with ``T`` but is no leak: the decoding
          settings (all equal), the model (when the personas differ) or the persona set (when the model
          differs). Each :class:`LookAlike` names the shared axes, for the panel card and the report.

        **Same model parameters** (:func:`model_key`): the spec's model once wrappers are removed and with the
        settings that choose parameters. The act-level persuadee's model is its parameter-set name (``base``,
        ``heldout-<i>``, ``shuffled-<i>``, ``fitted-<i>``) with :data:`MODEL_SETTINGS` (``jitter``,
        ``model_seed``, ``corpus``); an LLM's is its model name or path (``frozen:``, ``verbalized:`` and
        ``trainable:`` over one LLM share it: verbalized sampling is a decoding, and a trainable simulator's
        ``+lora:<adapter>`` starts at the base weights and is anchored to them); a wrapper spec
        (``verbalized:persuadee:M``, ``trainable:persuadee:M``) plays its inner model ``M`` (a trainable
        simulator's starting point, which its KL anchor keeps it near).

        With ``strict`` (the all-axes rule) every shared axis is refused: ``P`` must differ from every ``T`` in
        persona set and decoding, and must not use the model of every ``T`` (when training mixes models it may
        share one of them) unless its label is in ``shared_model`` (e.g. an LLM member when only one LLM is
        available: held out by persona and decoding alone, which a report must say).
        """
        train = leaf_simulators([training] if isinstance(training, Population) else list(training))
        if not train:
            raise PanelOverlapError("no training simulators to check the panel against")
        problems, alike = [], []
        for label, simulator in self.members.items():
            for p in leaf_simulators([simulator]):
                ps, pk = p.spec, model_key(p.spec)
                for t in train:
                    ts, tk = t.spec, model_key(t.spec)
                    if p is t or ps == ts:
                        problems.append(f"{label}: {p.name!r} is also a training simulator ({t.name!r})")
                        continue
                    if pk == tk and ps.personas == ts.personas:
                        problems.append(f"{label}: {p.name!r} plays the model and persona set of training simulator "
                                        f"{t.name!r} ({ps.model!r}, {ps.personas!r}): only its decoding differs")
                        continue
                    described = {"persona set": f"persona set {ps.personas!r}",
                                 "decoding": f"decoding settings {dict(ps.decoding)}", "model": f"model {ps.model!r}"}
                    axes = [axis for axis, same in (("persona set", ps.personas == ts.personas),
                                                    ("decoding", ps.decoding == ts.decoding), ("model", pk == tk))
                            if same]
                    if strict:
                        problems += [f"{label}: {p.name!r} shares {described[axis]} with training simulator "
                                     f"{t.name!r}" for axis in axes if axis != "model"]
                    elif axes:
                        alike.append(LookAlike(label, t.name, tuple(described[axis] for axis in axes)))
                if strict and label not in shared_model and all(pk == model_key(t.spec) for t in train):
                    problems.append(f"{label}: {p.name!r} uses model {ps.model!r}, the model of every training "
                                    f"simulator")
        if problems:
            advice = ("Give held-out simulators another persona set, decoding and model." if strict else
                      "Give held-out simulators another model or persona set (sharing one is reported, not refused).")
            raise PanelOverlapError(f"panel {self.name!r} is not held out from training:\n  " + "\n  ".join(problems)
                                    + "\n" + advice)
        return alike
