"""How the in-process backend sets up torch in this process: the weights' dtype, glibc's mmap threshold, and a
dense input for the LM head."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

#: Weights dtypes; ``auto`` resolves with :func:`resolve_dtype`.
DTYPES = ("auto", "float32", "bfloat16")


def cpu_dtype() -> Literal["float32", "bfloat16"]:
    """``"bfloat16"`` when this CPU has bf16 instructions (AVX512-BF16 or AMX, read from ``/proc/cpuinfo``;
    PEFT keeps LoRA adapters in float32 either way), else ``"float32"``."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no way to tell, so the exact one
        return "float32"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def resolve_dtype(dtype: str, device: str | None = None) -> Literal["float32", "bfloat16"]:
    """``dtype`` itself, or for ``"auto"``: ``"bfloat16"`` on a CUDA GPU (``device``, default: CUDA when
    available) and on CPUs with native bf16 matmul (:func:`cpu_dtype`), ``"float32"`` on other CPUs
    (there bf16 runs ~1.8x slower than float32)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if dtype != "auto":
        return "float32" if dtype == "float32" else "bfloat16"
    import torch

    on_gpu = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    return "bfloat16" if on_gpu else cpu_dtype()


#: glibc's ``mallopt`` parameter number of ``M_MMAP_THRESHOLD``.
_M_MMAP_THRESHOLD = -3


def fix_mmap_threshold(size: int = 128 * 1024) -> bool:
    """Have glibc serve every allocation above ``size`` bytes by its own ``mmap``, returned when freed.

    By default glibc raises this threshold each time a large block is freed (up to 32 MB); from then on
    the activations of a training step come from its heaps, which keep freed memory resident. Measured
    on one LoRA scoring step of 2 x 969 tokens: peak RSS 1.8 GB above the model's with the moving
    threshold, 0.19 GB with a fixed one, at no measured time cost. Process-wide; a no-op (False) where
    the C library is not glibc.
    """
    import ctypes

    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, size))
    except (OSError, AttributeError):
        return False


def dense_input(module, args: tuple) -> tuple:
    """Forward pre-hook: the module's first input with row-major strides.

    ``generate()`` feeds the LM head the last position of every row, a slice of the hidden states;
    torch's linear on such a strided batch copies the head's weight once per row (150x slower for
    16 rows on a CPU), and in bfloat16 even a one-row slice that counts as contiguous is 15x slower.
    """
    import torch

    tensor = args[0]
    strides, step = [], 1
    for size in reversed(tensor.shape):
        strides.append(step)
        step *= size
    if tensor.stride() != tuple(reversed(strides)):
        tensor = tensor.clone(memory_format=torch.contiguous_format)
    return (tensor, *args[1:])

