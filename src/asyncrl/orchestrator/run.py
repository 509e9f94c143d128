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

import json
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import RunConfig, dump_yaml, load_config
from asyncrl.control import RunState
from asyncrl.cost.ledger import read_reports
from asyncrl.credentials import check_connections
from asyncrl.errors import UserError
from asyncrl.launch import make_launcher
from asyncrl.orchestrator.alerts import Alert
from asyncrl.orchestrator.breaker import fault_line, fault_summary
from asyncrl.orchestrator.elastic import FlowSample
from asyncrl.orchestrator.governor import StalenessGovernor
from asyncrl.orchestrator.rules import Rules
from asyncrl.orchestrator.telemetry import EVALUATOR, TRAINER, Live, OrchestratorTelemetry
from asyncrl.policy.memory import release_memory, set_mmap_threshold
from asyncrl.telemetry.jsonl import MetricTail, memory
from asyncrl.telemetry.reports import Decoded, Report, TrainerReport, WorkerReport, decode_rows
from asyncrl.telemetry.signal import signal_summary
from asyncrl.transport import make_queue

log = logging.getLogger("asyncrl.orchestrator")

if TYPE_CHECKING:
    from asyncrl.policy.preflight import ModelPlan
    from asyncrl.transport import TrajectoryQueue

ORCHESTRATOR = "orchestrator"
CONTEXT_PROBE_TASKS = 4  # held-out and training tasks each whose episode openings the preflight renders


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
    def __init__(self, cfg: RunConfig, run_dir: Path, *, resume: bool = False, display: bool = True) -> None:

        self.cfg, self.run_dir, self.resume, self.display = cfg, run_dir, resume, display
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
        self._flow: dict[str, float] = {}
        self._snapshot_at = self._metrics_at = 0.0
        self._progress_at = time.time()
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
        self._progress_at = self._stall_alerted = time.time()

    # -- roles ---------------------------------------------------------------------------------------
    def _start(self, name: str, resume_trainer: bool = True) -> None:
        from asyncrl.rollout.worker import worker_main

        cfg_json = self.cfg.model_dump_json()
        if name == EVALUATOR:  # not a training device: no lifetime in the cost ledger
            from asyncrl.rollout.evaluator import evaluator_main

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
        started = {n: [p, _start_ticks(p)] for n, p in pids.items() if p is not None}
        # replaced whole (temp file + rename): a reader never sees a half-written file
        for name, doc in (("pids.json", pids), ("roles.json", started)):  # operators, fault tests; orphans
            tmp = self.run_dir / f".{name}.tmp"
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self.run_dir / name)

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

    def env_faults(self) -> dict[str, Any]:
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
        now, t = time.time(), self.live.latest_trainer().trainer
        if (
            not self.cfg.orchestrator.elastic.enabled
            or now - self._flow.get("at", 0.0) < self.cfg.telemetry.log_every_s
        ):
            return
        cur = {
            "at": now,
            "episodes": self.live.rollout().episodes,
            "trained": t.samples_trained,
            "busy": t.busy_seconds,
            "idle": t.idle_seconds,
        }
        prev, self._flow = self._flow, cur
        if not prev:
            return
        dt = max(cur["at"] - prev["at"], 1e-6)
        spent = (cur["busy"] - prev["busy"]) + (cur["idle"] - prev["idle"])
        sample = FlowSample(
            production=(cur["episodes"] - prev["episodes"]) / dt,
            consumption=(cur["trained"] - prev["trained"]) / dt,
            fill=self.live.fill(self.cfg.transport.capacity),
            busy=(cur["busy"] - prev["busy"]) / spent if spent > 0 else 1.0,
            staleness=self.live.latest_trainer().staleness.mean or 0.0,
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

    def state_doc(self) -> dict[str, Any]:
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

    def _reap_orphans(self) -> None:
        """After a crash of the orchestrator itself its role processes live on: stop them (SIGKILL,
        as if they had crashed with it) and give their admissions back before starting new ones."""
        roles_file = self.run_dir / "roles.json"
        roles = json.loads(roles_file.read_text()) if roles_file.is_file() else {}
        for pid, ticks in roles.values():
            # the same pid AND the same start time: our process, not a later one that reused the pid
            if pid != os.getpid() and ticks is not None and _start_ticks(pid) == ticks:
                os.kill(int(pid), signal.SIGKILL)
                end = time.time() + 5.0
                while _start_ticks(pid) == ticks and time.time() < end and not _zombie(pid):
                    time.sleep(0.05)
        for name in self.state.workers_in_flight():
            self.state.reclaim(name)

    # -- main ------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        from asyncrl.control.lending import lending_plan, open_board

        (self.run_dir / "config.yaml").write_text(dump_yaml(self.cfg))
        self.state.begin(self.resume)
        open_board(self.run_dir, lending_plan(self.cfg))  # core lending: the roles read the plan
        if self.resume:
            saved = self.state.snapshot()
            if saved is not None:
                self.restore(saved)
            self._reap_orphans()

    def run(self) -> TrainerReport | None:
        self.prepare()
        self._start(TRAINER, resume_trainer=self.resume)
        for name in self.workers:
            self._start(name)
        if self.cfg.telemetry.eval_every > 0:
            self._start(EVALUATOR)
        view = _Display(self) if self.display else None
        try:
            with view.live() if view else _null():
                while not self.state.trainer_finished():
                    time.sleep(0.5)
                    rows = self.tail.poll()
                    for r in rows:
                        self._merged.write(json.dumps(r) + "\n")
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
                        view.refresh()
                    else:
                        self._plain_progress()
        finally:
            self._snapshot(force=True)
            if self._queue is not None:
                self._queue.close()
            self.shutdown()
            self.rl_seconds = time.time() - self.started
        rows = self.tail.poll()  # the roles' last rows, written as they stopped
        for r in rows:
            self._merged.write(json.dumps(r) + "\n")
        self._merged.close()
        reports = decode_rows(rows)
        self.live.absorb(reports)
        self.rules.observe_env(reports)
        self.telemetry.close(rows)
        return self.live.trainer

    def _plain_progress(self) -> None:
        """``--no-display``: one plain progress line every ``telemetry.progress_every_s``."""
        now = time.time()
        if now - self._progress_at < self.cfg.telemetry.progress_every_s:
            return
        self._progress_at, r = now, self.live.latest_trainer()
        print(
            f"[{now - self.started:5.0f}s] step {int(r.trainer.step)}/{self.cfg.trainer.total_steps}"
            f" version {int(r.trainer.version)} reward {r.reward.mean or 0:.3f}"
            f" success {r.reward.success_rate or 0:.1%}"
            f" episodes {int(self.live.rollout().episodes)} env: {fault_line(self.env_faults())}",
            flush=True,
        )

    def shutdown(self) -> None:
        self.state.request_stop()
        for name in self.launcher.names():
            self.launcher.stop(name, timeout=2.0 if name == EVALUATOR else 20.0)
            self._ended(name)
        self.launcher.close()


def _start_ticks(pid: int) -> int | None:
    """A process's start time (clock ticks since boot, /proc/PID/stat field 22); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _Display:
    def __init__(self, orch: Orchestrator) -> None:
        from rich.console import Console

        self.orch = orch
        self.console = Console()
        self._live: Any = None

    def live(self) -> Any:
        from rich.live import Live as RichLive

        self._live = RichLive(self.render(), console=self.console, refresh_per_second=2, transient=False)
        return self._live

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self.render())

    def render(self) -> Any:
        from rich.table import Table

        o, t = self.orch, self.orch.live.latest_trainer()
        total = o.cfg.trainer.total_steps
        step = int(t.trainer.step)
        elapsed = time.time() - o.started
        eta = (elapsed / step * (total - step)) if step else float("nan")
        rollout, ev = o.live.rollout(), o.live.evaluation
        table = Table(title=f"asyncrl {o.cfg.control.mode} — {o.run_dir}", show_header=False, expand=False)
        table.add_column(style="bold")
        table.add_column(justify="right")
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
        ]
        if o.cfg.cost.enabled:
            c = o.live.cost(o.cfg, elapsed)
            rows.append(
                ("cost: rate / so far", f"${c.efficiency['cost_rate_usd_per_hour']:.3f}/h / ${c.total:.4f}")
            )
            rows.append(("cost: wasted", f"{c.waste_total / c.total:.0%}" if c.total else "-"))
        r = o.rules
        rows.append(
            ("workers", f"{len(o.workers)}" + (f" (retiring {', '.join(o.retiring)})" if o.retiring else ""))
        )
        rows.append(("breakers open", ", ".join(r.breakers.buckets_in("open")) or "none"))
        rows.append((f"env faults ({o.cfg.env.path or o.cfg.env.kind})", fault_line(o.env_faults())))
        top = sorted(r.curriculum.weights().items(), key=lambda kv: -kv[1])[:4]
        rows.append(("curriculum (top)", ", ".join(f"{b}={w:.2f}" for b, w in top) or "-"))
        for a in list(r.alerts.recent)[-3:]:
            rows.append(
                (
                    f"alert {time.strftime('%H:%M:%S', time.localtime(a.time))}",
                    f"{a.kind} {a.bucket} → {a.action}",
                )
            )
        for k, v in rows:
            table.add_row(k, v)
        return table


# ----------------------------------------------------------------------------------------------------
def train(
    cfg: RunConfig,
    *,
    resume: str | Path | None = None,
    display: bool = True,
    eval_limit: int | None = None,
    run_dir: str | Path | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Run the whole job: warm start, initial eval, async RL, final eval, ``summary.json``.

    ``run_dir``: use this (new or empty) directory instead of a fresh ``{run_root}/{name}-{time}``.
    """
    from asyncrl.telemetry.experiment import finish_run_record

    t0 = time.time()
    if cfg.rollout.engine.kind == "vllm":  # optional backend: fail before the warm start, not after
        from asyncrl.engine.vllm_backend import preflight

        preflight(cfg)
    if resume is not None:
        cfg, run_dir, prior = _resumed(Path(resume))
    else:
        run_dir, prior = _fresh(cfg, run_dir, display, eval_limit)
    orch = Orchestrator(cfg, run_dir, resume=resume is not None, display=display)
    last = orch.run()
    final = _final_eval(cfg, run_dir, eval_limit)
    summary = _summary(
        cfg, run_dir, orch, last, prior, final, time.time() - t0, make_queue(cfg.transport, run_dir)
    )
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    finish_run_record(run_dir, summary)
    return run_dir, summary


def _resumed(run_dir: Path) -> tuple[RunConfig, Path, dict[str, Any]]:
    """``--resume``: the run's own config, and its initial evaluation."""
    from asyncrl.telemetry.experiment import write_run_record

    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"--resume {str(run_dir)!r}: not a run directory (no config.yaml)")
    cfg = load_config(run_dir / "config.yaml")
    check_connections(cfg)  # bad Redis settings fail here, before any work
    prior = json.loads((run_dir / "initial_eval.json").read_text())
    write_run_record(cfg, run_dir, resumed=True)
    return cfg, run_dir, prior


def _fresh(
    cfg: RunConfig, run_dir: str | Path | None, display: bool, eval_limit: int | None
) -> tuple[Path, dict[str, Any]]:
    """A new run: preflight, run directory, warm start, version 0 published, initial evaluation."""
    from asyncrl.policy import Policy, resolve_device
    from asyncrl.policy.preflight import preflight_model
    from asyncrl.rollout.heldout import evaluate_policy
    from asyncrl.telemetry.experiment import write_run_record
    from asyncrl.trainer.sft import warm_start
    from asyncrl.weights import make_weight_store, publish_policy

    check_connections(cfg)
    resolve_device(cfg.model.device)  # a GPU that is not there fails here, before the warm start
    plan = preflight_model(cfg.model)  # a model directory asyncrl cannot run fails here,
    if plan is not None and cfg.rollout.tree.enabled and plan.renderer.multi_turn == "per_turn":
        raise UserError(
            "rollout.tree replays an episode's turns into one trajectory; model.multi_turn is per_turn "
            "for this template (set model.multi_turn: bridge, or rollout.tree.enabled: false)"
        )
    _check_env(cfg, plan)  # so do a bad env.path or option and a context too small for a turn
    fresh = run_dir is None or not Path(run_dir).exists()
    run_dir = Path(run_dir) if run_dir is not None else new_run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        write_run_record(cfg, run_dir)
        set_mmap_threshold(cfg.launcher.malloc_mmap_threshold_kb)  # this process trains the warm start
        ws = warm_start(
            cfg, progress=display or cfg.telemetry.progress_every_s, eval_limit=eval_limit
        )  # plain lines without it
        shutil.copytree(ws.path, run_dir / "initial_policy")
        policy = Policy.load(run_dir / "initial_policy", cfg=cfg.model).to(cfg.model.device)
        store = make_weight_store(cfg.weights, run_dir)
        publish_policy(store, 0, policy, step=0, canary=cfg.weights.canary)
        # a warm start trained just now was evaluated with this very call (same limit, same
        # seed) on the weights it saved: reuse it rather than play the held-out set twice
        prior = ws.report if not ws.cached else evaluate_policy(cfg, policy, limit=eval_limit, seed=cfg.seed)
        (run_dir / "initial_eval.json").write_text(json.dumps(prior, indent=2))
        del policy, ws
        release_memory()  # the warm start's peak is not this supervisor's to keep for the run
    except BaseException:
        if fresh:  # nothing ran yet: leave no half-made run directory behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_dir, prior


def _final_eval(cfg: RunConfig, run_dir: Path, eval_limit: int | None) -> dict[str, Any]:
    """Held-out evaluation of the newest valid weights, written to ``final_eval.json``."""
    from asyncrl.policy import Policy
    from asyncrl.rollout.heldout import evaluate_policy
    from asyncrl.weights import make_weight_store

    store = make_weight_store(cfg.weights, run_dir)
    loaded = store.load_latest()
    policy = Policy.load(run_dir / "initial_policy", cfg=cfg.model).to(cfg.model.device)
    if loaded is not None:
        policy.load_tensors(loaded.tensors)
    final = evaluate_policy(cfg, policy, limit=eval_limit, seed=cfg.seed)
    (run_dir / "final_eval.json").write_text(json.dumps(final, indent=2))
    return final


def _check_env(cfg: RunConfig, plan: ModelPlan | None) -> None:
    """Build the environment and its task source once: a wrong ``env.path`` or option, or a held-out
    split smaller than ``env.heldout_size``, raises its :class:`~asyncrl.envs.EnvPluginError` (a user
    error) now. With a pretrained model's ``plan``, also render the opening of a few episodes
    (held-out and training tasks) and check that the context holds the longest one plus a whole
    model turn (``rollout.sampling.max_new_tokens``)."""
    import asyncio
    import random

    from asyncrl.envs import call_env, check_heldout, close_env, make_raw_env, make_task_source

    source = make_task_source(cfg.env)
    check_heldout(source, cfg.env)
    env = make_raw_env(cfg.env)
    if plan is None or cfg.env.kind == "agent":  # an agent's prompts are its own: the gateway checks them
        asyncio.run(close_env(env))
        return
    rng = random.Random(cfg.seed)
    tasks = list(source.heldout())[:CONTEXT_PROBE_TASKS] + [
        source.sample(rng) for _ in range(CONTEXT_PROBE_TASKS)
    ]

    async def openings() -> list[tuple[int, str]]:
        tools, out = list(getattr(env, "tools", None) or []), []
        try:
            for t in tasks:
                try:
                    prompt = str(await call_env(env.reset, t))
                except Exception:  # a reset that fails is the run's env_error to count, not a preflight's
                    continue
                out.append((len(plan.renderer.start(prompt, tools).ids), t.id))
            return out or [(0, "")]
        finally:
            await close_env(env)

    longest, task_id = max(asyncio.run(openings()))
    turn = cfg.rollout.sampling.max_new_tokens
    if longest + turn > plan.context:
        limit = "model.max_context" if cfg.model.max_context is not None else "the model's own context"
        raise UserError(
            f"{limit} ({plan.context} tokens) leaves {max(plan.context - longest, 0)} tokens after the "
            f"longest episode opening ({longest} tokens: system text, tools and the prompt of task "
            f"{task_id}), less than one model turn (rollout.sampling.max_new_tokens={turn}): set "
            f"model.max_context to at least {longest + turn} or lower rollout.sampling.max_new_tokens"
        )


def _peak_memory(run_dir: Path) -> dict[str, float]:
    """Peak resident memory (MB) per role, from the ``mem/peak_rss_mb`` of its metric rows (the
    highest over restarts), and of this launcher process (warm start and evaluations)."""
    peaks: dict[str, float] = {}
    for r in read_reports(run_dir):
        if isinstance(r, Report) and r.mem is not None:
            peaks[r.role] = max(peaks.get(r.role, 0.0), r.mem.peak_rss_mb)
    peaks["launcher"] = memory().peak_rss_mb
    return dict(sorted(peaks.items()))


def _token_exactness(orch: Orchestrator) -> dict[str, Any]:
    """Token-exactness of the run's samples (see :func:`asyncrl.rollout.heldout.retokenization_stats`)."""
    w = orch.live.rollout()
    checked = int(w.token_exact_checked)

    def share_exact(inexact: float) -> float | None:
        return (1.0 - inexact / checked) if checked else None

    return {
        "token_exact_checked": checked,
        "token_exact_rate": share_exact(w.token_inexact),
        "retokenization_exact_rate": share_exact(w.retokenization_inexact),
        "retokenization_diff_tokens": int(w.retokenization_diff_tokens),
    }


def _canary(orch: Orchestrator) -> dict[str, int]:
    """The weight-sync canary over the run: loads checked, versions refused, loads that could not be checked."""
    c = orch.live.canary()
    return {
        "checked": int(c.canary_checked),
        "failed": int(c.canary_failed),
        "unverified": int(c.canary_unverified),
        "alerts": orch.rules.alerts.counts.get("weight_canary", 0),
    }


def _cost(cfg: RunConfig, run_dir: Path, orch: Orchestrator, gain: float) -> dict[str, Any]:
    """The run's cost ledger from every role's reports (``cost.json``), reconciled with the wall time."""
    from asyncrl.cost.ledger import collect_usage, price, stored_bytes

    lifetimes = {k: (end or time.time()) - start for k, (start, end) in orch.lifetimes.items()}
    usage = collect_usage(
        read_reports(run_dir),
        wall_seconds=orch.rl_seconds,
        stored_bytes=stored_bytes(run_dir),
        lifetimes=lifetimes,
    )
    cost = price(usage, cfg.cost, success_gain_points=gain).to_dict()
    cost["reconciliation"] = {
        "device_seconds": usage.device_seconds,
        "wall_x_devices": orch.rl_seconds * usage.devices,
        "ratio": usage.device_seconds / (orch.rl_seconds * usage.devices) if usage.devices else 0.0,
    }
    (run_dir / "cost.json").write_text(json.dumps(cost, indent=2))
    return cost


def _lending(orch: Orchestrator) -> dict[str, Any]:
    """Core lending over the run (:mod:`asyncrl.control.lending`): thread-seconds each role borrowed
    from a waiting one (the ``cores`` section of the roles' latest reports)."""
    reports: dict[str, WorkerReport | TrainerReport] = {**orch.live.workers}
    if orch.live.trainer is not None:
        reports[TRAINER] = orch.live.trainer
    by_role = {name: round(r.cores.borrowed_thread_seconds, 1) for name, r in reports.items() if r.cores}
    return {"threads_lent_seconds": round(sum(by_role.values()), 1), "threads_borrowed_by": by_role}


def _summary(
    cfg: RunConfig,
    run_dir: Path,
    orch: Orchestrator,
    last: TrainerReport | None,
    prior: dict[str, Any],
    final: dict[str, Any],
    wall: float,
    queue: TrajectoryQueue,
) -> dict[str, Any]:
    """``summary.json``; the queue's accounting is read from ``queue`` after the roles stopped (final)."""
    state = orch.state
    faults = orch.env_faults()
    fates = state.fate_counts()
    ages = state.trained_ages()
    tallies = state.tallies()
    hist: dict[str, int] = {}
    for a in ages:
        hist[str(a)] = hist.get(str(a), 0) + 1
    qs = queue.stats()
    accepted = int(qs.put_total)
    leftover = int(qs.depth)
    consumed = sum(fates.values())
    queue.close()
    gain = (final["success_rate"] - prior["success_rate"]) * 100
    cost = _cost(cfg, run_dir, orch, gain) if cfg.cost.enabled else {}
    return {
        "mode": cfg.control.mode,
        "initial_success": prior["success_rate"],
        "final_success": final["success_rate"],
        "samples_trained": fates.get("trained", 0),
        "samples_dropped_stale": fates.get("dropped_stale", 0),
        "samples_dropped_other": sum(v for k, v in fates.items() if k not in ("trained", "dropped_stale")),
        "samples_left_in_queue": leftover,
        "samples_accepted": accepted,
        "samples_admitted": tallies.admitted,
        # accepted by put = consumed (ledger) + still queued + dead-lettered; dead letters of bytes written into
        # the queue from outside were never accepted, so they are not subtracted
        "lost_trajectories": accepted
        - consumed
        - leftover
        - (int(qs.dead_letters) - int(qs.dead_letters_foreign)),
        "duplicates_recorded": tallies.duplicates,
        "staleness_mean": sum(ages) / len(ages) if ages else 0.0,
        "staleness_max": max(ages) if ages else 0,
        "staleness_hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "trainer_busy_fraction": last.trainer.busy_fraction if last else 0.0,
        "wall_seconds": wall,
        "rl_seconds": orch.rl_seconds,
        "versions_published": tallies.versions_published,
        "last_version": tallies.last_published,
        "trainer_steps": int(last.trainer.step) if last else 0,
        "restarts": orch.restarts,
        "dead_letters": int(qs.dead_letters),
        "dead_letters_foreign": int(qs.dead_letters_foreign),
        "run_dir": str(run_dir),
        "cost_usd": cost.get("total_usd"),
        "cost_waste_share": cost.get("waste_total_share"),
        "cost_usd_per_trained_sample": (cost.get("efficiency") or {}).get("usd_per_trained_sample"),
        **_token_exactness(orch),
        "weights_canary": _canary(orch),
        **_lending(orch),
        "peak_rss_mb": _peak_memory(run_dir),
        "env_faults": {cfg.env.path or cfg.env.kind: faults},
        "signal": signal_summary(read_reports(run_dir), cfg),
        "notes": [faults["note"]] if faults["note"] else [],
    }
