"""Input validation (issue 18, item 9): each original input, refused (or read) clearly.

Configs refuse a wrong type with a ``ValueError`` naming the field; the CLIs exit with code 2 and one line
on stderr naming the field or flag (no traceback); Gymnasium's ``make`` refuses simulator spec strings and
render modes the envs do not have (so that Stable-Baselines3's ``make_vec_env`` falls back); text envs
reject lone surrogates and JSON nested too deeply to parse as invalid actions.
"""

from __future__ import annotations

import json
import warnings

import gymnasium
import pytest

import simpop
from simpop.agents.policy import ModelConfig
from simpop.cli import main
from simpop.envs.dialogue import NESTED_TOO_DEEP
from simpop.envs.wrappers import UnsupportedRenderMode
from simpop.experiments.conditions import CollapseConfig
from simpop.train.config import build
from simpop.train.grpo import GRPOConfig
from simpop.train.loop import LoopConfig
from simpop.validation import check

ACT = "simpop/PersuasionAct-v0"


def _one_line_error(capsys, *needles: str) -> str:
    """The stderr of a refused command: one line, no traceback, naming every needle."""
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def _train(tmp_path, *extra: str) -> int:
    """``simpop train grpo`` on the act env; every call here is refused before training (else it trains 1 update)."""
    return main(["train", "grpo", "--env", ACT, "--no-progress", "--updates", "1", "--out", str(tmp_path / "run"),
                 *extra])


# ------------------------------------------------------------------------------------------ config loader
def _yaml(tmp_path, text: str):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_a_quoted_false_is_refused_not_taken_as_true(tmp_path):
    # `scale_rewards: "false"` was truthy; every bool field now takes only true/false.
    with pytest.raises(ValueError, match=r"LoopConfig: monitor must be true or false, got 'false'"):
        build(LoopConfig, yaml_path=_yaml(tmp_path, 'monitor: "false"\n'))
    with pytest.raises(ValueError, match=r"GRPOConfig: log_entropy must be true or false"):
        build(GRPOConfig, yaml_path=_yaml(tmp_path, "log_entropy: 'no'\n"))
    with pytest.raises(ValueError, match=r"ModelConfig: lora must be true or false"):
        build(ModelConfig, values={"lora": 1})
    assert build(LoopConfig, yaml_path=_yaml(tmp_path, "monitor: false\n")).monitor is False


@pytest.mark.parametrize(("text", "field", "hint"), [
    ("temperature: .inf\n", "temperature", "must be a finite number, got inf"),
    ("lr: .nan\n", "lr", "must be a finite number"),
    ("group_size: 4.7\n", "group_size", "must be an integer, got 4.7"),
    ("seed: true\n", "seed", "must be an integer, got True"),
    ("seed: -1\n", "seed", "must be from 0 to"),
    ("lr: abc\n", "lr", "must be a number or null, got 'abc'"),
    ("algorithm: [grpo]\n", "algorithm", "must be a string"),
    ("loss_aggregation: token-max\n", "loss_aggregation", "must be one of 'token-mean'"),
])
def test_yaml_values_are_type_checked_naming_the_field(tmp_path, text, field, hint):
    with pytest.raises(ValueError, match=f"GRPOConfig: {field} {hint}".replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace(".", r"\.")):
        build(GRPOConfig, yaml_path=_yaml(tmp_path, text))


def test_numbers_written_as_text_are_read_as_numbers(tmp_path):
    # PyYAML reads `1e-2` (no dot) as the string "1e-2": it is a number for a float field.
    config = build(GRPOConfig, yaml_path=_yaml(tmp_path, "lr: 1e-2\nclip_eps: '0.1'\ngroup_size: '6'\n"))
    assert (config.lr, config.clip_eps, config.group_size) == (0.01, 0.1, 6)
    assert isinstance(config.lr, float) and isinstance(config.group_size, int)


def test_nested_config_sections_are_type_checked_too():
    with pytest.raises(ValueError, match=r"CollapseConfig: grpo: GRPOConfig: group_size must be an integer"):
        build(CollapseConfig, values={"grpo": {"group_size": 4.7}})
    with pytest.raises(ValueError, match=r"CollapseConfig: conditions must be a list"):
        build(CollapseConfig, values={"conditions": "frozen"})
    with pytest.raises(ValueError, match=r"conditions\[1\] must be a string"):
        build(CollapseConfig, values={"conditions": ["frozen", 3]})
    with pytest.raises(ValueError, match=r"first_seed must be from 0 to"):
        build(CollapseConfig, values={"first_seed": -1})
    assert check("X", "sizes", tuple[int, ...], [1, "2"]) == (1, 2)


def test_train_cli_refuses_a_mistyped_yaml_config(tmp_path, capsys):
    for text, needle in (('grpo: {group_size: 4.7}\nmodel: {}\n', "group_size"),
                         ('monitor: "false"\n', "monitor"), ("temperature: .inf\n", "temperature")):
        assert _train(tmp_path, "--config", str(_yaml(tmp_path, text))) == 2
        _one_line_error(capsys, needle)
    assert _train(tmp_path, "--config", str(tmp_path / "missing.yaml")) == 2
    _one_line_error(capsys, "--config", "no such file")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------ simpop train
@pytest.mark.parametrize(("flags", "needles"), [
    (["--env-arg", "max_turns=abc"], ["max_turns", "must be an int", "'abc'"]),
    (["--env-arg", "max_turns=true"], ["max_turns", "must be an int"]),
    (["--env-arg", "maxturns=3"], ["unknown argument", "maxturns", "max_turns"]),
    (["--env-arg", "max_turns=[1"], ["--env-arg max_turns=[1"]),
    (["--updates", "-5"], ["--updates: must be an integer from 0 to 1000000000, got -5"]),
    (["--seed", "-1"], ["seed must be from 0 to", "-1"]),
    (["--temperature", "inf"], ["temperature must be a finite number"]),
    (["--eval-episodes", "0"], ["--eval-episodes: must be an integer from 1"]),
    (["--threads", "0"], ["--threads: must be an integer from 1 to 1024"]),
])
def test_train_cli_refuses_bad_flags_in_one_line(tmp_path, capsys, flags, needles):
    assert _train(tmp_path, *flags) == 2
    _one_line_error(capsys, "simpop train grpo: error:", *needles)
    assert not (tmp_path / "run").exists()


def test_an_llm_simulator_on_the_act_env_is_refused_before_anything_is_built(tmp_path, capsys, monkeypatch):
    import simpop.simulators.registry as registry

    def must_not_build(*args, **kwargs):
        raise AssertionError("the simulator was built: the check must come first")

    monkeypatch.setattr(registry, "build_simulator", must_not_build)
    assert _train(tmp_path, "--simulator", "frozen:smollm2") == 2
    _one_line_error(capsys, "--simulator frozen:smollm2", "discrete acts", "simpop/Persuasion-v1")
    assert _train(tmp_path, "--simulator", "persuadee", "--simulator", "verbalized:smollm2?k=3") == 2
    _one_line_error(capsys, "--simulator verbalized:smollm2")
    assert not (tmp_path / "run").exists()


def test_native_and_wrapped_native_kinds_still_pass_the_act_env_check():
    from simpop.train.cli import check_simulator_fits

    env = simpop.make(ACT)
    for spec in ("native", "persuadee", "trainable:persuadee", "verbalized:persuadee", ["persuadee", "native"]):
        check_simulator_fits(spec, env, ACT)  # no error
    check_simulator_fits("frozen:smollm2", simpop.make("simpop/Persuasion-v1"), "simpop/Persuasion-v1")


def test_an_unwritable_out_is_refused_up_front(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert _train(tmp_path, "--out", str(blocker / "run")) == 2
    _one_line_error(capsys, f"--out {blocker / 'run'}", "not a folder")
    assert _train(tmp_path, "--out", str(blocker)) == 2
    _one_line_error(capsys, "--out", "exists and is not a folder")


def test_an_out_folder_that_cannot_be_written_is_refused(tmp_path, capsys, monkeypatch):
    # Permission bits do not stop root, so the check writes for real: make that write fail.
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    assert _train(tmp_path, "--out", str(tmp_path / "locked" / "run")) == 2
    _one_line_error(capsys, "--out", "cannot write in", "Permission denied")


# ------------------------------------------------------------------------------------------ simpop experiment
@pytest.mark.parametrize(("flags", "needles"), [
    (["--seeds", "0"], ["seeds must be >= 1, got 0"]),
    (["--seeds", "-3"], ["seeds must be >= 1"]),
    (["--conditions", "frozn"], ["conditions must be a non-empty subset", "frozn"]),
    (["--conditions"], ["conditions must be a non-empty subset"]),
    (["--first-seed", "-2"], ["first_seed must be from 0 to"]),
    (["--grpo.group-size", "1"], ["group_size"]),
])
def test_experiment_cli_refuses_bad_flags_in_one_line(tmp_path, capsys, flags, needles):
    assert main(["experiment", "collapse", "--quiet", "--out", str(tmp_path / "c"), *flags]) == 2
    _one_line_error(capsys, "simpop experiment collapse: error:", *needles)
    assert not (tmp_path / "c").exists()


def test_experiment_cli_refuses_a_bad_config_file_and_out(tmp_path, capsys):
    assert main(["experiment", "collapse", "--quiet", "--out", str(tmp_path / "c"),
                 "--config", str(_yaml(tmp_path, "grpo:\n  group_size: 4.7\n"))]) == 2
    _one_line_error(capsys, "grpo: GRPOConfig: group_size must be an integer")
    assert main(["experiment", "collapse", "--quiet", "--config", str(tmp_path / "nope.yaml")]) == 2
    _one_line_error(capsys, "--config", "no such file")
    (tmp_path / "file").write_text("")
    assert main(["experiment", "collapse", "--quiet", "--out", str(tmp_path / "file" / "c")]) == 2
    _one_line_error(capsys, "--out")


# ------------------------------------------------------------------------------------------ Gymnasium / SB3
def test_gymnasium_make_refuses_a_bad_simulator_spec_or_value_in_one_line():
    with pytest.raises(ValueError, match="unknown simulator kind 'nonsense-kind'; valid kinds: frozen"):
        gymnasium.make(ACT, simulator="nonsense-kind")
    with pytest.raises(ValueError, match="unknown population field"):
        gymnasium.make(ACT, simulator={"persuadee": "heavy"})  # weights are numbers
    with pytest.raises(ValueError, match="member weights must be finite and >= 0"):
        gymnasium.make(ACT, simulator={"persuadee": -1.0})
    with pytest.raises(TypeError, match="must be a Simulator, a factory returning one or a spec"):
        gymnasium.make(ACT, simulator=5)


def test_gymnasium_make_type_checks_env_arguments():
    with pytest.raises(TypeError, match="argument max_turns must be an integer, got 'abc'"):
        gymnasium.make(ACT, max_turns="abc")
    with pytest.raises(TypeError, match="argument max_turns must be an integer, got 'abc'"):
        simpop.make(ACT, max_turns="abc")


def test_an_unknown_render_mode_is_refused_so_that_sb3_falls_back():
    with pytest.raises(UnsupportedRenderMode, match="render_mode='rgb_array'"):
        gymnasium.make(ACT, render_mode="rgb_array")
    assert issubclass(UnsupportedRenderMode, TypeError) and issubclass(UnsupportedRenderMode, ValueError)
    assert gymnasium.make(ACT, render_mode="ansi").unwrapped.render_mode == "ansi"
    from stable_baselines3.common.env_util import make_vec_env

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vec = make_vec_env(ACT, n_envs=2, seed=0)  # asks for rgb_array first, then falls back
    observations = vec.reset()
    assert observations.shape == (2, vec.observation_space.shape[0])
    _, rewards, _, _ = vec.step([0, 1])
    assert rewards.shape == (2,)
    vec.close()


# ------------------------------------------------------------------------------------------ text actions
LONE = ["\ud800", "I'll donate $1 \udfff", '{"name": "x", "arguments": {"a": "\udbff"}}']


@pytest.mark.parametrize("env_id", ["simpop/Persuasion-v0", "simpop/Persuasion-v1", "simpop/Tau2-mock-v0"])
def test_lone_surrogates_are_rejected_by_text_envs(env_id):
    env = simpop.make(env_id)
    for action in LONE:
        for _ in range(2):  # both seats
            env.reset(seed=0)
            if _:
                seat = env.to_act
                env.step({seat: "Hello, how can I help you today?"})
            seat = env.to_act
            observations, _, terminations, truncations, infos = env.step({seat: action})
            assert "unpaired surrogates" in infos[seat]["invalid_action"]
            assert env.to_act == seat and not terminations[seat] and not truncations[seat]
            for observation in observations.values():
                observation.encode("utf-8")  # the observation stays valid UTF-8
            assert "unpaired surrogates" in json.loads(observations[seat])["error"]


def test_a_lone_surrogate_survey_answer_is_read_with_the_surrogate_replaced():
    env = simpop.make("simpop/Persuasion-v1", max_turns=1)
    env.reset(seed=0)
    env.step({"persuader": "Would you donate?"})
    env.step({"persuadee": "Tell me more."})
    assert env.phase == "survey" and env.to_act == "persuadee"
    _, rewards, terminations, _, infos = env.step({"persuadee": "I donate $1.00 \ud800"})
    info = infos["persuadee"]
    assert "invalid_action" not in info and terminations["persuadee"]  # a survey answer is never rejected
    assert info["donation"] == 1.0 and info["survey_reply"] == "I donate $1.00 ?" and rewards["persuader"] == 1.0
    info["survey_reply"].encode("utf-8")  # safe to write out


@pytest.mark.parametrize(("env_id", "action"), [
    ("simpop/CooperBench-mini-v0", "[" * 50_000),
    ("simpop/CooperBench-mini-v0", "```json\n" + "[" * 50_000 + "\n```"),
    ("simpop/Tau2-mock-v0", '{"name": "x", "arguments": ' + '{"a":' * 1_500),
    ("simpop/Tau2-mock-v0", "<tool_call>" + '{"a":' * 1_500 + "</tool_call>"),
])
def test_deeply_nested_json_is_rejected_not_raised(env_id, action):
    env = simpop.make(env_id)
    env.reset(seed=0)
    if env_id.startswith("simpop/Tau2"):
        env.step({env.to_act: "Hi, I need help."})  # the user speaks first; the agent has the JSON tools
    seat = env.to_act
    _, _, _, _, infos = env.step({seat: action})
    assert infos[seat]["invalid_action"] == NESTED_TOO_DEEP and env.to_act == seat
