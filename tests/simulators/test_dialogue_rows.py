"""A trainable LLM simulator scores each dialogue's turns in shared rows, exactly as turn by turn."""

from __future__ import annotations

import pytest
import torch

from simpop.agents.base import SamplingParams
from simpop.simulators.trainable import LLMEpisode, LLMTurn, TrainableLLMSimulator, dialogue_rows
from simpop.train.objectives import Mismatch


def _turn(prompt: list[int], reply: list[int]) -> LLMTurn:
    return LLMTurn(prompt, reply, [-1.0] * len(reply))


def test_a_turn_extends_the_row_whose_prompt_and_reply_begin_its_own():
    first = _turn([1, 2, 3], [4, 5])
    second = _turn([1, 2, 3, 4, 5, 6, 7], [8])  # the history re-encoded to the same tokens
    trimmed = _turn([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11])  # extends the row again
    retokenised = _turn([1, 2, 3, 4, 12, 13], [14, 15])  # the first reply re-encoded otherwise: a new row
    shorter = _turn([1, 2, 3, 4], [12])  # a prompt shorter than the row so far: a new row
    alone, other = _turn([7], [8, 9]), _turn([7, 8, 10, 11], [12])  # as long, other tokens: a new row
    rows = dialogue_rows([LLMEpisode([first, second, trimmed, retokenised, shorter]), LLMEpisode(),
                          LLMEpisode([alone, other])])
    assert rows.sequences == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [1, 2, 3, 4, 12, 13, 14, 15], [1, 2, 3, 4, 12],
                              [7, 8, 9], [7, 8, 10, 11, 12]]
    assert rows.masks == [[0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 1], [0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1], [0, 1, 1],
                          [0, 0, 0, 0, 1]]
    assert rows.episode == [0, 0, 0, 2, 2]
    assert [(row, start) for row, start, _ in rows.placed] == [(0, 3), (0, 7), (0, 10), (1, 6), (2, 4), (3, 1),
                                                               (4, 4)]
    assert [turn for *_, turn in rows.placed] == [first, second, trimmed, retokenised, shorter, alone, other]
    assert dialogue_rows([]).sequences == []


def _dialogues(generator: torch.Generator, vocab: int) -> list[LLMEpisode]:
    """Dialogues of random tokens: turns that extend their history, and one whose history was re-encoded."""
    def tokens(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=generator).tolist()

    episodes = []
    for n_turns in (3, 1, 4):
        history, turns = tokens(9), []
        for k in range(n_turns):
            prompt = history + tokens(5)
            if k == 2:  # a reply trimmed in the history: this turn cannot share the row before it
                prompt = prompt[:len(turns[-1].prompt_ids) + 1] + tokens(4)
            reply = tokens(3 + k)
            turns.append(LLMTurn(prompt, reply, torch.rand(len(reply), generator=generator).neg().tolist()))
            history = prompt + reply
        episodes.append(LLMEpisode(turns))
    return episodes


@pytest.mark.parametrize("checkpoint_tokens", [None, 0])
def test_shared_rows_score_and_train_as_turn_by_turn(tiny_model, checkpoint_tokens):
    from simpop.agents.transformers_backend import TransformersBackend

    backend = TransformersBackend(tiny_model, checkpoint_tokens=checkpoint_tokens)
    sim = TrainableLLMSimulator(backend, "sim0", SamplingParams(max_new_tokens=4, temperature=0.7), lora_r=4,
                                lora_alpha=8)
    torch.manual_seed(0)
    with torch.no_grad():  # an adapter off the base model, so that the KL and its gradient are not 0
        for p in sim.parameters():
            p.add_(0.3 * torch.randn_like(p))
    episodes = _dialogues(torch.Generator().manual_seed(1), backend.vocab_size)
    rows = dialogue_rows(episodes)
    assert len(rows.sequences) == 5 < sum(len(e.turns) for e in episodes) == 8

    def run(eps: list[LLMEpisode]) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        for p in sim.parameters():
            p.grad = None
        scores = sim.score(eps)
        (scores.logprob.sum() + 3 * scores.kl.sum()).backward()
        return scores.logprob.detach(), scores.kl.detach(), [p.grad.clone() for p in sim.parameters()]

    shared = run(episodes)
    alone = [run([LLMEpisode([turn])]) for e in episodes for turn in e.turns]  # one row per turn
    per_dialogue = torch.tensor([len(e.turns) for e in episodes])
    owner = torch.repeat_interleave(torch.arange(len(episodes)), per_dialogue)
    expected_logprob = torch.zeros(len(episodes)).index_add(0, owner, torch.cat([a[0] for a in alone]))
    expected_kl = torch.zeros(len(episodes)).index_add(0, owner, torch.cat([a[1] for a in alone]))
    assert torch.allclose(shared[0], expected_logprob, atol=1e-4) and float(shared[1].min()) > 0
    assert torch.allclose(shared[1], expected_kl, atol=1e-5)
    for got, *parts in zip(shared[2], *[a[2] for a in alone], strict=True):
        assert torch.allclose(got, torch.stack(parts).sum(0), atol=1e-4)

    # Importance weights land on each turn's own reply tokens in the shared rows.
    seen = {}

    def weights(logp: torch.Tensor, gen: torch.Tensor, mask: torch.Tensor) -> Mismatch:
        seen["gen"], seen["mask"] = gen, mask
        return Mismatch(2.0 * mask, 0.0, 0.0)

    sim.generator, sim.is_weights = object(), weights
    with torch.no_grad():
        doubled = sim.score(episodes)
    assert torch.allclose(doubled.logprob, 2 * shared[0], atol=1e-4)
    recorded = [sum(t.logprobs) for e in episodes for t in e.turns]
    assert torch.isclose(seen["gen"].sum(), torch.tensor(sum(recorded)), atol=1e-4)
    assert bool(((seen["gen"] != 0) <= (seen["mask"] == 1)).all())
    sim.generator = None
