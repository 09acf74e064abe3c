from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run real-model tests on one torch thread, restoring the count afterwards.

    Tiny generations are latency-bound, and with two threads OpenMP slows down 10x or more when
    other processes (tests running in parallel) compete for the cores.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
