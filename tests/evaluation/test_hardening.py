"""``simpop eval`` and the rollout engine under abuse and carelessness: wrong-length policy batches, torn and odd
records on resume, shared and foreign --out folders, panel specs checked at setup, one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

import simpop
from simpop.rollout import Job, RolloutEngine
from simpop.seat import Player
from simpop.simulators.registry import build_simulator

ENV = "simpop/PersuasionAct-v0"
KWARGS = {"max_turns": 4}


class Miscounting(Player):
    """An act-level policy returning ``extra`` more (or fewer) actions than it was asked for."""

    def __init__(self, extra: int):
        self.extra = extra

    def act_batch(self, observations, slots):
        return [0] * max(0, len(observations) + self.extra)


@pytest.mark.parametrize("extra", [1, -1])
def test_a_policy_batch_of_the_wrong_length_is_an_error_not_truncated(extra):
    env = simpop.make(ENV, **KWARGS)
    engine = RolloutEngine(lambda: simpop.make(ENV, **KWARGS), Miscounting(extra), build_simulator("native", env),
                           n_envs=2)
    with pytest.raises(ValueError, match=rf"returned {2 + extra} action\(s\) for 2 observation"):
        engine.run([Job(s, 0, i) for i, s in enumerate(env.scenario_ids()[:2])], np.random.default_rng(0))


def test_resume_drops_a_line_torn_inside_a_multibyte_character_and_records_of_the_wrong_types(tmp_path):
    from simpop.evaluation.eval_records import EPISODES, read_records
    from tests.evaluation.test_eval_run import run

    whole = run(tmp_path, episodes=3)
    path = tmp_path / EPISODES
    lines = path.read_bytes().splitlines(keepends=True)
    record = lines[-1].decode()
    bad_reward = record.replace('"reward": ', '"reward": "lots", "was": ', 1).encode()
    torn = "é".encode() + "€ …".encode()[:2]  # ends inside the euro sign's three bytes
    path.write_bytes(b"".join(lines[:-1]) + bad_reward + b'{"member": "native", "text": "' + torn)
    assert len(read_records(path)) == len(lines) - 1
    resumed = run(tmp_path, episodes=3, resume=True)
    assert resumed == whole and len(read_records(path)) == len(lines)


class Blocking(Player):
    """An act-level policy that waits (at most 20 s) for ``go`` before its first action."""

    def __init__(self, go):
        self.go, self.started = go, __import__("threading").Event()

    def act_batch(self, observations, slots):
        self.started.set()
        self.go.wait(20)
        return [0] * len(observations)


def test_two_runs_never_write_one_out_folder(tmp_path):
    import threading

    from simpop.evaluation.eval_records import EPISODES, read_records
    from tests.evaluation.test_eval_run import run

    go = threading.Event()
    blocking = Blocking(go)
    first = threading.Thread(target=run, args=(tmp_path,), kwargs={"policy": blocking, "episodes": 2}, daemon=True)
    first.start()
    try:
        assert blocking.started.wait(20)
        with pytest.raises(ValueError, match="another simpop run is writing"):
            run(tmp_path, episodes=2, seed=8)
    finally:
        go.set()
        first.join(30)
    assert len(read_records(tmp_path / EPISODES)) == 4  # the first run's alone
    run(tmp_path, episodes=2, resume=True)  # the lock went with its run


def test_an_out_folder_that_is_not_an_evaluation_is_never_written(tmp_path):
    from simpop.files import RUN_LOCK
    from tests.evaluation.test_eval_run import run
    from tests.study.conftest import make_study

    study = make_study(tmp_path / "study")
    study.close()
    (tmp_path / "study" / "episodes.jsonl").write_text("")
    before = {p.name: p.read_bytes() for p in (tmp_path / "study").iterdir()}
    for resume in (False, True):
        with pytest.raises(ValueError, match="holds no eval.json: not a simpop eval folder"):
            run(tmp_path / "study", episodes=2, resume=resume)
    assert {p.name: p.read_bytes() for p in (tmp_path / "study").iterdir() if p.name != RUN_LOCK} == before
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "report.md").write_text("mine")
    with pytest.raises(ValueError, match="is not empty"):
        run(tmp_path / "notes", episodes=2, resume=True)
    assert (tmp_path / "notes" / "report.md").read_text() == "mine"


def eval_cli(tmp_path, *extra):
    from simpop.cli import main

    return main(["eval", "--env", ENV, "--env-arg", "max_turns=4", "--no-progress", "--panel", "p4g-act-v1",
                 "--episodes", "2", *extra])


def one_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_bad_out_folders_and_settings_files_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for out, needle in ((tmp_path / "file", "exists and is not a folder"),
                        (tmp_path / "file" / "under", "cannot make or write the folder"),
                        ("/proc/simpop-eval", "cannot make or write the folder")):
        assert eval_cli(tmp_path, "--policy", "reference", "--out", str(out)) == 2
        assert needle in one_line(capsys)
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "eval.json").write_text("[1, 2]")
    assert eval_cli(tmp_path, "--policy", "reference", "--out", str(tmp_path / "list"), "--resume") == 2
    assert "not a simpop eval settings file" in one_line(capsys)


def test_module_policies_that_fail_to_load_are_one_line_errors(tmp_path, capsys, monkeypatch):
    (tmp_path / "broken_policy_mod.py").write_text("raise RuntimeError('no GPU here')\n")
    (tmp_path / "factory_policy_mod.py").write_text("def make():\n    raise RuntimeError('no weights')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert eval_cli(tmp_path, "--policy", "broken_policy_mod:Policy", "--out", str(tmp_path / "a")) == 2
    assert "cannot import it (RuntimeError: no GPU here)" in one_line(capsys)
    assert eval_cli(tmp_path, "--policy", "factory_policy_mod:make", "--out", str(tmp_path / "b")) == 2
    assert "its factory raised RuntimeError: no weights" in one_line(capsys)


def test_a_full_disk_during_an_evaluation_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    import errno

    from simpop.evaluation import eval_run

    def full(path, records):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(eval_run, "append_records", full)
    assert eval_cli(tmp_path, "--policy", "reference", "--out", str(tmp_path / "out")) == 2
    line = one_line(capsys)
    assert "No space left on device" in line and "--resume" in line


@pytest.mark.parametrize("members, needle", [
    ({"hot": "persuadee?temperature=nan"}, "expects a finite number"),
    ({"hot": "persuadee?temperature=inf"}, "expects a finite number"),
    ({"llm": "frozen:smollm2"}, "user seat takes discrete acts"),
    ({"tau": "native:simpop/Tau2-mock-v0"}, "cannot play PersuasionActEnv's user seat"),
    ({"   ": "persuadee"}, "not blank"),
    ({"a\n| fake | row |": "persuadee"}, "no line breaks"),
])
def test_panel_specs_that_cannot_run_are_refused_at_setup(tmp_path, capsys, members, needle):
    import yaml

    (tmp_path / "panel.yaml").write_text(yaml.safe_dump({"name": "bad", "members": members}))
    from simpop.cli import main

    code = main(["eval", "--env", ENV, "--env-arg", "max_turns=4", "--no-progress", "--panel",
                 str(tmp_path / "panel.yaml"), "--episodes", "2", "--policy", "reference", "--out",
                 str(tmp_path / "out")])
    assert code == 2 and needle in one_line(capsys)
    assert not (tmp_path / "out").exists()
