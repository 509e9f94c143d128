"""The trainer process: queue → de-duplicate → replay buffer → learner → publish → checkpoint.

Nothing lost, nothing trained twice, never stuck: entries are **acknowledged by fate**
(:mod:`asyncrl.trainer.intake`) — a dropped or skipped sample is recorded in the ledger and
acknowledged at once, a trained one right after the checkpoint that holds its update; a
duplicate of a recorded id is acknowledged without training. A crash before a checkpoint leaves
the trained entries un-acked: they are redelivered and the resumed trainer trains them once.

A worker that finds the newest weight version corrupt reports it (``RunState.report_corrupt``); the
trainer answers by publishing its current weights again as a new version, so that workers (and
the staleness budget, which counts their version) are never left behind a run of unusable
versions. Every version's manifest carries the weight-sync canary's record (the fingerprint of its
tensors and the trainer's log-probs of the probe prompt, :mod:`asyncrl.policy.canary`), against which
each worker checks its engine after loading it.

Versions: the weights after ``step`` optimiser steps are version ``step + offset``; ``offset``
is 0 on a fresh run and, after a resume, whatever keeps the published sequence strictly
increasing (versions published after the checkpoint by the crashed trainer are never reused).

With ``trainer.world_size > 1`` this is rank 0 of the trainer group (:mod:`asyncrl.trainer.distributed`):
everything above is rank 0's alone; the other ranks (:mod:`asyncrl.trainer.ranks`) receive each batch
and take the same step, and write their shard of the optimiser state into each checkpoint.
"""

from __future__ import annotations

import logging
import random
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from asyncrl.config import RunConfig
from asyncrl.control import RunState
from asyncrl.lending import ThreadLender
from asyncrl.records import Group, Trajectory, members
from asyncrl.telemetry.jsonl import MetricWriter
from asyncrl.telemetry.reports import LifecycleFigures, TrainerFigures, TrainerReport
from asyncrl.telemetry.trainer import TrainerTelemetry
from asyncrl.trainer.buffer import Dropped, ReplayBuffer
from asyncrl.trainer.distributed import Checkpoint, Init, Step, Stop
from asyncrl.trainer.intake import Intake
from asyncrl.trainer.zero_signal import Split, differs
from asyncrl.transport import make_queue

if TYPE_CHECKING:
    from asyncrl.policy import Policy
    from asyncrl.trainer.checkpoint import TrainerState
    from asyncrl.trainer.distributed import RankGroup
    from asyncrl.trainer.learner import Learner
    from asyncrl.weights import WeightStore

log = logging.getLogger("asyncrl.trainer")


def load_learner(
    cfg: RunConfig, run_dir: Path, ckpt: Path | None, py_rng: random.Random, group: RankGroup | None = None
) -> tuple[Learner, TrainerState]:
    """The policy (from ``ckpt`` or the initial policy), its reference and learner, restored from
    ``ckpt`` when given (every rank of a trainer group builds its replica this way, then puts it under
    its parallelism: :func:`~asyncrl.trainer.parallel.make_parallel`)."""
    from asyncrl.policy import Policy
    from asyncrl.trainer.checkpoint import TrainerState, load_checkpoint
    from asyncrl.trainer.learner import Learner
    from asyncrl.trainer.parallel import make_parallel

    device = cfg.model.device
    policy = Policy.load(ckpt / "policy" if ckpt else run_dir / "initial_policy", cfg=cfg.model).to(device)
    ref = Policy.load(run_dir / "initial_policy", cfg=cfg.model).to(device) if cfg.algo.kl_coef > 0 else None
    learner = Learner(cfg, policy, ref)
    ts = TrainerState(step=0, last_published=0, consumed=0, extra={})
    if ckpt is not None:
        ts = load_checkpoint(ckpt, policy, learner.optimizer, learner.scheduler, py_rng)
        learner.master.pull()  # float32 masters from the loaded (bfloat16) weights
        log.info("resumed from %s (step %d)", ckpt, ts.step)
        learner.credit.load_value(run_dir, ts.step)
    learner.parallelize(make_parallel(cfg, group))
    return learner, ts


def resume_versions(store: WeightStore, step: int, last_published: int) -> tuple[int, int]:
    """(offset, newest published) of a trainer resumed at ``step``: the next version, ``step + 1 +
    offset``, exceeds every version in ``store`` — including one a crashed trainer renamed into place
    without moving the pointer — and every version the checkpoint knows it published."""
    published = max(store.newest_version() or 0, last_published)
    return max(0, published - step), published


class TrainerRole:
    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        resume: bool = True,
        started: float | None = None,
        group: RankGroup | None = None,
    ) -> None:
        from asyncrl.trainer.checkpoint import latest_checkpoint
        from asyncrl.weights import make_weight_store

        self.cfg, self.run_dir, self.settings = cfg, run_dir, cfg.trainer_settings()
        torch.manual_seed(cfg.seed)
        self.py_rng = random.Random(cfg.seed)
        self.state = RunState.for_role(cfg, run_dir)
        self.queue = make_queue(cfg.transport, run_dir)
        self.store = make_weight_store(cfg.weights, run_dir)
        self.ckpt_root = run_dir / "checkpoints"
        ckpt = latest_checkpoint(self.ckpt_root, verify=True) if resume else None
        if group is not None:  # every rank resumes from the checkpoint rank 0 chose
            group.send(Init(str(ckpt) if ckpt else ""))
        self.learner, ts = load_learner(cfg, run_dir, ckpt, self.py_rng, group)
        self.parallel = self.learner.parallel
        self.policy: Policy = self.learner.policy
        self.step = ts.step
        self.offset, self.last_published = resume_versions(self.store, ts.step, ts.last_published)
        self.staleness = self.state.staleness
        self.buffer = ReplayBuffer.of(cfg, self.staleness, scorer=self._behaviour_kl)
        self.intake = Intake(self.queue, self.state, pull_size=2 * cfg.trainer.batch_size)  # entries: groups
        self.metrics = MetricWriter(run_dir / "metrics" / "trainer.jsonl", role="trainer", started=started)
        # cumulative figures: token accounting for the cost ledger, and the time split (learn and
        # publish seconds are parts of busy; the rest of busy is framework overhead)
        self.own = TrainerFigures()
        self.observe = TrainerTelemetry(cfg, run_dir)  # archive, lifecycle traces, batch statistics
        from asyncrl.bootstrap import torch_threads

        # core lending (asyncrl.lending), polled before each decoder layer of the policy
        self.lender = (
            ThreadLender.join(run_dir, "trainer", torch_threads(cfg, "trainer"), models=[self.policy.model])
            if self.parallel.world == 1
            else None
        )
        self.state.announce_version(self.version)
        self.state.record_start(resumed=ckpt is not None)

    def _behaviour_kl(self, group: list[Trajectory]) -> float:
        """Mean k3 KL between the behaviour policy and the current one on a group's model tokens."""
        from asyncrl.algo import kl_mean
        from asyncrl.policy.scoring import token_logprobs
        from asyncrl.trainer.learner import collate

        b = collate(group, self.policy.tokenizer.pad_token_id)
        with torch.no_grad():
            now = token_logprobs(
                self.policy.model,
                b.ids,
                b.attn,
                b.temperature,
                chunk_tokens=self.cfg.trainer.logits_chunk_tokens,
            )
        return float(kl_mean(b.behaviour, now, "k3", b.mask))

    @property
    def version(self) -> int:
        return self.step + self.offset

    # -- phases ------------------------------------------------------------------------------------
    def _record_drops(self, dropped: list[Dropped]) -> None:
        """Dropped samples: fate recorded and entries acknowledged now (no checkpoint needs to cover them)."""
        for d in dropped:
            if d.reason == "dropped_stale":
                self.own.dropped_stale_tokens += d.traj.num_model_tokens()
            else:
                self.own.dropped_other_tokens += d.traj.num_model_tokens()
        if dropped:
            self.intake.settle((d.traj.id, d.reason, self.step, d.age) for d in dropped)
            self.state.record_dropped(len(dropped))  # returns the slots to the admission budget

    def _answer_corrupt_reports(self) -> None:
        """A worker found our newest version corrupt: publish the current weights again, as a new
        version, so that no worker stays behind a run of unusable versions (the staleness budget
        counts the worker's own version; without this, max_staleness + 1 corrupt versions in a row
        would stop both sides)."""
        bad = self.state.corrupt_version()
        if bad is None or bad < self.last_published:
            return
        self.offset = self.last_published + 1 - self.step
        log.warning(
            "weight version %d was reported corrupt; publishing the current weights as %d", bad, self.version
        )
        self._publish(republished=True)
        self.state.announce_version(self.version)

    def _publish(self, republished: bool = False) -> None:
        from asyncrl.weights import publish_policy

        t0 = time.perf_counter()
        path = publish_policy(
            self.store,
            self.version,
            self.parallel.full_policy(self.policy),
            step=self.step,
            canary=self.cfg.weights.canary,
        )
        self.own.bytes_published += sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())
        self.last_published = self.version
        self.state.record_publish(self.version, republished=republished)
        self.own.publish_seconds += time.perf_counter() - t0

    def _checkpoint(self) -> None:
        from asyncrl.trainer.checkpoint import TrainerState, save_checkpoint

        ts = TrainerState(
            step=self.step,
            last_published=self.last_published,
            consumed=len(self.intake.done_ids) + len(self.intake.trained),
            extra={"offset": self.offset},
        )
        save_checkpoint(
            self.ckpt_root,
            self.parallel.full_policy(self.policy),
            self.learner.optimizer,
            self.learner.scheduler,
            ts,
            self.py_rng,
            keep=self.cfg.trainer.keep_checkpoints,
            optimizer_shards=self._optimizer_shards if self.parallel.world > 1 else None,
        )
        self.learner.credit.save_value(self.run_dir, self.step, keep=self.cfg.trainer.keep_checkpoints)
        # the trained fates are durable now: record them, then acknowledge (a crash in between only
        # causes a redelivery that is de-duplicated against the ledger)
        self.intake.checkpointed()

    def _optimizer_shards(self, path: Path) -> None:
        """Every rank writes its shard of the optimiser state into ``path`` (one collective save)."""
        from asyncrl.trainer.checkpoint import write_optimizer_shards

        self.parallel.tell(lambda: Checkpoint(str(path)))
        write_optimizer_shards(path, self.learner.optimizer)

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> None:
        tc = self.cfg.trainer
        last: tuple[dict[str, float], list[Trajectory]] | None = None
        while self.step < tc.total_steps and not self.state.stopping():
            t0 = time.perf_counter()
            # 1. answer corrupt-version reports; take what the queue has; 2. assemble a batch
            self._answer_corrupt_reports()
            self.intake.pull(self.buffer)
            bound = self.state.effective_max_staleness()
            if self.settings.steer_buffer:  # batch composition follows the curriculum
                self.buffer.task_mix = self.state.directives().weights or self.buffer.task_mix
            batch, dropped = self.buffer.take(self.version, bound)
            self._record_drops(dropped)
            if batch is None:
                self.parallel.beat()
                if self.lender is not None:  # nothing to train: our cores go to the rollout workers
                    self.lender.waiting()
                self.own.idle_seconds += time.perf_counter() - t0
                continue
            # 3. learn; a non-finite step is skipped and never published
            t_learn = time.perf_counter()
            self.parallel.tell(partial(Step.of, batch, self.version))  # the other ranks take the same step
            metrics = self.learner.step(batch, self.version)
            self.own.learn_seconds += time.perf_counter() - t_learn
            skipped = metrics["train/skipped"] > 0
            samples = members(batch)
            ages = [self.staleness.age(self.version, t.oldest_version() or 0) for t in samples]
            for t in samples:
                t.lifecycle.trained = time.time()
            if skipped:  # the step was undone: a fate of its own, recorded and acknowledged now
                self.intake.settle(
                    (t.id, "skipped", self.step, a) for t, a in zip(samples, ages, strict=True)
                )
                self.state.record_dropped(len(samples))
                self.metrics.event("train/non_finite_step", {"step": self.step})
            else:
                # the budget counts episodes, batch_size a version: what a batch of whole groups held beyond
                self.state.record_beyond_batch(len({t.episode for t in samples}) - tc.batch_size)
                self.intake.mark_trained(samples, self.step, ages)
                self._tally_batch(batch)
                metrics.update(self.observe.on_trained(batch, ages, self.step, self.version))
                self.step += 1
                every = self.cfg.credit.sample_every
                if every and (self.step % every == 0 or self.step == tc.total_steps):
                    self.learner.credit.write_samples(
                        self.run_dir, self.step, random.Random(self.cfg.seed + self.step)
                    )
                # 4. publish every sync_every steps — before announcing the version, so that the budget
                # never admits episodes for a version whose weights workers cannot load yet
                sync_every = self.state.effective_sync_every()  # the orchestrator may lower it
                if self.step % sync_every == 0 or self.step == tc.total_steps:
                    self._publish()
                self.state.announce_version(self.version)
                self.state.record_step(self.step)
                # 5. checkpoint every checkpoint_every steps
                if self.step % tc.checkpoint_every == 0 or self.step == tc.total_steps:
                    self._checkpoint()
            self.own.busy_seconds += time.perf_counter() - t0
            self._report(metrics, samples)  # one row per trained batch: the data-freshness curve
            last = (metrics, samples)
        if self.intake.trained:
            self._checkpoint()
        self.parallel.tell(Stop)
        if last is not None:
            self._report(*last)  # final figures (the cost ledger reads the last row of each process)
        if self.step >= tc.total_steps:
            self.state.mark_trainer_finished()

    def _tally_batch(self, batch: list[Group]) -> None:
        """Token accounting for the cost ledger: trained, processed, and zero-signal groups — those the
        learner left out (generation cost only: never forwarded) and those it trained all the same."""
        split = Split.of(batch, self.cfg)
        self.own.empty_steps += not split.kept
        self.own.samples_trained += len(members(batch))  # every sample of the step: fate ``trained``
        for t in members(split.kept):
            self.own.tokens_trained += t.num_model_tokens()
            self.own.tokens_processed += len(t.token_ids())
        for group in split.left_out:
            model_tokens = sum(m.num_model_tokens() for m in group.members)
            self.own.zero_adv_samples += len(group.members)
            self.own.zero_adv_model_tokens += model_tokens
            self.own.zero_adv_skipped_samples += len(group.members)
            self.own.zero_adv_skipped_model_tokens += model_tokens
        for group in split.kept:
            rows = group.members
            if not differs(group):  # trained, advantage 0 everywhere
                self.own.zero_adv_samples += len(rows)
                self.own.zero_adv_tokens += sum(len(m.token_ids()) for m in rows)
                self.own.zero_adv_model_tokens += sum(m.num_model_tokens() for m in rows)
            else:  # disjoint from zero-advantage waste: early-terminated samples that did carry signal
                self.own.truncated_tokens += sum(
                    m.num_model_tokens()
                    for m in rows
                    if m.outcome in ("truncated", "timeout", "early_stopped")
                )

    def _report(self, metrics: dict[str, float], batch: list[Trajectory]) -> None:
        """One :class:`TrainerReport`: the learner's and the batch's figures, the trainer's own, the queue's."""
        own = self.own
        total = own.busy_seconds + own.idle_seconds
        own.step, own.version = float(self.step), float(self.version)
        own.buffer_size = float(len(self.buffer))
        own.busy_fraction = own.busy_seconds / total if total else 0.0
        waits = [t.lifecycle.dequeued - t.lifecycle.enqueued for t in batch if t.lifecycle.enqueued]
        wait = LifecycleFigures(queue_wait_mean_s=sum(waits) / len(waits) if waits else 0.0)
        lent = {"cores": self.lender.figures()} if self.lender is not None else {}
        report = TrainerReport.of_figures(
            metrics,
            trainer=own,
            lifecycle=wait,
            queue=self.queue.stats(),
            gap=self.learner.gap.figures(),
            **lent,
        )
        self.metrics.report(report, step=self.step)


def trainer_main(cfg_json: str, run_dir: str, resume: bool) -> None:
    """Process entry point (spawned by the launcher)."""
    started = time.time()  # the ledger counts this process's whole life, start-up included
    from asyncrl.bootstrap import init_role_process

    cfg = init_role_process(cfg_json, "trainer")
    TrainerRole(cfg, Path(run_dir), resume=resume, started=started).run()
