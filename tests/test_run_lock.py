"""One writer per run folder: :func:`simpop.files.run_lock`, and every command that writes a run folder refusing
a second writer (one line, exit 2) before it touches a file there."""

from __future__ import annotations

from pathlib import Path

import pytest

from simpop.cli import main
from simpop.files import RUN_LOCK, run_lock

ACT = ["--env", "simpop/PersuasionAct-v0", "--env-arg", "max_turns=4"]
TRAIN = [*ACT, "--no-progress", "--threads", "1", "--updates", "1"]
GRPO = ["--group-size", "2", "--scenarios-per-update", "2", "--hidden-size", "8"]
PPO = ["--n-envs", "2", "--n-steps", "8", "--minibatch-size", "8", "--epochs", "1"]
EXPERIMENT = ["--seeds", "1", "--updates", "1", "--eval-every", "1", "--eval-episodes", "2", "--max-turns", "4",
              "--workers", "1", "--grpo.group-size", "2", "--grpo.scenarios-per-update", "2"]


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: its bytes and modification time (a rewrite with the same bytes shows)."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def refused_while_held(capsys, out: Path, argv: list[str]) -> None:
    """``simpop ARGV`` while this process holds ``out``'s lock: exit 2, one line naming ``out``, nothing written."""
    with run_lock(out):
        before = snapshot(out)
        assert main(argv) == 2
        assert snapshot(out) == before
    line = one_line(capsys)
    assert "another simpop run is writing" in line and str(out) in line, line


# ------------------------------------------------------------------------------------------ the lock itself
def test_the_lock_makes_the_folder_refuses_a_second_holder_and_goes_with_its_holder(tmp_path):
    out = tmp_path / "a" / "run"
    with run_lock(out, "--cotrain-dir") as folder:
        assert folder == out and out.is_dir() and sorted(p.name for p in out.iterdir()) == [RUN_LOCK]
        with pytest.raises(ValueError, match="another simpop run is writing --cotrain-dir .*choose another "
                                             "--cotrain-dir") as refused:
            with run_lock(out, "--cotrain-dir"):
                pytest.fail("a second holder got the lock")
        assert str(out) in str(refused.value) and "\n" not in str(refused.value)
    with run_lock(out):  # released at the end of the block
        pass
    with pytest.raises(RuntimeError, match="inside"):
        with run_lock(out):
            raise RuntimeError("inside")
    with run_lock(out):  # released on an error too
        pass


@pytest.mark.parametrize("where, needle", [
    ("file", "exists and is not a folder"),
    ("file/run", "cannot make or write the folder"),
    ("/proc/simpop-run", "cannot make or write the folder"),
])
def test_a_folder_that_cannot_be_made_or_written_is_one_line(tmp_path, where, needle):
    (tmp_path / "file").write_text("x")
    out = tmp_path / where
    with pytest.raises(ValueError, match=needle) as refused:
        with run_lock(out):
            pytest.fail("locked an unwritable folder")
    assert str(refused.value).startswith(f"--out {out}:") and "\n" not in str(refused.value)


def test_a_folder_where_nothing_can_be_written_is_refused(tmp_path, monkeypatch):
    # Permission bits do not stop root, so the probe is a real write: make it fail.
    import simpop.files

    def full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(simpop.files, "write_atomically", full)
    with pytest.raises(ValueError, match="cannot make or write the folder .No space left on device"):
        with run_lock(tmp_path / "run"):
            pytest.fail("locked an unwritable folder")
    monkeypatch.undo()
    with run_lock(tmp_path / "run"):  # the failed probe released the lock
        pass


# ------------------------------------------------------------------------------------------ every writer
@pytest.mark.parametrize("trainer, flags", [("grpo", GRPO), ("cotrain", GRPO), ("selfplay", GRPO), ("ppo", PPO)])
def test_train_refuses_a_second_writer(tmp_path, capsys, trainer, flags):
    out = tmp_path / "run"
    refused_while_held(capsys, out, ["train", trainer, *TRAIN, *flags, "--out", str(out)])


def test_train_resume_on_a_live_run_touches_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "grpo", *TRAIN, *GRPO, "--no-export", "--out", str(out)]) == 0
    capsys.readouterr()
    refused_while_held(capsys, out, ["train", "grpo", *TRAIN[:-1], "2", *GRPO, "--resume", "--out", str(out)])


@pytest.mark.parametrize("argv", [
    ["collapse", "--quiet", "--conditions", "frozen", "--no-robust-panel", *EXPERIMENT],
    ["adaptive", "--quiet", "--conditions", "failure", "--grow-every", "1", "--pool.probe-episodes", "2",
     "--pool.cap", "2", *EXPERIMENT],
    ["monitor", "--seeds", "1", "--conditions", "frozen", "--updates", "1", "--eval-every", "1", "--eval-episodes",
     "2", "--probe-every", "1", "--probe-episodes", "2", "--workers", "1"],
])
def test_experiment_refuses_a_second_writer(tmp_path, capsys, argv):
    out = tmp_path / "exp"
    refused_while_held(capsys, out, ["experiment", *argv, "--out", str(out)])


def test_eval_refuses_a_second_writer(tmp_path, capsys):
    out = tmp_path / "eval"
    refused_while_held(capsys, out, ["eval", *ACT, "--no-progress", "--panel", "p4g-act-v1", "--episodes", "2",
                                     "--policy", "reference", "--out", str(out)])


AUDIT = ["audit", "--realism", "--act-sim", "persuadee", "--act-episodes", "2"]


def test_audit_refuses_a_second_writer(tmp_path, capsys):
    out = tmp_path / "audit"
    refused_while_held(capsys, out, [*AUDIT, "--out", str(out)])


def test_audit_writes_only_its_own_folder(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "report.md").write_text("mine")
    (tmp_path / "notes" / "plan.txt").write_text("mine too")
    before = snapshot(tmp_path / "notes")
    for out, needle in ((tmp_path / "notes", "not written by simpop audit (plan.txt)"),
                        (tmp_path / "file", "exists and is not a folder"),
                        (tmp_path / "file" / "audit", "cannot make or write the folder"),
                        (Path("/proc/simpop-audit"), "cannot make or write the folder")):
        assert main([*AUDIT, "--out", str(out)]) == 2
        line = one_line(capsys)
        assert needle in line and str(out) in line, line
    assert {k: v for k, v in snapshot(tmp_path / "notes").items() if k != RUN_LOCK} == before
    out = tmp_path / "audit"
    assert main([*AUDIT, "--out", str(out)]) == 0
    assert main([*AUDIT, "--out", str(out)]) == 0  # its own outputs are rewritten
    assert {p.name for p in out.iterdir()} == {"realism.json", "realism.md", RUN_LOCK}


def test_openenv_cotrain_refuses_a_second_writer(tmp_path, capsys, monkeypatch):
    pytest.importorskip("openenv", reason="the OpenEnv server needs pip install simpop[openenv]")
    from simpop.integrations.openenv_server import OpenEnvServer

    def stop(self):  # a server that started would serve until interrupted: stop it at once
        raise KeyboardInterrupt

    monkeypatch.setattr(OpenEnvServer, "serve_forever", stop)
    out = tmp_path / "sims"
    refused_while_held(capsys, out, ["openenv", "serve", "--env", "simpop/PersuasionAct-v0", "--simulator",
                                     "trainable:persuadee", "--port", "0", "--cotrain", "--cotrain-dir", str(out)])
