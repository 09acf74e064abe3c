"""``simpop openenv serve --cotrain``: its --cotrain-dir checked before the server starts, failed checkpoint writes
counted, and --resume refusing what does not fit the checkpoint (another objective, another kind of checkpoint)
while applying what may change (the learning rate)."""

from __future__ import annotations

import errno
import logging
import shutil

import pytest

pytest.importorskip("openenv", reason="the OpenEnv server needs pip install simpop[openenv]")

from simpop import checkpoint  # noqa: E402
from simpop.cli import main  # noqa: E402
from simpop.files import RUN_LOCK  # noqa: E402
from simpop.integrations.openenv_cotrain import ServerCoTrainer  # noqa: E402
from simpop.integrations.openenv_server import OpenEnvServer, UserSeatSource, make_server  # noqa: E402
from simpop.train.cotrain import CoTrainConfig  # noqa: E402
from tests.integrations.test_openenv_cotrain import ACT, play  # noqa: E402
from tests.test_run_lock import one_line, snapshot  # noqa: E402

SIM = "trainable:persuadee"
SOURCE = UserSeatSource(ACT, [SIM], env_kwargs={"max_turns": 4})
SERVE = ["openenv", "serve", "--env", ACT, "--env-arg", "max_turns=4", "--simulator", SIM, "--port", "0",
         "--cotrain", "--cotrain-episodes", "4"]


@pytest.fixture(autouse=True)
def no_serving(monkeypatch):
    """A CLI server that got past its checks stops at once (it would serve until interrupted)."""
    def stop(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(OpenEnvServer, "serve_forever", stop)


def files(folder) -> dict:
    """:func:`snapshot` without the lock file (its holders open it)."""
    return {k: v for k, v in snapshot(folder).items() if k != RUN_LOCK}


def train(cotrainer: ServerCoTrainer, episodes: int = 8) -> None:
    with make_server(SOURCE, port=0, environment=cotrainer.environment).start() as server:
        play(server.url, episodes)
        cotrainer.wait()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A --cotrain-dir with checkpoints of objective ``target`` at learning rate 0.05."""
    run_dir = tmp_path_factory.mktemp("cotrained")
    cotrainer = ServerCoTrainer(SOURCE, CoTrainConfig(sim_lr=0.05), episodes_per_update=4, run_dir=run_dir)
    train(cotrainer)
    cotrainer.close()
    assert cotrainer.versions[SIM] >= 1 and checkpoint.latest(run_dir) is not None
    return run_dir, dict(cotrainer.versions)


@pytest.fixture
def copy(trained, tmp_path):
    shutil.copytree(trained[0], tmp_path / "sims")
    return tmp_path / "sims"


# ------------------------------------------------------------------------------------------ the folder (item 4)
@pytest.mark.parametrize("where", ["/proc/simpop-sims", "file/sims", "file"])
def test_a_cotrain_dir_that_cannot_be_written_is_refused_before_the_server_starts(tmp_path, capsys, where):
    (tmp_path / "file").write_text("x")
    out = tmp_path / where
    assert main([*SERVE, "--cotrain-dir", str(out)]) == 2
    line = one_line(capsys)
    assert line.startswith(f"simpop openenv serve: error: --cotrain-dir {out}:") and "folder" in line, line
    assert (tmp_path / "file").read_text() == "x"


def test_a_second_cotrainer_on_one_folder_is_refused_until_the_first_closes(tmp_path):
    first = ServerCoTrainer(SOURCE, episodes_per_update=4, run_dir=tmp_path / "sims")
    with pytest.raises(ValueError, match="another simpop run is writing --cotrain-dir"):
        ServerCoTrainer(SOURCE, episodes_per_update=4, run_dir=tmp_path / "sims")
    first.close()
    ServerCoTrainer(SOURCE, episodes_per_update=4, run_dir=tmp_path / "sims").close()


def test_a_failed_checkpoint_write_is_a_counted_one_line_warning(tmp_path, monkeypatch, caplog):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    cotrainer = ServerCoTrainer(SOURCE, episodes_per_update=4, run_dir=tmp_path / "sims")
    monkeypatch.setattr(checkpoint, "save", full)
    with caplog.at_level(logging.WARNING, logger="simpop.integrations.openenv_cotrain"):
        train(cotrainer, episodes=16)
    cotrainer.close()
    updates = cotrainer.versions[SIM]
    assert updates >= 1 and cotrainer.checkpoint_failures == updates  # training went on, every failure counted
    records = [r for r in caplog.records if r.name == "simpop.integrations.openenv_cotrain"]
    assert len(records) == updates and all(r.levelno == logging.WARNING and r.exc_info is None for r in records)
    assert all("No space left on device" in r.getMessage() and "\n" not in r.getMessage() for r in records)


def test_without_resume_a_folder_holding_checkpoints_is_refused(copy):
    before = files(copy)
    with pytest.raises(ValueError, match="already holds checkpoints; pass --resume"):
        ServerCoTrainer(SOURCE, episodes_per_update=4, run_dir=copy)
    assert files(copy) == before


# ------------------------------------------------------------------------------------------ resume (item 5)
def test_resume_with_another_objective_is_refused_naming_the_setting(copy, capsys):
    before = files(copy)
    with pytest.raises(ValueError, match=r"objective \(--cotrain-objective\): saved 'target', given 'persona'") as refused:
        ServerCoTrainer(SOURCE, CoTrainConfig(objective="persona"), episodes_per_update=4, run_dir=copy, resume=True)
    assert "\n" not in str(refused.value)
    assert main([*SERVE, "--cotrain-objective", "persona", "--cotrain-dir", str(copy), "--resume"]) == 2
    line = one_line(capsys)
    assert "--cotrain-objective" in line and "saved 'target', given 'persona'" in line, line
    assert files(copy) == before


def test_resume_applies_a_new_learning_rate(copy, trained):
    resumed = ServerCoTrainer(SOURCE, CoTrainConfig(sim_lr=0.2), episodes_per_update=4, run_dir=copy, resume=True)
    assert resumed.versions == trained[1]
    assert [g["lr"] for o in resumed.step.optimizers for g in o.param_groups] == [0.2]
    resumed.close()


def test_a_folder_holding_another_kind_of_checkpoint_is_named(tmp_path, capsys):
    run = tmp_path / "grpo"
    assert main(["train", "grpo", "--env", ACT, "--env-arg", "max_turns=4", "--no-progress", "--threads", "1",
                 "--updates", "1", "--group-size", "2", "--scenarios-per-update", "2", "--hidden-size", "8",
                 "--no-export", "--out", str(run)]) == 0
    capsys.readouterr()
    before = files(run)
    assert main([*SERVE, "--cotrain-dir", str(run), "--resume"]) == 2
    line = one_line(capsys)
    assert "holds another kind of checkpoint" in line and "policy" in line, line
    assert "expected a server co-training checkpoint (simulators, versions, optimizers, history)" in line, line
    assert files(run) == before
