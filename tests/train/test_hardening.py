"""``simpop train`` under careless and hostile input: YAML bombs and deep nesting, a full disk, huge batches."""

from __future__ import annotations

import errno

from simpop.cli import main

ENV = ["--env", "simpop/PersuasionAct-v0", "--no-progress"]
SMALL = ["--group-size", "2", "--scenarios-per-update", "2", "--env-arg", "max_turns=4"]
#: Six levels of aliases: ~280 bytes that expand to 9**6 = 531441 strings.
BOMB = "[&a [lol,lol,lol,lol,lol,lol,lol,lol,lol], " + ", ".join(
    f"&{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcde", "bcdef")) + "]"


def train(tmp_path, *extra: str) -> int:
    return main(["train", "grpo", *ENV, "--updates", "0", "--out", str(tmp_path / "run"), *extra])


def test_a_yaml_alias_bomb_is_refused_with_a_short_message(tmp_path, capsys):
    assert len(BOMB) < 300
    (tmp_path / "bomb.yaml").write_text(f"lr: {BOMB}\n")
    assert train(tmp_path, "--config", str(tmp_path / "bomb.yaml")) == 2
    err = capsys.readouterr().err
    assert "expands to" in err and len(err) < 1000 and err.count("\n") == 1
    assert train(tmp_path, "--env-arg", f"max_turns={BOMB}") == 2
    err = capsys.readouterr().err
    assert "--env-arg max_turns" in err and "expands to" in err and len(err) < 1000


def test_deeply_nested_yaml_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "deep.yaml").write_text("lr: " + "[" * 3000 + "]" * 3000 + "\n")
    assert train(tmp_path, "--config", str(tmp_path / "deep.yaml")) == 2
    err = capsys.readouterr().err
    assert "nested deeper than" in err and err.count("\n") == 1
    assert train(tmp_path, "--env-arg", "max_turns=" + "[" * 3000 + "]" * 3000) == 2
    assert "nested deeper than" in capsys.readouterr().err


def test_a_full_disk_during_training_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    from simpop import checkpoint

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save", full)
    assert main(["train", "grpo", *ENV, *SMALL, "--updates", "1", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "--resume" in err and err.count("\n") == 1


def test_a_batch_too_large_to_hold_is_refused(tmp_path, capsys):
    assert train(tmp_path, "--scenarios-per-update", "200000") == 2
    assert "dialogues per update; at most 16384" in capsys.readouterr().err


def test_an_unreachable_generator_server_is_a_one_line_error(tiny_model, tmp_path, capsys):
    from simpop.agents.vllm_server import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code = main(["train", "grpo", "--env", "simpop/Persuasion-v0", "--no-progress", "--model", str(tiny_model),
                 "--lora", "--generator", f"vllm:{url}", "--updates", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and f"{url}/v1/models failed: ConnectError" in err and err.count("\n") == 1
