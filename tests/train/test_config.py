"""dataclass -> argparse flags, YAML config files, and GRPOConfig validation."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Literal

import pytest

from simpop.agents.policy import ModelConfig
from simpop.train.config import add_arguments, build, changed_settings, field_docs, json_ready, save_yaml, to_dict
from simpop.train.grpo import GRPOConfig
from simpop.train import objectives
from simpop.train.loop import LoopConfig


@dataclass(frozen=True)
class Demo:
    """A demo config.

    Attributes:
        steps: How many steps
            to run (continued line).
        rate: A rate.
        name: A name.
        mode: The mode.
        flag: A switch.
        limit: Optional limit.
        sizes: Several sizes.
    """

    steps: int = 3
    rate: float = 0.5
    name: str = "x"
    mode: Literal["a", "b"] = "a"
    flag: bool = False
    limit: int | None = None
    sizes: tuple[int, ...] = (1, 2)


def _parser(*classes):
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    for cls in classes or (Demo,):
        add_arguments(parser, cls)
    return parser


def test_field_docs_parse_continuations_and_require_every_field():
    docs = field_docs(Demo)
    assert docs["steps"] == "How many steps to run (continued line)."
    assert set(docs) == {f.name for f in dataclasses.fields(Demo)}

    @dataclass
    class Undocumented:
        """No attributes here."""

        x: int = 1

    with pytest.raises(ValueError, match="must document"):
        field_docs(Undocumented)


def test_flags_types_defaults_and_help():
    parser = _parser()
    args = parser.parse_args(["--steps", "7", "--rate", "0.25", "--mode", "b", "--flag", "--limit", "none",
                              "--sizes", "4", "5"])
    assert build(Demo, args) == Demo(steps=7, rate=0.25, mode="b", flag=True, limit=None, sizes=(4, 5))
    assert build(Demo, parser.parse_args([])) == Demo()
    assert build(Demo, parser.parse_args(["--limit", "9", "--no-flag"])) == Demo(limit=9, flag=False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "c"])
    help_text = parser.format_help()
    assert "How many steps to run (continued line). (default: 3)" in " ".join(help_text.split())


def test_yaml_then_flags_win(tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text("steps: 11\nname: from-yaml\nsizes: [3]\n")
    parser = _parser()
    args = parser.parse_args(["--config", str(path), "--steps", "12"])
    assert build(Demo, args, yaml_path=args.config) == Demo(steps=12, name="from-yaml", sizes=(3,))
    path.write_text("stepz: 1\n")
    with pytest.raises(ValueError, match="unknown Demo fields"):
        build(Demo, yaml_path=path)
    save_yaml(Demo(steps=5, sizes=(9,)), path)
    assert build(Demo, yaml_path=path) == Demo(steps=5, sizes=(9,))


def test_grpo_config_flags_cover_every_field():
    # GRPO's flags come from its algorithm config, the model config and the loop config (disjoint names).
    parser = _parser(GRPOConfig, ModelConfig, LoopConfig)
    args = parser.parse_args(["--group-size", "8", "--lora", "--kl-coef", "0.1", "--n-envs", "none",
                              "--algorithm", "dapo", "--clip-eps-high", "0.3", "--loss-aggregation", "token-sum",
                              "--save-every", "5", "--report-to", "none"])
    config, model, loop = build(GRPOConfig, args), build(ModelConfig, args), build(LoopConfig, args)
    assert config.group_size == 8 and config.kl_coef == 0.1 and config.n_envs is None
    assert (config.algorithm, config.clip_eps_high, config.loss_aggregation) == ("dapo", 0.3, "token-sum")
    assert model.lora and model == ModelConfig(lora=True)
    assert loop == LoopConfig(save_every=5, report_to="none")
    for cls in (GRPOConfig, ModelConfig, LoopConfig):
        assert set(field_docs(cls)) == {f.name for f in dataclasses.fields(cls)}
    with pytest.raises(SystemExit):
        parser.parse_args(["--loss-aggregation", "token-max"])


def test_grpo_config_objective_applies_overrides():
    assert GRPOConfig().objective() == objectives.algorithm("grpo")
    assert GRPOConfig(algorithm="dapo").objective() == objectives.algorithm("dapo")
    dapo = GRPOConfig(algorithm="dapo", clip_eps=0.1, loss_aggregation="sequence-mean").objective()
    assert (dapo.eps_low, dapo.eps_high, dapo.aggregation, dapo.dynamic_sampling) == (0.1, 0.28, "sequence-mean", True)
    assert GRPOConfig(clip_eps_high=0.3).objective().eps_high == 0.3
    assert GRPOConfig(group_size=3, scenarios_per_update=5).batch_size == 15


@pytest.mark.parametrize(("field", "value", "hint"), [
    ("group_size", 1, "group_size must be >= 2"), ("scenarios_per_update", 0, "scenarios_per_update"),
    ("lr", -1.0, "lr must be a positive number"), ("clip_eps", 1.5, "clip_eps must be in"),
    ("clip_eps_high", 0.0, "clip_eps_high must be in"), ("algorithm", "ppo", "algorithm must be one of"),
    ("loss_aggregation", "token-max", "loss_aggregation must be one of"),
    ("max_refill_rounds", -1, "max_refill_rounds"),
    ("kl_coef", -0.1, "kl_coef must be >= 0"), ("epochs", 0, "epochs"), ("temperature", 0.0, "use 1.0"),
    ("top_p", 0.0, "top_p"), ("max_new_tokens", 0, "max_new_tokens"),
    ("n_envs", 0, "n_envs"), ("micro_batch_size", 0, "micro_batch_size"),
])
def test_grpo_config_errors_say_how_to_fix(field, value, hint):
    with pytest.raises(ValueError, match=hint):
        GRPOConfig(**{field: value})


@pytest.mark.parametrize(("cls", "field", "value", "hint"), [
    (ModelConfig, "dtype", "float16", "dtype"), (ModelConfig, "lora_r", 0, "lora_r"),
    (ModelConfig, "lora_alpha", 0, "lora_alpha"), (ModelConfig, "hidden_size", 0, "hidden_size"),
    (ModelConfig, "adapter", "a.b", "adapter"),
    (LoopConfig, "save_every", 0, "save_every must be >= 1"), (LoopConfig, "keep_checkpoints", 0, "keep_checkpoints"),
    (LoopConfig, "eval_every", 0, "eval_every"),
])
def test_model_and_loop_config_errors_say_how_to_fix(cls, field, value, hint):
    with pytest.raises(ValueError, match=hint):
        cls(**{field: value})


def test_changed_settings_accepts_fields_added_since_at_their_default():
    from simpop.experiments.conditions import CollapseConfig

    default = CollapseConfig()
    saved = json_ready(to_dict(default))
    del saved["cotrain"]["pool_prune"], saved["corpus_panel"]  # as written before these fields existed
    assert changed_settings(saved, default, CollapseConfig()) == []
    moved = CollapseConfig(cotrain={"pool_prune": "redundant"}, updates=300, conditions=("frozen",))
    assert changed_settings(saved, moved, CollapseConfig()) == ["conditions", "cotrain.pool_prune", "updates"]
    saved["retired_field"] = 1  # a field removed since: a change (the old run meant something this one cannot)
    assert changed_settings(saved, default, CollapseConfig()) == ["retired_field"]
