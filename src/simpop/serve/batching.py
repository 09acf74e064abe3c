"""Micro-batching for ``simpop serve`` and the OpenEnv server: concurrent requests with the same settings become one
backend call.

The oldest pending job leads the next batch, so none waits behind later arrivals. It waits for batch mates at most
``window_s`` with the model free (a job that came while a batch ran waits that long after it ended, so the callers
that batch answered can join again instead of splitting into batches that alternate), and not at all once every
caller the batcher can expect (``expected``: e.g. a server's open sessions) waits, or the batch is full. Greedy jobs
batch whatever their seed. Seeded sampling jobs batch where the backend draws each row with a generator of its own
(``row_seeds``, as :class:`~simpop.agents.transformers_backend.TransformersBackend` does), so each gives what it would
alone; with other backends (one generator for a batch) each runs as a batch of its own.

A job whose request is cancelled (its client disconnected, or the server is shutting down) leaves the queue;
when every job of the running batch is gone, the backend's ``stop_event`` (if it has one, as
:class:`~simpop.agents.transformers_backend.TransformersBackend` does) is set, so the model stops at its next
token instead of finishing work nobody will read.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from simpop.agents.base import Backend, Generation, SamplingParams

log = logging.getLogger(__name__)


@dataclass(eq=False)  # jobs are equal only to themselves (see key)
class _Job:
    method: str  # "generate" (chats) or "generate_ids" (prompt token ids)
    inputs: list[Any]
    params: SamplingParams
    arrived: float
    future: asyncio.Future
    alone: bool  # batches with nothing else: seeded sampling on a backend that draws a batch with one generator

    @property
    def key(self) -> object:
        return self if self.alone else (self.method, dataclasses.replace(self.params, seed=None))


class MicroBatcher:
    """Gathers generation jobs on the server's event loop into batched backend calls, run one at a time on a
    model thread (so the loop keeps answering while the model works, and the backend need not be thread-safe).

    Args:
        backend: The backend to call.
        max_batch: Most rows (chats or prompts) per backend call; a single larger job still runs whole.
        window_s: How long the oldest pending job waits for batch mates with the model free.
        expected: The most jobs that can be waiting at once (e.g. open sessions, one reply each), read each time:
            a batch with that many jobs starts at once. None: only a full batch starts before the window ends.
    """

    def __init__(self, backend: Backend, max_batch: int = 32, window_s: float = 0.01,
                 expected: Callable[[], int] | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if window_s < 0:
            raise ValueError(f"the batching window must be >= 0 seconds, got {window_s}")
        self.backend, self.max_batch, self.window_s, self.expected = backend, max_batch, window_s, expected
        #: Whether the backend draws each row of a sampling call with its own generator (takes ``row_seeds``).
        self.rows_apart = bool(getattr(backend, "samples_rows_apart", False))
        self.batches = 0  # backend calls made
        #: Held around every model call: generation batches, and prompt scoring in request threads.
        self.model_lock = threading.Lock()
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="simpop-serve-model")
        self._pending: collections.deque[_Job] = collections.deque()
        self._running: list[_Job] = []
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._free_since = 0.0  # loop time the last batch ended

    async def generate(self, method: str, inputs: list[Any], params: SamplingParams) -> list[Generation]:
        """``backend.<method>(inputs, params)`` as part of a batch; raises what the backend raised for this job."""
        loop = asyncio.get_running_loop()
        if self._worker is None:
            self._wake = asyncio.Event()
            self._worker = loop.create_task(self._loop(), name="simpop-serve-batcher")
        alone = params.seed is not None and not params.greedy and not self.rows_apart
        job = _Job(method, inputs, params, loop.time(), loop.create_future(), alone)
        self._pending.append(job)
        if len(self._pending) == 1 or self._ready(self._pending[0].key):
            self._wake.set()  # type: ignore[union-attr]
        try:
            return await job.future
        except asyncio.CancelledError:  # the request was cancelled: nobody reads this job's rows
            if job in self._pending:
                self._pending.remove(job)
            elif job in self._running and all(j.future.done() for j in self._running):
                self._stop_backend()
            raise

    def close(self) -> None:
        """Stop the running batch at its next token (where the backend can) and the model thread; the backend
        outlives the server, so its stop flag is cleared again once the batch has ended (else its next in-process
        ``generate`` would stop after one token)."""
        self._stop_backend()
        self._model_thread.shutdown(wait=True, cancel_futures=True)
        event = getattr(self.backend, "stop_event", None)
        if isinstance(event, threading.Event):
            event.clear()

    def _stop_backend(self) -> None:
        event = getattr(self.backend, "stop_event", None)
        if isinstance(event, threading.Event):
            event.set()

    async def _loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wake.clear()
                await self._wake.wait()
            first = self._pending[0]
            deadline = max(first.arrived, self._free_since) + (0.0 if first.alone else self.window_s)
            while not self._ready(first.key) and loop.time() < deadline:
                self._wake.clear()
                try:
                    async with asyncio.timeout_at(deadline):
                        await self._wake.wait()
                except TimeoutError:
                    break
            batch: list[Any] = []
            rows = 0
            for job in list(self._pending):
                if job.key == first.key and (not batch or rows + len(job.inputs) <= self.max_batch):
                    batch.append(job)
                    rows += len(job.inputs)
                    self._pending.remove(job)
            await self._run(batch)

    def _ready(self, key: object) -> bool:
        """Whether the batch led by ``key`` starts now: full, or every job that can come is here."""
        jobs = [job for job in self._pending if job.key == key]
        return (sum(len(job.inputs) for job in jobs) >= self.max_batch
                or (self.expected is not None and len(jobs) >= self.expected()))

    async def _run(self, batch: list[_Job]) -> None:
        self.batches += 1
        self._running = batch
        try:
            generations = await asyncio.get_running_loop().run_in_executor(self._model_thread, self._call, batch)
        except ValueError as error:
            if len(batch) > 1:  # one bad request (e.g. too long) must not fail its batch mates
                for job in batch:
                    await self._run([job])
                return
            _settle(batch[0].future, error=error)
        except Exception as error:  # answered as HTTP 500; the server keeps serving
            log.exception("backend call failed")
            for job in batch:
                _settle(job.future, error=error)
        else:
            start = 0
            for job in batch:
                _settle(job.future, result=generations[start : start + len(job.inputs)])
                start += len(job.inputs)
        finally:
            self._running = []
            self._free_since = asyncio.get_running_loop().time()

    def _call(self, batch: list[_Job]) -> list[Generation]:
        with self.model_lock:
            event = getattr(self.backend, "stop_event", None)
            if isinstance(event, threading.Event):
                event.clear()
            if all(job.future.done() for job in batch):  # every request was cancelled while the batch waited
                return []
            call = getattr(self.backend, batch[0].method)
            inputs, params = [x for job in batch for x in job.inputs], batch[0].params
            if self.rows_apart and not params.greedy:  # each row draws as in its own job's call
                return call(inputs, params, row_seeds=[(job.params.seed, i) for job in batch
                                                       for i in range(len(job.inputs))])
            return call(inputs, params)


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():  # the client went away and its request was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
