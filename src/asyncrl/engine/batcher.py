"""Batched generation for concurrent episodes: :class:`TurnBatcher`.

Every running episode (the rollout worker's, the held-out evaluation's, the gateway's agent calls)
awaits :meth:`TurnBatcher.generate` for its model turns. Where the engine opens a decode stream
(continuous batching, :mod:`asyncrl.engine.stream`), a turn joins the running batch at the next decode
step and its result comes back the step it stops; otherwise the batcher serves all requests waiting at
that moment with one ``engine.generate`` call. Either way the engine computes in a worker thread, so
environment steps of other episodes progress meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asyncrl.engine.base import GenerationEngine, Sample
from asyncrl.engine.stream import DecodeStream, open_stream
from asyncrl.records import SamplingParams

if TYPE_CHECKING:
    from asyncrl.config import EngineConfig

log = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    future: asyncio.Future[tuple[Sample, int]]


@dataclass
class TurnBatcher:
    """Serves model-turn requests of concurrently running episodes in batched engine calls.

    ``before_batch`` runs between batches (in the event loop thread) — the rollout worker uses
    it to load new weights, so an in-flight episode picks up a new version at a turn boundary.
    Each result carries the engine version that produced it. With a decode stream a "batch" lasts
    from the first request to the moment no row decodes: ``stale`` (when given) is asked at every
    step, and a newer version drains the batch (nothing joins, the running rows finish) so that
    ``before_batch`` can load it; so does :meth:`exclusive`.

    Batching policy: a generation call costs nearly the same for 4 sequences as for 64, so the
    batcher waits up to ``max_wait_s`` for more requests before it starts — but never when every live
    episode is already waiting (nothing more can arrive) or the batch is full (``max_batch``).
    """

    engine: GenerationEngine
    before_batch: Callable[[], None] | None = None
    idle: Callable[[], None] | None = None
    """Runs (in the event loop thread) when a generation call returns and no request waits: the
    rollout worker announces there that its cores may be lent (:mod:`asyncrl.lending`)."""
    stale: Callable[[], bool] | None = None
    """Whether a newer weight version waits for ``before_batch`` (a running stream then drains)."""
    _pending: list[_Request] = field(default_factory=list)
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while weights may change or a batch is generated: weight loads never race generation.
    Take it through :meth:`exclusive`, which also drains a running stream."""
    _exclusive_waiting: int = 0
    _next_id: int = 0
    stream: DecodeStream | None = None
    """The engine's decode stream, opened at the first batch (``None``: call by call)."""
    max_batch: int = field(kw_only=True)
    """``rollout.engine.max_batch``."""
    max_wait_s: float = field(kw_only=True)
    """``rollout.engine.batch_wait_ms`` / 1000."""
    live_episodes: int = 0
    """Episodes currently running on this batcher (maintained by :func:`run_episode`)."""
    batches: int = 0
    """Generation calls, or with a stream: the times a request joined it (several at once count once)."""
    sequences: int = 0
    tokens: int = 0
    """Tokens sampled (every turn of every episode, stop tokens included)."""
    busy_seconds: float = 0.0

    async def generate(self, prompt: list[int], sampling: SamplingParams) -> tuple[Sample, int]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._serve())
        fut: asyncio.Future[tuple[Sample, int]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(prompt, sampling, fut))
        self._wakeup.set()
        return await fut

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold :attr:`lock` — no generation runs meanwhile — once a running stream drained (nothing
        joins it from the moment this is entered): for weight loads."""
        self._exclusive_waiting += 1
        try:
            await self.lock.acquire()
        finally:
            self._exclusive_waiting -= 1
        try:
            yield
        finally:
            self.lock.release()

    async def _serve(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await asyncio.sleep(0)  # let episodes that are ready in this tick join the batch
            await self._gather_more()
            if not self._pending:
                continue
            async with self.lock:
                if self.before_batch is not None:
                    self.before_batch()
                if self.stream is None:
                    self.stream = open_stream(self.engine)
                t0 = time.perf_counter()
                if self.stream is not None:
                    await self._run_stream(self.stream)
                else:
                    await self._call()
                self.busy_seconds += time.perf_counter() - t0
            if self._pending:
                self._wakeup.set()
            elif self.idle is not None:
                self.idle()

    def _take(self, n: int) -> list[_Request]:
        batch, self._pending = self._pending[:n], self._pending[n:]
        return batch

    async def _call(self) -> None:
        """One ``engine.generate`` call for up to ``max_batch`` waiting requests."""
        batch = self._take(self.max_batch)
        version = self.engine.version
        try:
            samples = await asyncio.to_thread(
                self.engine.generate, [r.prompt for r in batch], [r.sampling for r in batch]
            )
        except Exception as exc:  # an engine failure fails the waiting episodes, not the loop
            _fail(batch, exc)
            return
        self.batches += 1
        for r, s in zip(batch, samples, strict=True):
            self._resolve(r, s, version)

    async def _run_stream(self, stream: DecodeStream) -> None:
        """Decode until no row is left: waiting requests join at every step boundary until a weight load
        waits (:meth:`exclusive`, ``stale``: from then on nothing joins and the stream drains); each row's
        result is set the step it stops (from the engine's thread, while the step's feed runs). One
        thread call a step."""
        loop = asyncio.get_running_loop()
        rows: dict[int, _Request] = {}

        def settle(done: list[tuple[int, Sample]]) -> None:  # in the event loop
            for rid, sample in done:
                self._resolve(rows.pop(rid), sample, stream.version)

        def finished(done: list[tuple[int, Sample]]) -> None:  # in the engine's thread
            loop.call_soon_threadsafe(settle, done)

        draining, first = False, True
        try:
            while True:
                # not at the first step: before_batch just loaded what it could (no spinning on a
                # version it cannot load)
                draining = draining or (not first and self._load_waits())
                first = False
                if draining and not stream.live:
                    return
                joiners = [] if draining else self._take(self.max_batch - stream.live)
                if not joiners and not stream.live:
                    return
                batch = []
                for r in joiners:
                    self._next_id += 1
                    rows[self._next_id] = r
                    batch.append((self._next_id, r.prompt, r.sampling))
                self.batches += bool(batch)
                errors = await asyncio.to_thread(stream.advance, batch, finished)
                for rid, exc in errors:  # a request the engine refuses fails alone
                    _fail([rows.pop(rid)], exc)
        except BaseException as exc:  # an engine failure (or cancellation) fails the rows it held
            _fail(
                list(rows.values()),
                exc if isinstance(exc, Exception) else RuntimeError("generation cancelled"),
            )
            self.stream = None  # a fresh stream for the next batch: this one's state is unknown
            if not isinstance(exc, Exception):
                raise

    def _load_waits(self) -> bool:
        """A weight load waits: :meth:`exclusive` was entered, or ``stale`` says a newer version waits (a
        ``stale`` that raises counts as no: the stream goes on, the next check asks again)."""
        if self._exclusive_waiting > 0:
            return True
        try:
            return self.stale is not None and self.stale()
        except Exception:
            log.warning("the batcher's staleness check failed; decoding on", exc_info=True)
            return False

    def _resolve(self, r: _Request, s: Sample, version: int) -> None:
        self.sequences += 1
        self.tokens += len(s.token_ids)
        if not r.future.done():
            r.future.set_result((s, version))

    async def _gather_more(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while 0 < len(self._pending) < min(self.max_batch, self.live_episodes):
            left = deadline - loop.time()
            if left <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), left)
            except TimeoutError:
                return

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    @classmethod
    def of(
        cls,
        engine: GenerationEngine,
        ec: EngineConfig,
        before_batch: Callable[[], None] | None = None,
        idle: Callable[[], None] | None = None,
        stale: Callable[[], bool] | None = None,
    ) -> TurnBatcher:
        """The batcher ``rollout.engine`` describes."""
        return cls(
            engine, before_batch, idle, stale, max_batch=ec.max_batch, max_wait_s=ec.batch_wait_ms / 1000
        )


def _fail(requests: list[_Request], exc: BaseException) -> None:
    for r in requests:
        if not r.future.done():
            r.future.set_exception(exc)
