"""``dtype="auto"``: bfloat16 on GPUs and on CPUs with native bf16 matmul, float32 on other CPUs."""

from __future__ import annotations

import pytest

from simpop.agents.policy import ModelConfig
from simpop.agents.process_tuning import cpu_dtype, resolve_dtype


def test_auto_resolves_by_device_and_cpu_and_explicit_values_stay():
    assert resolve_dtype("auto", "cpu") == cpu_dtype() in ("float32", "bfloat16")
    assert resolve_dtype("auto", "cuda") == "bfloat16"
    assert resolve_dtype("float32", "cuda") == "float32" and resolve_dtype("bfloat16", "cpu") == "bfloat16"
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("float16")


def test_model_config_defaults_to_auto():
    assert ModelConfig().dtype == "auto" and ModelConfig(dtype="float32").dtype == "float32"
    with pytest.raises(ValueError, match="'auto', 'float32', 'bfloat16', got 'float16'"):
        ModelConfig(dtype="float16")
