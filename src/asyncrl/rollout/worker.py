"""A rollout worker process: many concurrent episodes, one batched engine, trajectories to the queue.

The worker keeps up to ``rollout.concurrent_episodes`` episodes running. It starts a new *group*
(``group_size`` episodes of one task, or its bucket's
adaptive size: ``rollout.adaptive_group_size``) only when the staleness budget admits it and the queue is
not above high water (rules in :mod:`asyncrl.staleness`; the budget counts a group
against the worker's own weight version). Before starting, it loads newer weights whenever it may
(always in ``async`` mode, otherwise only with no episode running) and starts nothing while its
weights are more than ``max_staleness`` versions behind the newest. In ``async`` mode it also loads new
weights between turns (the batcher's ``before_batch`` hook), so every model turn is stamped with
the version that produced it. A corrupt newest snapshot, or a version whose load fails the
weight-sync canary (:mod:`asyncrl.rollout.canary`), is reported and the worker keeps the newest
valid one. Finished groups are put on the queue (blocking put = back-pressure).
What to run (curriculum bucket, open breakers, exploration, held-out probes), load balancing and
retirement follow the orchestrator's directives (:mod:`asyncrl.control.directives`); every
finished group is reported as a ``rollout/group`` event (bucket, outcomes, rewards, anomalies).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from asyncrl.config import RunConfig
from asyncrl.control import RunState, WorkerControl
from asyncrl.control.admission import Admission, Ticket
from asyncrl.control.directives import group_report
from asyncrl.envs import make_task_source
from asyncrl.envs.toolenv import VERIFIER_CACHE
from asyncrl.envs.wrappers import GUARD_STATS
from asyncrl.lending import ThreadLender
from asyncrl.records import Task, Trajectory, TreeStats
from asyncrl.rollout.runners import AgentPlayer, EpisodePlayer, Player, make_runner
from asyncrl.telemetry.jsonl import MetricWriter
from asyncrl.telemetry.reports import (
    GatewayFigures,
    GuardFigures,
    RewardCostFigures,
    RolloutFigures,
    WorkerReport,
)
from asyncrl.transport import make_queue

if TYPE_CHECKING:
    from asyncrl.engine.base import GenerationEngine
    from asyncrl.engine.batcher import TurnBatcher
    from asyncrl.gateway.agent import AgentRunner
    from asyncrl.policy.canary import Verdict
    from asyncrl.rollout.canary import PendingCheck, WeightCanary
    from asyncrl.rollout.runners import GroupRunner
    from asyncrl.weights.base import LoadedWeights, WeightStore

log = logging.getLogger("asyncrl.rollout")


class WeightFollower:
    """Keeps an engine on the newest *valid* weight version.

    A corrupt or partial newest snapshot is reported once (log + metric event + ``on_corrupt``, which
    tells the trainer to publish a good version again) and remembered; the engine keeps the newest
    valid version until a newer good one appears. With a ``canary`` (:mod:`asyncrl.rollout.canary`)
    every load is checked against the version's manifest; a version that fails is refused the same
    way, after the engine went back to the previous good version (whose tensors are kept for that).
    ``ride``: the fingerprint is checked at the load, the probe rides along the next generation call
    (:meth:`due` and :meth:`settle`, which the worker's :class:`~asyncrl.engine.batcher.TurnBatcher` calls);
    a version loaded over one whose probe has not run yet is probed at once first.
    """

    def __init__(
        self,
        store: WeightStore,
        engine: GenerationEngine,
        metrics: MetricWriter | None = None,
        name: str = "",
        on_corrupt: Callable[[int], None] | None = None,
        canary: WeightCanary | None = None,
        *,
        ride: bool = False,
    ) -> None:
        self.store, self.engine, self.metrics, self.name = store, engine, metrics, name
        self.on_corrupt = on_corrupt
        self.canary, self.ride = canary, ride
        self.pending: PendingCheck | None = None
        """The loaded version whose probe is to ride along the next generation call."""
        self.good: LoadedWeights | None = None
        """The newest version that passed the canary (what a refused load goes back to)."""
        self.bad_versions: set[int] = set()
        self.loads = self.fallbacks = 0
        self.bytes_loaded = 0
        self.load_seconds = 0.0

    def newest_valid(self) -> int:
        latest = self.store.latest_version()
        if latest is None or latest in self.bad_versions:
            return int(self.engine.version)
        return int(latest)

    def _corrupt(self, version: int, why: str, used: int, problems: list[str] | None = None) -> None:
        """Remember ``version`` as unusable and report it once (the trainer then publishes a good one)."""
        self.bad_versions.add(version)
        self.fallbacks += 1
        keep = max(used, self.engine.version)
        log.warning(
            "%s: weight version %s is corrupt (%s); keeping version %s", self.name, version, why, keep
        )
        if self.metrics is not None:
            more = {} if problems is None else {"problems": problems}
            self.metrics.event("weights/fallback", {"bad_version": version, "used": used, **more})
        if self.on_corrupt is not None:
            self.on_corrupt(version)

    def refresh(self, force: bool = False) -> None:
        latest = self.store.latest_version()
        if latest is None or latest in self.bad_versions or (latest <= self.engine.version and not force):
            return
        loaded = self.store.load_latest()
        if loaded is None:  # every retained version is corrupt: keep what the engine has, and say so
            self._corrupt(latest, "no retained version is valid", self.engine.version)
            return
        if loaded.fell_back_from is not None:
            self._corrupt(loaded.fell_back_from, "; ".join(loaded.problems), loaded.version, loaded.problems)
        if loaded.version > self.engine.version:
            self._load(loaded)

    def _load(self, loaded: LoadedWeights) -> None:
        self.settle_pending()  # the engine still serves it: probed before it goes
        t0 = time.perf_counter()
        self.engine.load_weights(loaded.version, loaded.tensors, path=loaded.path)
        self.load_seconds += time.perf_counter() - t0
        self.loads += 1
        self.bytes_loaded += sum(t.numel() * t.element_size() for t in loaded.tensors.values())
        if self.canary is None:
            return
        self.pending = self.canary.begin(self.engine, loaded)
        if self.pending is None:  # published without a record: unverified
            self.good = loaded
        elif not self.ride or not self.canary.early(self.pending).ok:  # a refusal: probed for the evidence
            self.settle_pending()

    def due(self) -> list[int] | None:
        """The probe ids to ride along the next generation call, if a load awaits its probe."""
        return self.pending.record.probe_ids if self.pending is not None else None

    def settle(self, probe: list[float] | None, *, rode: bool = True) -> bool:
        """The pending load's verdict with the engine's ``probe`` (``rode``: run with the call that is
        waiting): True when it stands (the call's samples may go), False when it was refused (the engine is
        back on the last good version; the call must be run again)."""
        pending, self.pending = self.pending, None
        assert pending is not None and self.canary is not None
        verdict = self.canary.finish(pending, probe, rode=rode)
        if verdict is not None and not verdict.ok:
            self._refuse(pending.loaded, verdict)
            return False
        self.good = pending.loaded
        return True

    def settle_pending(self) -> None:
        """Run a pending load's probe now (a fingerprint that refuses it, a load over it, the worker's end)."""
        if self.pending is not None:
            t0 = time.perf_counter()
            probe = self.engine.probe(self.pending.record.probe_ids)
            self.pending.seconds += time.perf_counter() - t0
            self.settle(probe, rode=False)

    def _refuse(self, loaded: LoadedWeights, verdict: Verdict) -> None:
        """The engine does not serve ``loaded`` as published: go back to the last good version, record
        the evidence (``weights/canary_failed``; the orchestrator raises an alert) and report it."""
        from asyncrl.rollout.canary import WeightCanaryError

        assert self.canary is not None
        good = self.good
        evidence = {
            "worker": self.name,
            "version": loaded.version,
            "kept": good.version if good else None,
            **verdict.evidence(),
        }
        log.error(
            "%s: weight version %d fails the weight-sync canary: %s", self.name, loaded.version, evidence
        )
        if self.metrics is not None:
            self.metrics.event("weights/canary_failed", evidence)
        self.bad_versions.add(loaded.version)
        if self.on_corrupt is not None:
            self.on_corrupt(loaded.version)  # the trainer publishes its weights again as a new version
        if good is None:
            raise WeightCanaryError(
                f"{self.name}: weight version {loaded.version} fails the weight-sync canary and no earlier "
                f"version passed it: {'; '.join(verdict.problems[:5])}"
            )
        self.engine.load_weights(good.version, good.tensors, path=good.path)
        again = self.canary.verify(self.engine, good, count=False)
        if again is not None and not again.ok:
            raise WeightCanaryError(
                f"{self.name}: back on weight version {good.version}, which now fails the canary too: "
                + "; ".join(again.problems[:3])
            )


class RolloutWorker:
    def __init__(self, cfg: RunConfig, run_dir: Path, index: int, started: float | None = None) -> None:
        from asyncrl.engine import make_engine
        from asyncrl.policy import Policy
        from asyncrl.policy.chat import make_renderer
        from asyncrl.policy.model import context_limit
        from asyncrl.rollout.canary import WeightCanary
        from asyncrl.weights import make_weight_store

        self.cfg, self.run_dir, self.index = cfg, run_dir, index
        self.name = f"rollout-{index}"
        self.settings = settings = cfg.rollout_settings()
        self.rng = random.Random(cfg.seed * 1000 + index * 7919 + os.getpid())
        self.state = RunState.for_role(cfg, run_dir)
        self.queue = make_queue(cfg.transport, run_dir)
        self.store = make_weight_store(cfg.weights, run_dir)
        self.policy = Policy.load(run_dir / "initial_policy", cfg=cfg.model).to(cfg.model.device)
        self.renderer = make_renderer(cfg.model, self.policy)
        self.max_context = context_limit(cfg.model, self.policy)
        self.engine = make_engine(
            settings.engine, self.policy, self.renderer.stop_token_ids, seed=self.rng.randrange(2**31)
        )
        self.engine.version = -1
        self.tasks = make_task_source(cfg.env)
        self.staleness = self.state.staleness
        self.metrics = MetricWriter(
            run_dir / "metrics" / f"{self.name}.jsonl", role=self.name, started=started
        )

        VERIFIER_CACHE.enabled = cfg.cost.reward_cache
        VERIFIER_CACHE.max_entries = cfg.cost.reward_cache_entries
        self.weights = WeightFollower(
            self.store,
            self.engine,
            self.metrics,
            self.name,
            self.state.report_corrupt,
            WeightCanary.of(cfg),
            ride=cfg.weights.canary.ride_along,
        )
        self.control = WorkerControl(cfg, self.state, self.name, self.tasks, curriculum=settings.curriculum)
        from asyncrl.bootstrap import torch_threads

        # core lending (asyncrl.lending), polled before each decoder layer of what the engine runs
        self.lender = ThreadLender.join(
            run_dir, self.name, torch_threads(cfg, "rollout"), models=self.engine.compute_modules()
        )
        self.agent: AgentRunner | None = None
        """env.kind: agent — the :class:`~asyncrl.gateway.agent.AgentRunner` (started in :meth:`run`)."""
        self.admission = Admission(self.state, self.name, cfg.rollout.group_size, cfg.env.max_turns)
        """Rule 1 and the in-flight load (model turns the running episodes may still take), one ticket a group."""
        self.counts = RolloutFigures()
        """The worker's counters (cumulative for this process), reported every ``telemetry.log_every_s``."""
        self.weights.refresh(force=True)

    # -- groups ----------------------------------------------------------------------------------
    async def _run_group(self, runner: GroupRunner, ticket: Ticket, task: Task, heldout: bool) -> None:
        """Run one group, report it, deliver it whole (held-out probes: measured, never trained)."""
        with ticket:  # raised or cancelled: the ticket returns what it holds
            group = await runner.run(ticket, task, heldout)
            if group.tree is not None:
                self._count_tree(group.tree)
            if not group.members:
                ticket.release()
                return
            # the rollout/group event the orchestrator's rules consume
            self.metrics.group(group_report(group, *self.settings.reward_bounds))
            if heldout:
                ticket.release()
                self.counts.heldout_episodes += len(group)
                return
            t0 = time.perf_counter()
            ok = False
            while not ok and not self.state.stopping():  # the whole group in one durable write
                ok = await asyncio.to_thread(self.queue.put, group, 1.0)
            if not ok:
                return  # stopping: the ticket returns the admissions
            ticket.deliver(group)
            for traj in group.members:
                self._count(traj)
            self.counts.put_seconds += time.perf_counter() - t0
            self.counts.groups += 1

    def _count_tree(self, stats: TreeStats) -> None:
        c = self.counts
        c.tree_roots += stats.roots
        c.tree_branch_points += stats.branch_points
        c.tree_replayed_turns += stats.replayed_turns
        c.tree_replay_diverged += stats.replay_diverged
        c.tree_rounds += stats.rounds

    def _count(self, traj: Trajectory) -> None:
        """A delivered trajectory in the worker's counters."""
        c = self.counts
        c.episodes += 1
        c.tokens += traj.num_model_tokens()
        c.success += traj.outcome == "success"
        c.faults += sum(1 for t in traj.turns if t.fault is not None)
        model_turns = [t for t in traj.turns if t.role == "model"]
        c.env_calls += len(model_turns)
        c.env_seconds += sum(t.env_seconds for t in model_turns)
        c.env_retries += int(traj.reward_components.get("env_retries", 0))
        if traj.outcome in ("truncated", "timeout", "early_stopped"):
            c.truncated_tokens += traj.num_model_tokens()
        c.early_stopped += traj.outcome == "early_stopped"
        if traj.render_diff is None:  # no independent rendering to compare with: not counted exact
            c.token_exact_unchecked += 1
        else:  # token-exactness, and how far re-tokenising would drift
            c.token_exact_checked += 1
            c.token_inexact += traj.render_diff > 0
            c.retokenization_inexact += bool(traj.retokenization_diff)
            c.retokenization_diff_tokens += traj.retokenization_diff or 0

    async def _runner(self, batcher: TurnBatcher) -> GroupRunner:
        """The group runner: environment episodes, or the user's program through the gateway."""
        play: Player
        if self.cfg.env.kind == "agent":
            from asyncrl.gateway.agent import AgentRunner

            refresh = self.weights.refresh if self.staleness.inflight_updates else None
            self.agent = await AgentRunner.start(
                self.cfg,
                batcher,
                self.renderer,
                self.max_context,
                index=self.index,
                worker_id=self.name,
                policy=self.staleness,
                newest_version=self.weights.newest_valid,
                max_staleness=self.state.effective_max_staleness,
                refresh=refresh,
            )
            play = AgentPlayer(self.agent)
        else:
            jitter = self.control.temperature_jitter
            factor = self.control.temperature_factor
            play = EpisodePlayer(
                self.settings, batcher, self.renderer, self.max_context, self.name, self.rng, jitter, factor
            )
        return make_runner(self.cfg, play)

    async def _admit(self, batcher: TurnBatcher, busy: bool, size: int) -> Ticket | None:
        """Rule 2, then rule 1: load newer weights whenever allowed (``sync`` / ``one_step_off``: only with
        no group running, ``busy``), so that the budget counts the next group against the version it will
        use; a ticket when the worker is not too stale and the budget admits a group of ``size``."""
        bound = self.state.effective_max_staleness()
        newest = self.weights.newest_valid()
        if newest > self.engine.version and (self.staleness.inflight_updates or not busy):
            async with batcher.lock:  # never while a batch is generated
                self.weights.refresh()
            newest = self.weights.newest_valid()  # the load may have set a corrupt version aside
        if self.staleness.must_refresh(self.engine.version, newest, bound):
            return None
        return self.admission.admit(int(self.engine.version), size)

    def _next_group(self) -> tuple[Task, bool, int]:
        """The next group to start: its task (curriculum, breakers, exploration), whether it is a
        held-out probe, and its size (``rollout.adaptive_group_size``)."""
        task, heldout = self.control.next_task(self.rng)
        return task, heldout, self.control.group_size(task, heldout)

    async def run(self) -> None:
        """The worker loop: refresh → admit → run → deliver, up to ``rollout.concurrent_episodes``."""
        from asyncrl.engine.batcher import TurnBatcher

        batcher = TurnBatcher.of(
            self.engine,
            self.settings.engine,
            self.weights.refresh if self.staleness.inflight_updates else None,
            self.lender.waiting if self.lender is not None else None,
            check=self.weights if self.weights.ride else None,
        )
        runner = await self._runner(batcher)
        running: set[asyncio.Task[None]] = set()
        cap = self.settings.concurrent_episodes
        nxt: tuple[Task, bool, int] | None = None  # the next group: drawn once, started once admitted
        last_report = time.time()
        while not self.state.stopping():
            started = False
            load = self.admission.load
            self.control.publish_load(load)
            if self.control.retiring() and not running:
                break  # elastic scale-down: every admitted group delivered
            task, heldout, size = nxt = nxt or self._next_group()
            room = self.admission.episodes + size <= max(cap, size)  # a group larger than the cap runs alone
            if room and not self.control.retiring() and self.control.may_take(load):
                ticket = await self._admit(batcher, bool(running), size)
                if ticket is not None:
                    self.control.publish_load(self.admission.load, force=True)
                    running.add(asyncio.create_task(self._run_group(runner, ticket, task, heldout)))
                    nxt, started = None, True
            for t in [t for t in running if t.done()]:
                running.discard(t)
                t.result()  # an unexpected error propagates to the supervisor (restart)
            if time.time() - last_report > self.cfg.telemetry.log_every_s:
                self._report(batcher)
                last_report = time.time()
            if not started:
                await asyncio.sleep(0.01 if running else 0.02)
        for t in running:
            t.cancel()
        self.control.publish_load(0, force=True)
        if self.agent is not None:
            await self.agent.stop()
        batcher.close()
        self.weights.settle_pending()  # a version loaded and never served is checked all the same
        self._report(batcher)

    def _report(self, batcher: TurnBatcher) -> None:
        self.metrics.report(
            WorkerReport(
                rollout=self._figures(batcher),
                guard=msgspec.convert(asdict(GUARD_STATS), GuardFigures),  # what the env guards absorbed
                cost=RewardCostFigures(
                    reward_cache_hits=float(VERIFIER_CACHE.hits),
                    reward_cache_misses=float(VERIFIER_CACHE.misses),
                    reward_seconds=VERIFIER_CACHE.seconds,
                ),
                weights=self.weights.canary.figures() if self.weights.canary else None,
                gateway=self._gateway_figures(self.agent) if self.agent is not None else None,
                cores=self.lender.figures() if self.lender is not None else None,
            )
        )

    def _figures(self, batcher: TurnBatcher) -> RolloutFigures:
        """The counters, the weight loads, and the engine's and the batcher's work so far."""
        w, e = self.weights, self.engine
        return msgspec.structs.replace(
            self.counts,
            weight_loads=float(w.loads),
            weight_fallbacks=float(w.fallbacks),
            weight_bytes_loaded=float(w.bytes_loaded),
            weight_load_seconds=w.load_seconds,
            version=float(e.version),
            gen_busy_seconds=batcher.busy_seconds,
            gen_batches=float(batcher.batches),
            gen_sequences=float(batcher.sequences),
            gen_tokens=float(batcher.tokens),
            decode_steps=float(e.decode_steps),
            decode_seconds=e.decode_seconds,
            prefill_tokens_computed=float(e.prefill_tokens_computed),
            prefill_tokens_reused=float(e.prefill_tokens_reused),
            prefill_tokens_shared=float(e.prefill_tokens_shared),
            prefill_seconds=e.prefill_seconds,
            load_steps=float(self.admission.load),
        )

    @staticmethod
    def _gateway_figures(agent: AgentRunner) -> GatewayFigures:
        gw = agent.gateway
        counts = {**gw.counts, **agent.counts, "open_sessions": len(gw.sessions)}
        return msgspec.convert(counts, GatewayFigures)


def worker_main(cfg_json: str, run_dir: str, index: int) -> None:
    """Process entry point (spawned by the launcher)."""
    started = time.time()  # the ledger counts this process's whole life, start-up included
    from asyncrl.bootstrap import init_role_process

    cfg = init_role_process(cfg_json, "rollout")
    worker = RolloutWorker(cfg, Path(run_dir), index, started=started)
    try:
        asyncio.run(worker.run())
    finally:
        worker.engine.close()  # a vllm engine stops its own processes
