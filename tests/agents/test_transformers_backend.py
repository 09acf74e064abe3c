"""TransformersBackend with the embedded SmolLM2 (from the default cache; tiny generations); what trains, saves or
fills a cache runs on the one-layer ``tiny_model`` (plumbing, not the model's answers)."""

from __future__ import annotations

import math

import pytest
import torch

from simpop.agents.base import SamplingParams, TokenBackend
from simpop.agents.transformers_backend import RowSampler, TransformersBackend, row_generator

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HELLO = [{"role": "user", "content": "Say hello."}]
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
LONG = [
    {"role": "system", "content": "You are a terse assistant who answers in one sentence."},
    {"role": "user", "content": "Describe the weather you like best, and why, in a few words."},
]


@pytest.fixture(scope="module")
def backend(smollm2, one_torch_thread) -> TransformersBackend:
    assert isinstance(smollm2, TransformersBackend) and isinstance(smollm2, TokenBackend)
    return smollm2


@pytest.fixture(scope="module")
def tiny(tiny_model, one_torch_thread) -> TransformersBackend:
    """The one-layer model, for what holds of any model (padding, seeds, log-probs, the prefix cache)."""
    return TransformersBackend(tiny_model)


def test_encode_chat_uses_the_chat_template(backend):
    ids = backend.encode_chat(HELLO)
    text = backend.tokenizer.decode(ids)
    assert "Say hello." in text and text.endswith("<|im_start|>assistant\n")
    assert len(backend.encode_chat(HELLO, add_generation_prompt=False)) < len(ids)


def test_greedy_is_deterministic_and_keeps_eos(backend):
    params = SamplingParams(max_new_tokens=16)
    first = backend.generate([FRANCE, HELLO], params)
    assert [g.token_ids for g in backend.generate([FRANCE, HELLO], params)] == [g.token_ids for g in first]
    france, hello = first
    assert france.finish_reason == "stop" and france.token_ids[-1] in backend.eos_token_ids
    assert "Paris" in france.text and "<|im_end|>" not in france.text
    assert hello.finish_reason == "length" and len(hello.token_ids) == 16
    assert france.prompt_ids == backend.encode_chat(FRANCE) and france.logprobs is None


def test_left_padded_batch_equals_one_by_one(tiny):
    backend = tiny
    params = SamplingParams(max_new_tokens=8, logprobs=True)
    chats = [HELLO, LONG, FRANCE]
    assert len({len(backend.encode_chat(c)) for c in chats}) == 3  # different lengths: padding is exercised
    batched = backend.generate(chats, params)
    for chat, together in zip(chats, batched):
        alone = backend.generate([chat], params)[0]
        assert alone.token_ids == together.token_ids and alone.text == together.text
        assert alone.logprobs == pytest.approx(together.logprobs, abs=1e-4)


def test_seeded_sampling_is_reproducible_and_leaves_the_global_rng_alone(tiny):
    backend = tiny
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=7)
    rng_state = torch.random.get_rng_state()
    first = [g.token_ids for g in backend.generate([HELLO] * 3, params)]
    assert torch.equal(torch.random.get_rng_state(), rng_state)
    assert [g.token_ids for g in backend.generate([HELLO] * 3, params)] == first
    assert len({tuple(ids) for ids in first}) > 1  # rows of one call are different samples
    other = [
        g.token_ids
        for g in backend.generate([HELLO] * 3, SamplingParams(max_new_tokens=8, temperature=1.0, seed=8))
    ]
    assert other != first


def test_a_sampled_row_draws_the_same_whatever_its_batch_mates(tiny):
    backend = tiny
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3, logprobs=True)
    pair = backend.generate([HELLO, LONG], params)
    # Row 1 of the call seeded 3, now in a batch of other calls' rows (another seed, an unseeded row).
    batch = backend.generate([FRANCE, LONG, HELLO], params, row_seeds=[(5, 0), (3, 1), (None, 0)])
    assert batch[1].token_ids == pair[1].token_ids and batch[1].logprobs == pytest.approx(pair[1].logprobs, abs=1e-4)
    assert backend.generate([LONG], params)[0].token_ids != pair[1].token_ids  # row 0 of that call draws otherwise
    with pytest.raises(ValueError, match="row_seeds needs one"):
        backend.generate([HELLO], params, row_seeds=[])


def test_each_row_draws_from_the_softmax_of_its_scores():
    n, probabilities = 10_000, torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    sampler = RowSampler([row_generator(1, row, torch.device("cpu")) for row in range(n)])
    drawn = sampler(None, probabilities.log().repeat(n, 1)).argmax(-1)  # what generate() then picks
    frequencies = torch.bincount(drawn, minlength=5) / n
    assert torch.allclose(frequencies, probabilities, atol=4 * math.sqrt(0.25 / n)) and frequencies[4] == 0
    assert torch.equal(sampler.logprobs[0], probabilities.log()[drawn])


def test_logprobs_match_token_logprobs(tiny):
    backend = tiny
    params = SamplingParams(max_new_tokens=6, temperature=0.7, top_p=1.0, seed=1, logprobs=True)
    generations = backend.generate([HELLO, LONG], params)
    sequences = [g.prompt_ids + g.token_ids for g in generations]
    masks = [[0] * len(g.prompt_ids) + [1] * len(g.token_ids) for g in generations]
    with torch.no_grad():
        scores = backend.token_logprobs(sequences, masks, temperature=0.7)
    assert scores.logprobs.shape == scores.mask.shape == (2, max(map(len, sequences)))
    for row, generation in enumerate(generations):
        start = len(generation.prompt_ids)
        completion = scores.logprobs[row, start : start + len(generation.token_ids)].tolist()
        assert completion == pytest.approx(generation.logprobs, abs=1e-3)
        assert scores.mask[row].sum().item() == len(generation.token_ids)
        assert (scores.entropies[row, start : start + len(generation.token_ids)] > 0).all()
    assert (scores.logprobs[scores.mask == 0] == 0).all()


def test_stop_strings_end_each_sample(backend):
    free = backend.generate([HELLO], SamplingParams(max_new_tokens=12))[0]
    assert "," in free.text
    stopped = backend.generate([HELLO, FRANCE], SamplingParams(max_new_tokens=12, stop=(",", "Paris")))
    for generation in stopped:
        assert generation.finish_reason == "stop"
        assert "," not in generation.text and "Paris" not in generation.text
        decoded = backend.tokenizer.decode(generation.token_ids)
        assert "," in decoded or "Paris" in decoded  # the token that completed the stop string is kept
        assert len(generation.logprobs or generation.token_ids) == len(generation.token_ids)
    assert free.text.startswith(stopped[0].text + ",")
    assert len(stopped[0].token_ids) < len(free.token_ids)


def test_lora_adapters_train_switch_save_and_load(tiny_model, tmp_path):
    model = TransformersBackend(tiny_model)
    params = SamplingParams(max_new_tokens=6)
    base = model.generate([HELLO], params)[0]
    model.add_adapter("sim0")
    model.add_adapter("sim1")
    assert model.adapter_names == ["sim0", "sim1"] and model.active_adapter == "sim1"
    assert model.generate([HELLO], params)[0].token_ids == base.token_ids  # LoRA starts as a no-op
    assert not {id(p) for p in model.parameters("sim0")} & {id(p) for p in model.parameters("sim1")}

    model.set_adapter("sim0")
    optimizer = torch.optim.SGD(model.parameters("sim0"), lr=0.5)
    sequence = [base.prompt_ids + base.token_ids]
    mask = [[0] * len(base.prompt_ids) + [1] * len(base.token_ids)]
    for _ in range(2):  # push the base reply's likelihood down until the greedy reply changes
        scores = model.token_logprobs(sequence, mask)
        optimizer.zero_grad()
        scores.logprobs.sum().backward()
        optimizer.step()
    assert all(p.grad is None for p in model.parameters("sim1"))  # only the active adapter trains
    assert all(not p.requires_grad for n, p in model.model.named_parameters() if "lora_" not in n)
    trained = model.generate([HELLO], params)[0]
    assert trained.token_ids != base.token_ids
    with model.disabled_adapters():
        assert model.generate([HELLO], params)[0].token_ids == base.token_ids
    model.set_adapter("sim1")
    assert model.generate([HELLO], params)[0].token_ids == base.token_ids

    model.set_adapter("sim0")
    model.save(tmp_path / "adapters")
    restored = TransformersBackend(tiny_model)
    restored.load(tmp_path / "adapters")
    assert restored.adapter_names == ["sim0", "sim1"] and restored.active_adapter == "sim0"
    assert restored.generate([HELLO], params)[0].token_ids == trained.token_ids
    with pytest.raises(ValueError, match="cannot load full weights into a backend with adapters"):
        TransformersBackend(tiny_model).save(tmp_path / "full")
        restored.load(tmp_path / "full")


def test_full_weights_save_and_load(tmp_path, tiny_model):
    model = TransformersBackend(tiny_model, trainable=True)
    assert len(model.parameters()) == len(list(model.model.parameters()))
    with torch.no_grad():
        model.model.model.norm.weight.mul_(1.5)
    model.save(tmp_path / "full")
    reloaded = TransformersBackend(tmp_path / "full")
    assert reloaded.name == "full" and not reloaded.parameters()  # frozen unless trainable=True
    fresh = TransformersBackend(tiny_model)
    fresh.load(tmp_path / "full")
    expected = model.model.state_dict()
    for other in (reloaded, fresh):
        assert all(torch.equal(expected[k], v) for k, v in other.model.state_dict().items())


def test_bfloat16_generates(backend):
    half = TransformersBackend(dtype="bfloat16", threads=1)
    assert next(half.model.parameters()).dtype == torch.bfloat16
    generation = half.generate([FRANCE], SamplingParams(max_new_tokens=4, logprobs=True))[0]
    assert len(generation.token_ids) == len(generation.logprobs) == 4 and generation.text


def test_bad_input_errors(backend, tmp_path):
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="prompts is empty"):
        backend.generate_ids([], params)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        backend.generate_ids([[1, 2], []], params)
    with pytest.raises(ValueError, match="not token ids"):
        backend.generate_ids([[1, 10**9]], params)
    with pytest.raises(ValueError, match="exceeds the model's context of 8192 tokens"):
        backend.generate_ids([[1] * 8190], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="message 0 is"):
        backend.generate([[{"role": "user"}]], params)
    with pytest.raises(ValueError, match="masks must have one 0/1 entry per token"):
        backend.token_logprobs([[1, 2, 3]], [[1, 1]])
    with pytest.raises(KeyError, match="no adapter 'nope'"):
        backend.set_adapter("nope")
    with pytest.raises(ValueError, match="dtype must be one of"):
        TransformersBackend(dtype="float16")
    with pytest.raises(FileNotFoundError, match="not a local HF model folder"):
        TransformersBackend(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="not written by TransformersBackend.save"):
        backend.load(tmp_path)


@pytest.fixture
def prefix_cached(tiny):
    """The module's tiny backend with its prefix cache on (off and empty again afterwards)."""
    tiny.prefix_cache = True
    yield tiny
    tiny.prefix_cache = False
    tiny.clear_prefix_cache()


def test_prefix_cache_gives_the_uncached_outputs_over_a_dialogue(prefix_cached):
    backend, params = prefix_cached, SamplingParams(max_new_tokens=5, logprobs=True)
    prompts = [backend.encode_chat(chat) for chat in (HELLO, LONG, FRANCE)]
    hits = backend.prefix_hits
    for turn in range(3):
        backend.prefix_cache = True
        cached = backend.generate_ids(prompts, params)
        assert backend.prefix_hits == hits + (3 if turn else 0)  # every row of turns 2 and 3 reuses its past
        hits = backend.prefix_hits
        backend.prefix_cache = False
        plain = backend.generate_ids(prompts, params)
        assert [g.token_ids for g in cached] == [g.token_ids for g in plain]
        for with_cache, without in zip(cached, plain):
            assert with_cache.logprobs == pytest.approx(without.logprobs, abs=1e-3)
        # Next turn: each row's history plus a reply of a different length (the suffixes differ too).
        reply = backend.encode_chat([{"role": "user", "content": "Go on."}])
        prompts = [g.prompt_ids + g.token_ids + reply[-(4 + row) :] for row, g in enumerate(plain)]


def test_prefix_cache_reads_a_prefix_shared_by_a_batch_once(prefix_cached):
    backend, params = prefix_cached, SamplingParams(max_new_tokens=5)
    prompts = [backend.encode_chat(chat) for chat in (HELLO, FRANCE)]  # the default system prompt is shared
    backend.clear_prefix_cache()
    hits, reused = backend.prefix_hits, backend.prefix_reused_tokens
    cached = backend.generate_ids(prompts, params)
    assert backend.prefix_hits == hits + 2 and backend.prefix_reused_tokens > reused + 2 * 16
    backend.prefix_cache = False
    assert [g.token_ids for g in backend.generate_ids(prompts, params)] == [g.token_ids for g in cached]


def test_rows_read_their_uncached_excess_alone(prefix_cached):
    """A new dialogue's whole prompt beside later turns' short deltas: the batch reads only what the rows have in
    common (the long row's excess was read alone first), and every row gives what it gives alone."""
    backend, params = prefix_cached, SamplingParams(max_new_tokens=4)
    first = backend.generate([HELLO, FRANCE], params)
    reply = backend.encode_chat([{"role": "user", "content": "Go on."}])
    prompts = [g.prompt_ids + g.token_ids + reply[-5:] for g in first] + [backend.encode_chat(LONG)]
    widths: list[int] = []
    hook = backend.model.register_forward_pre_hook(lambda _, args, kwargs: widths.append(
        kwargs["input_ids"].shape[1]) if kwargs["input_ids"].shape[0] == 3 else None, with_kwargs=True)
    try:
        together = backend.generate_ids(prompts, params)
    finally:
        hook.remove()
    assert widths[0] == 6  # the prefill: the cached rows' new tokens (a completion's last one + 5), not the new prompt
    backend.prefix_cache = False
    assert [g.token_ids for g in together] == [backend.generate_ids([p], params)[0].token_ids for p in prompts]


def test_prefix_cache_is_dropped_when_weights_change_and_bounded(tiny_model):
    backend, params = TransformersBackend(tiny_model, prefix_cache=True), SamplingParams(max_new_tokens=3)
    first = backend.generate([HELLO], params)[0]
    follow_up = first.prompt_ids + first.token_ids + backend.encode_chat(FRANCE)[-3:]
    misses = backend.prefix_misses
    weight = backend.model.get_input_embeddings().weight
    optimizer = torch.optim.SGD([weight], lr=0.0)  # a no-op step still writes the weights in place
    weight.grad = torch.zeros_like(weight)
    optimizer.step()
    weight.grad = None
    second = backend.generate_ids([follow_up], params)[0]
    assert backend.prefix_misses == misses + 1  # the cache made before the step was not used
    backend.generate_ids([second.prompt_ids + second.token_ids + [28]], params)
    assert backend.prefix_misses == misses + 1  # the new one is
    backend.clear_prefix_cache()
    backend.generate_ids([second.prompt_ids + second.token_ids + [28]], params)
    assert backend.prefix_misses == misses + 2
    for index in range(backend.prefixes.size + 2):
        backend.generate_ids([first.prompt_ids + [28 + index]], params)
    assert len(backend.prefixes.entries) == backend.prefixes.size
    with pytest.raises(ValueError, match="prefix_cache_size must be >= 1"):
        TransformersBackend(prefix_cache=True, prefix_cache_size=0)


def test_prefix_cache_keeps_each_adapter_and_follows_lora_training(tiny_model):
    model = TransformersBackend(tiny_model, prefix_cache=True)
    params = SamplingParams(max_new_tokens=4)
    model.add_adapter("policy")
    model.add_adapter("sim")
    first = {}
    for name in ("policy", "sim"):  # a policy turn, then a simulator turn, on one base model
        model.set_adapter(name)
        first[name] = model.generate([HELLO], params)[0]
    follow_up = first["policy"].prompt_ids + first["policy"].token_ids + model.encode_chat(FRANCE)[-3:]
    model.set_adapter("policy")
    hits = model.prefix_hits
    model.generate_ids([follow_up], params)
    assert model.prefix_hits == hits + 1  # the simulator's call did not evict the policy's sequence
    with model.disabled_adapters():  # the base model is another view: it never reads an adapter's cache
        misses = model.prefix_misses
        model.generate_ids([follow_up], params)
        assert model.prefix_misses == misses + 1

    optimizer = torch.optim.SGD(model.parameters("policy"), lr=0.5)
    sequence = [first["policy"].prompt_ids + first["policy"].token_ids]
    scores = model.token_logprobs(sequence, [[0] * len(first["policy"].prompt_ids) + [1] * 4])
    scores.logprobs.sum().backward()
    optimizer.step()
    misses = model.prefix_misses
    trained = model.generate_ids([follow_up], params)[0]
    assert model.prefix_misses == misses + 1  # nothing computed before the step is reused
    model.prefix_cache = False
    assert model.generate_ids([follow_up], params)[0].token_ids == trained.token_ids
