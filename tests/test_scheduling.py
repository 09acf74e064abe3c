"""The suite's derived marks, groups and order (tests/scheduling.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.scheduling import SLOW_S, DurationRecorder, base_id, forecast, mark_and_order


class Item:
    """What mark_and_order reads of a collected test: its id, fixtures (name -> scope) and the marks it gets."""

    def __init__(self, nodeid: str, **fixtures: str):
        self.nodeid, self.fixturenames, self.marks = nodeid, list(fixtures), []
        self._fixtureinfo = SimpleNamespace(name2fixturedefs={
            name: [SimpleNamespace(scope=scope)] for name, scope in fixtures.items()})

    def add_marker(self, mark):
        self.marks.append(mark.mark if hasattr(mark, "mark") else mark)

    def marked(self, name: str) -> list:
        return [mark.args for mark in self.marks if mark.name == name]

    def iter_markers(self, name: str):
        return (mark for mark in self.marks if mark.name == name)


def test_resources_share_a_group_modules_share_their_fixtures_and_the_longest_go_first():
    vllm_a = Item("tests/a.py::test_served", vllm_server="session")
    module_a, module_b = Item("tests/b.py::test_one", data="module"), Item("tests/b.py::test_two", data="module")
    alone = Item("tests/c.py::test_alone", tmp_path="function")
    vllm_b = Item("tests/d.py::test_launcher", vllm_python="session")  # starts an engine of its own
    items = [vllm_a, module_a, alone, module_b, vllm_b]
    durations = {"tests/b.py::test_one": 30.0, "tests/b.py::test_two": 30.0, "tests/c.py::test_alone": 50.0,
                 "tests/a.py::test_served": 1.0, "tests/d.py::test_launcher": 1.0}
    mark_and_order(items, durations)
    assert items == [module_a, module_b, alone, vllm_a, vllm_b]  # 60 s, 50 s, then the server's 2 s
    assert vllm_a.marked("xdist_group") == vllm_b.marked("xdist_group") == [("vllm",)]
    assert module_a.marked("xdist_group") == module_b.marked("xdist_group") == [("tests/b.py",)]
    assert alone.marked("xdist_group") == []


def test_resources_that_one_test_uses_together_are_held_by_one_worker():
    ray, served = Item("t.py::test_cluster", ray_cluster="session"), Item("t.py::test_served", vllm_server="session")
    both = Item("t.py::test_served_on_the_cluster", vllm_server="session", ray_cluster="session")
    page = Item("t.py::test_page", browser="module")
    mark_and_order([ray, served, both, page], {})
    assert ray.marked("xdist_group") == served.marked("xdist_group") == both.marked("xdist_group") == [("ray+vllm",)]
    assert page.marked("xdist_group") == [("browser",)]


def test_the_forecast_replays_xdists_hand_out_of_groups_whole():
    served = [Item(f"s.py::test_{n}", vllm_server="session") for n in range(4)]  # one group: 4 x 10 s
    alone = [Item("a.py::test_a"), Item("b.py::test_b"), Item("c.py::test_c")]
    durations = {**{item.nodeid: 10.0 for item in served}, "a.py::test_a": 30.0, "b.py::test_b": 20.0,
                 "c.py::test_c": 5.0}
    items = [*alone, *served]
    mark_and_order(items, durations)
    assert items == [*served, *alone]
    # Worker 0 takes the group, worker 1 test_a and at once test_b (one test left is two or fewer); test_c goes to
    # the worker that next has two or fewer left: worker 1, after test_a, though worker 0 would finish first.
    assert forecast(items, durations) == [40.0, 55.0]
    assert forecast(items, {}) == [0.0, 0.0] and forecast(items, durations, workers=1) == [95.0]


def test_slow_comes_from_a_fixture_or_the_recorded_time():
    real_model, long, quick = Item("t.py::m", smollm2="session"), Item("t.py::l"), Item("t.py::q")
    mark_and_order([real_model, long, quick], {"t.py::l": SLOW_S, "t.py::q": SLOW_S - 0.1})
    assert real_model.marked("slow") and long.marked("slow") and not quick.marked("slow")


@pytest.mark.parametrize(("nodeid", "expected"), [
    ("tests/a.py::test_x@vllm", "tests/a.py::test_x"),
    ("tests/a.py::test_x@tests/a.py", "tests/a.py::test_x"),
    ("tests/a.py::test_x[user@host]", "tests/a.py::test_x[user@host]"),
    ("tests/a.py::test_x[user@host]@ray", "tests/a.py::test_x[user@host]"),
    ("tests/a.py::test_x", "tests/a.py::test_x"),
])
def test_the_group_xdist_appends_is_not_part_of_the_test_id(nodeid, expected):
    assert base_id(nodeid) == expected


def test_the_record_keeps_what_took_time_and_a_run_names_what_it_misses(tmp_path, monkeypatch):
    import tests.scheduling as scheduling

    monkeypatch.setattr(scheduling, "DURATIONS", tmp_path / "durations.json")
    recorder = DurationRecorder(store=True, known={})
    for seconds in (1.5, 1.0, 0.01):  # setup, call, teardown
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid="t.py::slow@vllm", duration=seconds))
    recorder.pytest_runtest_logreport(SimpleNamespace(nodeid="t.py::instant", duration=0.01))
    recorder.pytest_sessionfinish(None)
    assert scheduling.recorded_durations() == {"t.py::slow": 2.5}

    lines: list[str] = []
    reporter = SimpleNamespace(write_line=lines.append)
    DurationRecorder(store=False, known=scheduling.recorded_durations()).pytest_terminal_summary(reporter)
    assert lines == []
    unknown = DurationRecorder(store=False, known={})
    unknown.seconds.update(recorder.seconds)
    unknown.pytest_terminal_summary(reporter)
    assert len(lines) == 1 and "t.py::slow" in lines[0] and "make durations" in lines[0]
