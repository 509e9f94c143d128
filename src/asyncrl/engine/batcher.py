"""Batched generation for concurrent episodes: :class:`TurnBatcher`.

Every running episode (the rollout worker's, the held-out evaluation's, the gateway's agent calls)
awaits :meth:`TurnBatcher.generate` for its model turns; the batcher serves all requests waiting at
that moment with one ``engine.generate`` call, in a worker thread, so environment steps of other
episodes progress meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from asyncrl.engine.base import GenerationEngine, Sample
from asyncrl.records import SamplingParams

if TYPE_CHECKING:
    from asyncrl.config import EngineConfig


class CallCheck(Protocol):
    """A check that rides along the next generation call: the weight-sync canary's probe after a load
    (:class:`~asyncrl.rollout.worker.WeightFollower`)."""

    def due(self) -> list[int] | None:
        """The probe ids to run with the next call, or ``None``."""

    def settle(self, probe: list[float] | None) -> bool:
        """The verdict on the probe's log-probs: False when the weights were refused (and replaced)."""


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
    Each result carries the engine version that produced it.

    Batching policy: a generation call costs nearly the same for 4 sequences as for 64, so the
    batcher waits up to ``max_wait_s`` for more requests before it starts — but never when every live
    episode is already waiting (nothing more can arrive) or the batch is full (``max_batch``).
    """

    engine: GenerationEngine
    before_batch: Callable[[], None] | None = None
    idle: Callable[[], None] | None = None
    """Runs (in the event loop thread) when a generation call returns and no request waits: the
    rollout worker announces there that its cores may be lent (:mod:`asyncrl.lending`)."""
    check: CallCheck | None = None
    """Rides along the next call when due (:meth:`GenerationEngine.generate_probed`); its samples are
    released only when it settles, and generated again when it refuses the weights."""
    _pending: list[_Request] = field(default_factory=list)
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while weights may change or a batch is generated: weight loads never race generation."""
    max_batch: int = field(kw_only=True)
    """``rollout.engine.max_batch``."""
    max_wait_s: float = field(kw_only=True)
    """``rollout.engine.batch_wait_ms`` / 1000."""
    live_episodes: int = 0
    """Episodes currently running on this batcher (maintained by :func:`run_episode`)."""
    batches: int = 0
    """Generation calls."""
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
                t0 = time.perf_counter()
                await self._call()
                self.busy_seconds += time.perf_counter() - t0
            if self._pending:
                self._wakeup.set()
            elif self.idle is not None:
                self.idle()

    async def _call(self) -> None:
        """One ``engine.generate`` call for up to ``max_batch`` waiting requests."""
        batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
        prompts, sampling = [r.prompt for r in batch], [r.sampling for r in batch]
        version = self.engine.version
        ids = self.check.due() if self.check is not None else None
        try:
            if ids is None:
                samples = await asyncio.to_thread(self.engine.generate, prompts, sampling)
            else:
                assert self.check is not None
                samples, probe = await asyncio.to_thread(self.engine.generate_probed, prompts, sampling, ids)
                if not self.check.settle(probe):  # refused: the engine is back on the version it kept
                    version = self.engine.version
                    samples = await asyncio.to_thread(self.engine.generate, prompts, sampling)
        except Exception as exc:  # an engine failure fails the waiting episodes, not the loop
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(exc)
            return
        self.batches += 1
        self.sequences += len(batch)
        for r, s in zip(batch, samples, strict=True):
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
        *,
        check: CallCheck | None = None,
    ) -> TurnBatcher:
        """The batcher ``rollout.engine`` describes."""
        return cls(
            engine, before_batch, idle, check, max_batch=ec.max_batch, max_wait_s=ec.batch_wait_ms / 1000
        )
