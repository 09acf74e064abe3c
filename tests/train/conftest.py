"""Shared settings for trainer tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Run torch on one thread: on a shared 2-core machine, more threads than free cores make torch
    many times slower (spinning workers wait on each other)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
