"""Optimiser state on disk between steps: training is bit for bit the same, the state leaves memory."""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch

from simpop.train import cotrain
from simpop.train.offload import OffloadedOptimizer


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def train(net: torch.nn.Module, optimizer, steps: int) -> list[float]:
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 8, generator=generator)
        loss = net(x).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_offloaded_adam_trains_bit_for_bit_like_adam(tmp_path) -> None:
    plain, offloaded = model(), model()
    adam = torch.optim.Adam(plain.parameters(), lr=1e-2)
    wrapped = OffloadedOptimizer(torch.optim.Adam(offloaded.parameters(), lr=1e-2), tmp_path)
    assert train(plain, adam, 6) == train(offloaded, wrapped, 6)
    for a, b in zip(plain.parameters(), offloaded.parameters()):
        assert torch.equal(a, b)
    # Between steps nothing of the state or the gradients is in memory; the file holds the state.
    assert not wrapped.optimizer.state and all(p.grad is None for p in offloaded.parameters())
    assert wrapped.path.exists()
    saved = wrapped.state_dict()
    assert not wrapped.optimizer.state
    expected = adam.state_dict()
    for key, state in expected["state"].items():
        for name, value in state.items():
            assert torch.equal(saved["state"][key][name], value)


def test_state_dict_round_trip_resumes_identically(tmp_path) -> None:
    net = model()
    first = OffloadedOptimizer(torch.optim.Adam(net.parameters(), lr=1e-2))
    train(net, first, 3)
    checkpoint = ({k: v.clone() for k, v in net.state_dict().items()}, first.state_dict())
    after = train(net, first, 3)
    resumed = model(5)
    resumed.load_state_dict(checkpoint[0])
    again = OffloadedOptimizer(torch.optim.Adam(resumed.parameters(), lr=1e-2), tmp_path / "new")
    again.load_state_dict(checkpoint[1])
    assert not again.optimizer.state
    assert train(resumed, again, 3) == after


def test_temporary_folder_goes_with_the_optimizer() -> None:
    net = model()
    wrapped = OffloadedOptimizer(torch.optim.Adam(net.parameters()))
    train(net, wrapped, 1)
    folder = wrapped.path.parent
    assert folder.exists()
    del wrapped
    gc.collect()
    assert not folder.exists()


def test_cotrainer_offloads_large_optimizers_without_changing_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Act-level co-training with every optimiser offloaded (the size floor lowered to 0) trains exactly as
    without; the default floor leaves the act-level persuadee's 373 numbers in memory."""
    from simpop.envs.registration import make
    from simpop.experiments.collapse import CollapseConfig, build_trainer

    config = CollapseConfig(level="act", conditions=("population",))

    def run(offload: bool, floor: int):
        monkeypatch.setattr(cotrain, "OFFLOAD_MIN_PARAMS", floor)
        cfg = dataclasses.replace(config, cotrain=dataclasses.replace(config.cotrain, offload_optimizers=offload))
        torch.manual_seed(3)
        trainer = build_trainer("population", cfg, 3, make(cfg.env_id, **cfg.env_kwargs()), {})
        metrics = [trainer.step() for _ in range(3)]
        return trainer, [{k: v for k, v in m.items() if not k.endswith("_s")} for m in metrics]

    default, plain = run(True, cotrain.OFFLOAD_MIN_PARAMS)
    assert not any(isinstance(o, OffloadedOptimizer) for o in default.optimizers)
    offloaded, metrics = run(True, 0)
    assert all(isinstance(o, OffloadedOptimizer) for o in offloaded.optimizers)
    assert isinstance(offloaded.policy_trainer.optimizer, OffloadedOptimizer)
    assert metrics == plain
    _, off = run(False, 0)
    assert off == plain
    state = offloaded.state_dict()  # a checkpoint reads the offloaded state back
    assert all(s["state"] for s in state["optimizers"])
