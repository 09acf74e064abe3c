"""The OpenEnv server's model calls (:class:`~simpop.integrations.openenv_server.ModelCalls`): concurrent sessions'
replies batched (in-process models) or sent concurrently within a bound (served models), sessions kept apart."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

pytest.importorskip("openenv", reason="the OpenEnv server needs pip install simpop[openenv]")

from websockets.asyncio.client import connect  # noqa: E402

import simpop.envs  # noqa: E402,F401
from simpop.integrations.openenv_client import SimpopEnvClient  # noqa: E402
from simpop.integrations.openenv_server import ModelCalls, ServerLimits, UserSeatSource, make_server  # noqa: E402
from tests.agents.fakes import EchoBackend  # noqa: E402

TEXT = "simpop/Persuasion-v1"
LIMITS = ServerLimits(max_sessions=16, read_timeout_s=30.0)


def serve(backend, spec: str = "frozen:echo", **calls):
    source = UserSeatSource(TEXT, [spec], env_kwargs={"max_turns": 3}, backends={"echo": backend},
                            calls=ModelCalls(**calls))
    return make_server(source, port=0, limits=LIMITS).start()


async def dialogues(url: str, seeds: list[int], turns: int = 2) -> list[list[str | None]]:
    """One concurrent session per seed: reset, then ``turns`` steps with messages naming the session; the
    user's replies of each."""

    async def one(seed: int) -> list[str | None]:
        async with SimpopEnvClient(base_url=url, message_timeout_s=60.0) as env:
            result = await env.reset(seed=seed)
            replies = []
            for turn in range(turns):
                if result.done:
                    break
                result = await env.step(f"session {seed}, turn {turn}: would you donate?")
                replies.append(result.observation.reply)
            return replies

    return list(await asyncio.gather(*(one(seed) for seed in seeds)))


def test_concurrent_sessions_replies_are_batched_each_to_its_own_session():
    backend = EchoBackend(delay_s=0.05)
    with serve(backend, batch_window_s=0.2) as server:
        batched = asyncio.run(dialogues(server.url, list(range(8))))
    for seed, replies in enumerate(batched):
        assert replies == [f"echo: session {seed}, turn {turn}: would you donate?" for turn in range(2)]
    rows = [n for n, _ in backend.calls]
    assert sum(rows) == 16 and max(rows) > 1 and len(rows) < 16, rows  # replies shared backend calls


@pytest.mark.slow
def test_greedy_batched_replies_equal_unbatched_ones(tiny_model):
    spec = f"frozen:transformers:{tiny_model}?max_new_tokens=6"
    runs = {}
    for max_batch in (1, 8):
        source = UserSeatSource(TEXT, [spec], env_kwargs={"max_turns": 3},
                                calls=ModelCalls(max_batch=max_batch, batch_window_s=0.2))
        with make_server(source, port=0, limits=LIMITS).start() as server:
            runs[max_batch] = asyncio.run(dialogues(server.url, list(range(4))))
        runs[max_batch, "batches"] = source.calls.batches
    assert runs[8] == runs[1] and all(len(r) == 2 for r in runs[1])
    assert runs[8, "batches"] < runs[1, "batches"] == 8  # 4 sessions x 2 replies, in fewer calls


def test_a_seeded_session_samples_the_same_whatever_else_is_in_its_batch(tiny_model):
    spec = f"frozen:transformers:{tiny_model}?max_new_tokens=6&temperature=1.0"
    source = UserSeatSource(TEXT, [spec], env_kwargs={"max_turns": 3}, calls=ModelCalls(batch_window_s=0.2))
    with make_server(source, port=0, limits=LIMITS).start() as server:
        alone = asyncio.run(dialogues(server.url, [5]))[0]
        before = source.calls.batches
        crowded = asyncio.run(dialogues(server.url, [5, 6, 7, 8, 9, 10]))
        batches = source.calls.batches - before
    assert crowded[0] == alone and len(set(map(tuple, crowded))) > 1
    assert batches < 12  # 6 sessions x 2 sampled replies shared calls


def test_a_session_that_errs_or_disconnects_mid_batch_leaves_its_batch_mates_alone():
    backend = EchoBackend(delay_s=0.3, reject=("boom",))
    with serve(backend, batch_window_s=0.2) as server:
        url = server.url.replace("http", "ws", 1) + "/ws"

        async def scenario():
            async def frame(ws, message):
                await ws.send(json.dumps(message))
                return json.loads(await ws.recv())

            async def erring():
                async with connect(url) as ws:
                    await frame(ws, {"type": "reset", "data": {"seed": 1}})
                    return await frame(ws, {"type": "step", "data": {"message": "boom"}})

            async def leaving():
                async with connect(url) as ws:
                    await frame(ws, {"type": "reset", "data": {"seed": 2}})
                    await ws.send(json.dumps({"type": "step", "data": {"message": "bye"}}))
                    await asyncio.sleep(0.1)  # its reply is waiting in the batch: gone before it comes

            others = asyncio.gather(*(dialogues(server.url, [seed], turns=1) for seed in (3, 4, 5)))
            return await asyncio.gather(erring(), leaving(), others)

        failed, _, others = asyncio.run(scenario())
        assert failed["type"] == "error" and "too long" in failed["data"]["message"]
        assert [o[0] for o in others] == [[f"echo: session {s}, turn 0: would you donate?"] for s in (3, 4, 5)]
        assert asyncio.run(dialogues(server.url, [6], turns=1)) == [["echo: session 6, turn 0: would you donate?"]]
    assert any(rows > 1 for rows, _ in backend.calls)  # the failing reply had batch mates


class ServedEcho(EchoBackend):
    """An echo "server" (it has a ``base_url``) that records how many calls it answers at once."""

    base_url = "http://127.0.0.1:1/v1"

    def __init__(self, delay_s: float) -> None:
        super().__init__(delay_s=delay_s)
        self.now = self.most = 0
        self.count_lock = threading.Lock()

    def generate(self, chats, params):
        with self.count_lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            return super().generate(chats, params)
        finally:
            with self.count_lock:
                self.now -= 1


def test_served_models_are_called_concurrently_within_the_bound_per_server():
    backend = ServedEcho(delay_s=0.3)
    with serve(backend, max_inflight=3) as server:
        start = time.perf_counter()
        replies = asyncio.run(dialogues(server.url, list(range(6)), turns=1))
        elapsed = time.perf_counter() - start
    assert replies == [[f"echo: session {s}, turn 0: would you donate?"] for s in range(6)]
    assert backend.most == 3 and all(rows == 1 for rows, _ in backend.calls)  # never batched: the server does that
    assert elapsed < 6 * 0.3  # one at a time would take 1.8 s


def test_model_calls_refuse_bad_settings():
    with pytest.raises(ValueError, match="max_batch >= 1"):
        ModelCalls(max_batch=0)


class RowSeededEcho(EchoBackend):
    """An echo backend that draws each sampled row apart (as TransformersBackend does): records the row seeds."""

    samples_rows_apart = True

    def __init__(self) -> None:
        super().__init__()
        self.row_seeds: list[list[tuple[int | None, int]]] = []

    def generate(self, chats, params, row_seeds=None):
        self.row_seeds.append(row_seeds)
        return super().generate(chats, params)


def test_greedy_jobs_batch_whatever_their_seed_and_seeded_sampling_batches_where_rows_draw_apart():
    from simpop.agents.base import SamplingParams
    from simpop.serve.batching import MicroBatcher

    def submit(backend, params: list[SamplingParams]) -> list[tuple[int, int | None]]:
        async def run():
            batcher = MicroBatcher(backend, window_s=0.2)
            chats = [[{"role": "user", "content": "hi"}]]
            await asyncio.gather(*(batcher.generate("generate", chats * (1 + (p.seed == 2)), p) for p in params))
            batcher.close()

        asyncio.run(run())
        return backend.calls

    greedy = [SamplingParams(max_new_tokens=4, seed=seed) for seed in (1, 2, 3)]
    assert [rows for rows, _ in submit(EchoBackend(), greedy)] == [4]
    sampled = [SamplingParams(max_new_tokens=4, temperature=1.0, seed=seed) for seed in (1, 2, 3)]
    assert sorted(submit(EchoBackend(), sampled)) == [(1, 1), (1, 3), (2, 2)]  # one generator a batch: alone
    apart = RowSeededEcho()
    assert [rows for rows, _ in submit(apart, sampled)] == [4]
    assert apart.row_seeds == [[(1, 0), (2, 0), (2, 1), (3, 0)]]  # each row draws as in its own call


def test_a_batch_starts_once_every_expected_caller_waits_and_gathers_while_the_model_is_free():
    from simpop.agents.base import SamplingParams
    from simpop.serve.batching import MicroBatcher

    backend, expected = EchoBackend(delay_s=1.2), [1]
    chat, params = [[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=4)

    async def run():
        batcher = MicroBatcher(backend, window_s=0.8, expected=lambda: expected[0])
        first = asyncio.ensure_future(batcher.generate("generate", chat, params))  # all that is expected: at once
        await asyncio.sleep(0.1)
        expected[0] = 2
        second = asyncio.ensure_future(batcher.generate("generate", chat, params))  # while the model runs
        await first
        await asyncio.sleep(0.4)  # past the second's window counted from its arrival, inside it from the model's end
        await asyncio.gather(second, batcher.generate("generate", chat, params))
        batcher.close()

    asyncio.run(run())
    assert [rows for rows, _ in backend.calls] == [1, 2]  # the first alone at once, then the other two together
