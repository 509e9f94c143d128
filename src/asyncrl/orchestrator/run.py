"""The orchestrator: prepares a run, launches and supervises the roles, keeps the flow healthy.

Per tick (every half second) it
1. merges the roles' metrics into ``metrics.jsonl``,
2. restarts any role process that died (a rollout worker's un-delivered admissions are returned
   to the budget; the trainer restarts from its last checkpoint),
3. applies the queue watermarks (pause admission at high water, resume at low water),
4. feeds the rules (:mod:`asyncrl.orchestrator.rules`: curriculum, circuit breakers, reward drift
   and hacking, exploration) and publishes their directives to the workers through the state store,
5. adapts the effective ``max_staleness`` (:mod:`asyncrl.orchestrator.governor`),
6. scales the rollout workers (:mod:`asyncrl.orchestrator.elastic`, when enabled),
   and watches for a stall (no new weight version and no new trajectory for
   ``orchestrator.watchdog_s``): a ``stall`` alert and a message saying what it last saw,
7. snapshots its own state into the store (restored by ``--resume``, see docs/orchestrator.md)
   and refreshes the live display (alerts included; they are also in ``alerts.jsonl``).

The run directory (``runs/{name}-{timestamp}/``) holds ``config.yaml`` (resolved),
``metrics.jsonl``, ``metrics/`` (per role), ``checkpoints/``, ``weights/`` (versions),
``queue.sqlite``, ``control.sqlite``, ``alerts.jsonl`` and, at the end, ``summary.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import RunConfig, dump_yaml
from asyncrl.control import RunState
from asyncrl.durable import replace_file
from asyncrl.errors import UserError
from asyncrl.launch import make_launcher
from asyncrl.lending import lending_plan, open_board
from asyncrl.orchestrator.alerts import Alert
from asyncrl.orchestrator.breaker import fault_line, fault_summary
from asyncrl.orchestrator.elastic import FlowSample
from asyncrl.orchestrator.governor import StalenessGovernor
from asyncrl.orchestrator.rules import Rules
from asyncrl.orchestrator.runctl import reap_orphans, start_ticks
from asyncrl.orchestrator.stopping import Stopped, StopSignals
from asyncrl.orchestrator.telemetry import EVALUATOR, TRAINER, Live, OrchestratorTelemetry
from asyncrl.rollout.evaluator import evaluator_main
from asyncrl.rollout.worker import worker_main
from asyncrl.telemetry.jsonl import MetricTail
from asyncrl.telemetry.reports import Decoded, TrainerReport, decode_rows
from asyncrl.transport import make_queue

log = logging.getLogger("asyncrl.orchestrator")

if TYPE_CHECKING:
    from rich.live import Live as RichLive
    from rich.table import Table

    from asyncrl.transport import TrajectoryQueue

ORCHESTRATOR = "orchestrator"


def new_run_dir(cfg: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(cfg.run_root) / f"{cfg.name}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = Path(cfg.run_root) / f"{cfg.name}-{stamp}-{n}"
    path.mkdir(parents=True)
    return path


class Orchestrator:
    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        display: bool = True,
        signals: StopSignals | None = None,
    ) -> None:
        self.cfg, self.run_dir, self.resume, self.display = cfg, run_dir, resume, display
        self.signals = signals or StopSignals()
        """Stop signals (:mod:`asyncrl.orchestrator.stopping`): the loop polls them; ``asyncrl stop`` too."""
        self.state = RunState.open(cfg, run_dir)
        sc = cfg.control.state
        if not resume and sc.kind == "redis" and self.state.holds_a_run():
            raise UserError(
                f"control.state.prefix {sc.prefix!r} already holds another run's state in Redis; "
                "use a new prefix per run (or unset it), or resume that run with asyncrl train --resume"
            )
        self.launcher = make_launcher(cfg.launcher, run_dir)
        self.staleness = self.state.staleness
        self.rules = Rules(cfg, run_dir)
        self.governor = StalenessGovernor(
            self.staleness.max_staleness, cfg.trainer.sync_every, cfg.orchestrator.governor
        )
        self.trainer_ranks = [TRAINER, *(f"{TRAINER}.{r}" for r in range(1, cfg.trainer.world_size))]
        """The trainer's processes: rank 0 is ``trainer`` (metrics, restarts), rank r ``trainer.r``."""
        self.workers = [f"rollout-{i}" for i in range(cfg.rollout.num_workers)]
        """Active rollout workers (elastic capacity changes this list)."""
        self.retiring: list[str] = []
        self.next_index = cfg.rollout.num_workers
        self._flow = (0.0, 0.0, 0.0, 0.0, 0.0)
        """(time, episodes, samples trained, trainer busy s, trainer idle s) at the last flow sample."""
        self._snapshot_at = self._metrics_at = 0.0
        self.tail = MetricTail(run_dir / "metrics")
        self.live = Live()
        self.restarts: dict[str, int] = {}
        self.lifetimes: dict[tuple[str, int], list[float]] = {}
        """(role, pid) -> [launched, ended]: the device time each role process held (cost ledger)."""
        self.started = time.time()
        self.rl_seconds = 0.0
        self._merged = (run_dir / "metrics.jsonl").open("a", buffering=1)
        self.telemetry = OrchestratorTelemetry(cfg, run_dir)
        self._queue: TrajectoryQueue | None = None  # opened on the first tick (_read_queue)
        self._progress: tuple[int, int] | None = None
        self._progress_at = self._stall_alerted = self._printed_at = time.time()

    # -- roles ---------------------------------------------------------------------------------------
    def _start(self, name: str, resume_trainer: bool = True) -> None:
        cfg_json = self.cfg.model_dump_json()
        if name == EVALUATOR:  # not a training device: no lifetime in the cost ledger
            self.launcher.start(name, evaluator_main, cfg_json, str(self.run_dir))
            self._write_pids()  # an orphaned evaluator is reaped by a resumed orchestrator like any role
            return
        if name == TRAINER:
            self._start_trainer(cfg_json, resume_trainer)
            return
        self.launcher.start(name, worker_main, cfg_json, str(self.run_dir), int(name.split("-")[1]))
        self._launched(name)

    def _launched(self, name: str) -> None:
        pid = self.launcher.pid(name)
        if pid is not None:  # every trainer rank holds a training device: all count as "trainer"
            self.lifetimes[(TRAINER if name in self.trainer_ranks else name, pid)] = [time.time(), 0.0]
        self._write_pids()

    def _start_trainer(self, cfg_json: str, resume: bool) -> None:
        """The trainer: one process, or a group of ``trainer.world_size`` ranks started together (a
        group is only ever restarted whole: whatever is left of the old one is stopped first)."""
        if len(self.trainer_ranks) == 1:
            from asyncrl.trainer.process import trainer_main

            self.launcher.start(TRAINER, trainer_main, cfg_json, str(self.run_dir), resume)
            self._launched(TRAINER)
            return
        from asyncrl.trainer.ranks import trainer_rank_main

        for name in self.trainer_ranks:
            if name in self.launcher.names():
                self.launcher.stop(name, timeout=0.0)
                self._ended(name)
        args = (cfg_json, str(self.run_dir), resume)
        self.launcher.start_group(self.trainer_ranks, trainer_rank_main, args, self.cfg.trainer.dist_port)
        for name in self.trainer_ranks:
            self._launched(name)

    def _write_pids(self) -> None:
        pids = {n: self.launcher.pid(n) for n in self.launcher.names()}
        started = {n: [p, start_ticks(p)] for n, p in pids.items() if p is not None}
        for name, doc in (("pids.json", pids), ("roles.json", started)):  # operators, fault tests; orphans
            replace_file(self.run_dir / name, json.dumps(doc).encode())

    def _ended(self, name: str) -> None:
        pid = self.launcher.pid(name)
        role = TRAINER if name in self.trainer_ranks else name
        life = self.lifetimes.get((role, pid)) if pid is not None else None
        if life is not None and not life[1]:
            life[1] = time.time()

    def _supervise(self) -> None:
        for name in self.launcher.names():
            code = self.launcher.exitcode(name)
            if code is None or self.state.trainer_finished():  # done: the loop is about to end
                continue
            if name in self.trainer_ranks[1:]:  # a lost rank is a lost trainer: the group restarts
                self._ended(name)
                self.live.events.append({"event": "role/restart", "role": name, "exitcode": code})
                name = TRAINER
            if name not in (TRAINER, EVALUATOR) and name not in self.workers:  # retired (elastic)
                if name in self.retiring:
                    self.retiring.remove(name)
                    self._ended(name)
                    self.state.reclaim(name)
                continue
            self.restarts[name] = self.restarts.get(name, 0) + 1
            self._ended(name)
            if name in self.workers:  # give back the admissions it will never deliver
                self.state.reclaim(name)
            self.live.events.append({"event": "role/restart", "role": name, "exitcode": code})
            self._start(name, resume_trainer=True)

    def env_faults(self) -> dict[str, float | str]:
        """The environment's fault, retry and timeout counts so far (display, summary, report)."""
        return fault_summary(
            self.rules.env_totals(), self.live.rollout().env_seconds, self.cfg.env.guard.step_timeout_s
        )

    # -- flow control --------------------------------------------------------------------------------
    def _read_queue(self) -> None:
        """The queue's figures, read once per tick through the orchestrator's own handle: the one source
        of queue depth for the watermarks, the governor, elastic scaling, the watchdog and the display."""
        if self._queue is None:
            self._queue = make_queue(self.cfg.transport, self.run_dir)
        self.live.queue = self._queue.stats()

    def _watermarks(self) -> None:
        # ready entries only: leased ones are already the trainer's (acknowledged once their fate is durable)
        oc, fill = self.cfg.orchestrator, self.live.fill(self.cfg.transport.capacity)
        if fill >= oc.high_watermark:
            self.state.set_paused(True)
        elif fill <= oc.low_watermark:
            self.state.set_paused(False)

    def _adapt_staleness(self, reports: list[Decoded]) -> None:
        """Rule 6 of the staleness rules (:class:`~asyncrl.orchestrator.governor.StalenessGovernor`): the
        ages are the mean age of every trained batch this tick (each trainer report's ``staleness.mean``)."""
        current, sync = self.state.effective_max_staleness(), self.state.effective_sync_every()
        for r in reports:
            if isinstance(r, TrainerReport) and r.staleness.mean is not None:
                self.governor.observe_age(r.staleness.mean)
        fill = self.live.fill(self.cfg.transport.capacity)
        current, sync, alerts = self.governor.step(current, sync, fill)
        self.rules.alerts.extend(alerts)
        self.state.set_effective(current, sync)

    def _watchdog(self) -> None:
        """No wait without a way out: alert when neither a version nor a trajectory moved for ``watchdog_s``."""
        limit, now = self.cfg.orchestrator.watchdog_s, time.time()
        if not limit:
            return
        qs = self.live.queue
        mark = (self.state.version(), int(qs.put_total))
        if mark != self._progress:
            self._progress, self._progress_at = mark, now
            return
        if now - self._progress_at < limit or now - self._stall_alerted < limit:
            return
        self._stall_alerted = now
        stalled = now - self._progress_at
        evidence = {
            "seconds": round(stalled, 1),
            "version": mark[0],
            "accepted": mark[1],
            "queue_depth": int(qs.depth),
            "queue_ready": int(qs.ready),
            "queue_capacity": int(qs.capacity),
            "fates": self.state.fate_counts(),
            "paused": self.state.paused(),
        }
        self.rules.alerts.emit(Alert("stall", "", evidence, "alerted (orchestrator.watchdog_s)"))
        message = (
            f"asyncrl: the run has not moved for {stalled:.0f} s (no new weight version since v{mark[0]}, no new "
            f"trajectory since {mark[1]} accepted; queue {evidence['queue_depth']}/{evidence['queue_capacity']}, "
            f"{evidence['queue_ready']} ready). See {self.run_dir / 'alerts.jsonl'} and the roles' logs."
        )
        log.warning(message)
        print(message, file=sys.stderr, flush=True)

    # -- rules, capacity, snapshots ------------------------------------------------------------------
    def _apply_rules(self, reports: list[Decoded]) -> None:
        self.rules.feed(reports)
        self.state.publish_directives(self.rules.directives(self.workers, self.retiring))

    def _scale(self) -> None:
        """Elastic capacity: one flow sample per metrics interval, at most one decision per cooldown."""
        now, r = time.time(), self.live.latest_trainer()
        if not self.cfg.orchestrator.elastic.enabled or now - self._flow[0] < self.cfg.telemetry.log_every_s:
            return
        t, prev = r.trainer, self._flow
        self._flow = (now, self.live.rollout().episodes, t.samples_trained, t.busy_seconds, t.idle_seconds)
        if not prev[0]:
            return
        dt, episodes, trained, busy, idle = (c - p for c, p in zip(self._flow, prev, strict=True))
        sample = FlowSample(
            production=episodes / max(dt, 1e-6),
            consumption=trained / max(dt, 1e-6),
            fill=self.live.fill(self.cfg.transport.capacity),
            busy=busy / (busy + idle) if busy + idle > 0 else 1.0,
            staleness=r.staleness.mean or 0.0,
            staleness_limit=float(self.staleness.max_staleness),
        )
        delta, alerts = self.rules.elastic.observe(sample, len(self.workers), now)
        self.rules.alerts.extend(alerts)
        if delta > 0:
            name = f"rollout-{self.next_index}"
            self.next_index += 1
            self.workers.append(name)
            self._start(name)
        elif delta < 0:
            name = self.workers.pop()  # the newest worker retires once its groups are delivered
            self.retiring.append(name)

    def state_doc(self) -> dict[str, object]:
        """Everything the orchestrator needs to continue after a crash (saved every snapshot_every_s)."""
        return {
            "rules": self.rules.snapshot(),
            "workers": list(self.workers),
            "retiring": list(self.retiring),
            "next_index": self.next_index,
            "restarts": dict(self.restarts),
            "tail": {str(p): o for p, o in self.tail._offsets.items()},
            "governor": {"ages": list(self.governor.ages), "fills": list(self.governor.fills)},
        }

    def restore(self, doc: dict[str, Any]) -> None:
        self.rules.restore(doc["rules"])
        self.workers, self.retiring = list(doc["workers"]), []
        self.next_index = int(doc["next_index"])
        self.restarts = {str(k): int(v) for k, v in doc["restarts"].items()}
        self.tail._offsets = {Path(p): int(o) for p, o in doc["tail"].items()}
        self.governor.ages.extend(doc["governor"]["ages"])
        self.governor.fills.extend(doc["governor"]["fills"])
        self.workers += list(doc["retiring"])  # a retiring worker died with us: start it again

    def _snapshot(self, force: bool = False) -> None:
        now = time.time()
        if force or now - self._snapshot_at >= self.cfg.control.state.snapshot_every_s:
            self.state.save_snapshot({**self.state_doc(), "saved_at": now})
            self._snapshot_at = now
        if force or now - self._metrics_at >= self.cfg.telemetry.log_every_s:
            row = {
                "time": now,
                "role": ORCHESTRATOR,
                **self.rules.metrics(now),
                "elastic/workers": float(len(self.workers)),
            }
            self._merged.write(json.dumps(row) + "\n")
            self._metrics_at = now

    # -- main ------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        (self.run_dir / "config.yaml").write_text(dump_yaml(self.cfg))
        self.state.begin(self.resume)
        open_board(self.run_dir, lending_plan(self.cfg))  # core lending: the roles read the plan
        if self.resume:
            saved = self.state.snapshot()
            if saved is not None:
                self.restore(saved)
            reap_orphans(self.run_dir, self.state)
        elif self.cfg.orchestrator.curriculum.start_from_eval:
            self._start_where_the_signal_is()

    def _start_where_the_signal_is(self) -> None:
        """Seed the curriculum with the initial evaluation's per-bucket success and say what it left out."""
        path = self.run_dir / "initial_eval.json"
        counts = json.loads(path.read_text()).get("per_bucket") if path.is_file() else None
        if not counts:
            return
        sc = self.cfg.orchestrator.signal
        band = (sc.band_low, sc.band_high)
        line = self.rules.curriculum.start({b: (int(k), int(n)) for b, (k, n) in counts.items()}, band)
        log.info(line)
        print(f"asyncrl: {line}", flush=True)

    def run(self) -> TrainerReport | None:
        """Start the roles and supervise them until the trainer finishes or a stop is asked for
        (:attr:`stopped_by`); then stop every role (:meth:`shutdown`)."""
        self.prepare()
        self.signals.arm()  # again: starting Ray replaces the SIGTERM handler with its own
        if not self.state.trainer_finished():  # a run stopped in its final evaluation has no role to start
            self._start(TRAINER, resume_trainer=self.resume)
            for name in self.workers:
                self._start(name)
            if self.cfg.telemetry.eval_every > 0:
                self._start(EVALUATOR)
        view = _live_view(self) if self.display else None
        try:
            with view or contextlib.nullcontext():
                while not self.state.trainer_finished() and not self._stop_asked():
                    self.state.beat()
                    time.sleep(0.5)
                    rows = self._merge_rows()
                    reports = decode_rows(rows)  # once per tick: everything below reads attributes
                    self.live.absorb(reports)
                    self._read_queue()
                    self.telemetry.tick(rows, self.state, self.live, self.restarts, self.started)
                    self._supervise()
                    self._watermarks()
                    self._apply_rules(reports)
                    if self.staleness.adapts:
                        self._adapt_staleness(reports)
                    self._scale()
                    self._watchdog()
                    self._snapshot()
                    if view:
                        view.update(_render(self))
                    else:
                        self._plain_progress()
        finally:
            self._snapshot(force=True)
            if self._queue is not None:
                self._queue.close()
            self.shutdown()
            self.rl_seconds = time.time() - self.started
        rows = self._merge_rows()  # the roles' last rows, written as they stopped
        self._merged.close()
        reports = decode_rows(rows)
        self.live.absorb(reports)
        self.rules.observe_env(reports)
        self.telemetry.close(rows)
        return self.live.trainer

    def _merge_rows(self) -> list[dict[str, Any]]:
        """The roles' new metric rows, appended to ``metrics.jsonl``."""
        rows = self.tail.poll()
        for r in rows:
            self._merged.write(json.dumps(r) + "\n")
        return rows

    def _plain_progress(self) -> None:
        """``--no-display``: one plain progress line every ``telemetry.progress_every_s``."""
        now = time.time()
        if now - self._printed_at < self.cfg.telemetry.progress_every_s:
            return
        self._printed_at, r = now, self.live.latest_trainer()
        print(
            f"[{now - self.started:5.0f}s] step {int(r.trainer.step)}/{self.cfg.trainer.total_steps}"
            f" version {int(r.trainer.version)} reward {r.reward.mean or 0:.3f}"
            f" success {r.reward.success_rate or 0:.1%}"
            f" episodes {int(self.live.rollout().episodes)} env: {fault_line(self.env_faults())}",
            flush=True,
        )

    @property
    def stopped_by(self) -> int | None:
        """The signal that stopped the run (SIGTERM for ``asyncrl stop``), or None."""
        return self.signals.signum

    def _stop_asked(self) -> bool:
        """A stop signal arrived, or ``asyncrl stop`` asked through the control state."""
        if self.signals.signum is None:
            halt, now = self.state.halt_requested()
            if halt:
                self.signals.request(signal.SIGTERM, force=now)
        return self.signals.signum is not None

    def shutdown(self) -> None:
        """Every role stops at its next safe point (the ``stop`` flag) within ``launcher.stop_grace_s``
        (the evaluator within 2 s: an evaluation is not worth waiting for); then, or at a second
        signal, what is left is killed."""
        self.state.request_stop()
        deadline = time.monotonic() + self.cfg.launcher.stop_grace_s
        try:
            for name in self.launcher.names():
                wait = max(0.0, deadline - time.monotonic())
                self.launcher.stop(
                    name,
                    timeout=0.0 if self.signals.forced else min(wait, 2.0) if name == EVALUATOR else wait,
                )
                self._ended(name)
        except Stopped:  # a second signal: no more grace
            log.warning("second stop signal: killing the roles now")
            for name in self.launcher.names():
                self.launcher.stop(name, timeout=0.0)
                self._ended(name)
        self.launcher.close()


def _live_view(orch: Orchestrator) -> RichLive:
    """The live display (``--no-display`` turns it off), refreshed every tick with :func:`_render`."""
    from rich.live import Live as RichLive

    return RichLive(_render(orch), refresh_per_second=2, transient=False)


def _render(o: Orchestrator) -> Table:
    from rich.table import Table

    t = o.live.latest_trainer()
    total = o.cfg.trainer.total_steps
    step = int(t.trainer.step)
    elapsed = time.time() - o.started
    eta = (elapsed / step * (total - step)) if step else float("nan")
    rollout, ev = o.live.rollout(), o.live.evaluation
    table = Table(title=f"asyncrl {o.cfg.control.mode} — {o.run_dir}", show_header=False, expand=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    cost: list[tuple[str, str]] = []
    if o.cfg.cost.enabled:
        c = o.live.cost(o.cfg, elapsed)
        cost = [
            ("cost: rate / so far", f"${c.efficiency['cost_rate_usd_per_hour']:.3f}/h / ${c.total:.4f}"),
            ("cost: wasted", f"{c.waste_total / c.total:.0%}" if c.total else "-"),
        ]
    r = o.rules
    top = sorted(r.curriculum.weights().items(), key=lambda kv: -kv[1])[:4]
    rows = [
        ("version / step", f"{int(t.trainer.version)} / {step} of {total}"),
        ("samples/s (rollout)", f"{rollout.episodes / elapsed:.1f}" if elapsed else "-"),
        ("tokens/s (rollout)", f"{rollout.tokens / elapsed:.0f}" if elapsed else "-"),
        ("queue depth", f"{int(o.live.queue.depth)}" + (" (paused)" if o.state.paused() else "")),
        ("staleness mean / max", f"{t.staleness.mean or 0:.2f} / {int(t.staleness.max or 0)}"),
        ("reward (train batch)", f"{t.reward.mean or 0:.3f}"),
        ("success (train batch)", f"{t.reward.success_rate or 0:.1%}"),
        ("trainer busy", f"{t.trainer.busy_fraction:.0%}"),
        (
            "held-out success (periodic)",
            f"{ev.eval.success_rate:.1%} at v{int(ev.eval.version)}" if ev else "-",
        ),
        ("elapsed / ETA", f"{elapsed:.0f}s / {eta:.0f}s" if step else f"{elapsed:.0f}s / -"),
        ("restarts", ", ".join(f"{k}×{v}" for k, v in o.restarts.items()) or "none"),
        *cost,
        ("workers", f"{len(o.workers)}" + (f" (retiring {', '.join(o.retiring)})" if o.retiring else "")),
        ("breakers open", ", ".join(r.breakers.buckets_in("open")) or "none"),
        (f"env faults ({o.cfg.env.path or o.cfg.env.kind})", fault_line(o.env_faults())),
        ("curriculum (top)", ", ".join(f"{b}={w:.2f}" for b, w in top) or "-"),
        *(
            (
                f"alert {time.strftime('%H:%M:%S', time.localtime(a.time))}",
                f"{a.kind} {a.bucket} → {a.action}",
            )
            for a in list(r.alerts.recent)[-3:]
        ),
    ]
    for k, v in rows:
        table.add_row(k, v)
    return table
