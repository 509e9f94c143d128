"""The orchestrator: prepares a run, launches and supervises the roles, keeps the flow healthy.

Per tick (every half second) it
1. restarts any role process that died (a rollout worker's un-delivered admissions are returned
   to the budget; the trainer restarts from its last checkpoint),
2. applies the queue watermarks (pause admission at high water, resume at low water),
3. adapts the effective ``max_staleness`` (tighter while the trained samples' mean age stays
   above the configured limit, relaxed back when it recovers),
4. merges the roles' metrics into ``metrics.jsonl`` and refreshes the live display.

The run directory (``runs/{name}-{timestamp}/``) holds ``config.yaml`` (resolved),
``metrics.jsonl``, ``metrics/`` (per role), ``checkpoints/``, ``weights/`` (versions),
``queue.sqlite``, ``control.sqlite`` and, at the end, ``summary.json``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.config import RunConfig, dump_yaml, load_config
from asyncrl.errors import UserError
from asyncrl.orchestrator.staleness import StalenessPolicy
from asyncrl.orchestrator.state import ControlState
from asyncrl.telemetry.jsonl import MetricTail
from asyncrl.telemetry.orchestrator import OrchestratorTelemetry

TRAINER = "trainer"
EVALUATOR = "evaluator"


@dataclass
class Live:
    """The latest figures of every role, for the display and the summary."""

    trainer: dict[str, Any] = field(default_factory=dict)
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    ages: deque[float] = field(default_factory=lambda: deque(maxlen=5))
    per_process: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    evaluation: dict[str, Any] = field(default_factory=dict)
    """The evaluator's latest row (periodic held-out evaluation)."""

    def absorb(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            if "pid" in r and "event" not in r:
                self.per_process[(str(r["role"]), int(r["pid"]))] = r
            if "event" in r:
                self.events.append(r)
            elif r.get("role") == TRAINER:
                self.trainer = r
                if r.get("staleness/mean") is not None:
                    self.ages.append(float(r["staleness/mean"]))
            elif str(r.get("role", "")).startswith("rollout"):
                self.workers[str(r.get("role"))] = r
            elif r.get("role") == EVALUATOR:
                self.evaluation = r

    def cost(self, cfg: RunConfig, wall_seconds: float) -> Any:
        from asyncrl.cost.ledger import collect_usage, price

        return price(collect_usage(list(self.per_process.values()), wall_seconds=wall_seconds), cfg.cost)

    def total(self, key: str) -> float:
        return sum(float(w.get(key) or 0.0) for w in self.workers.values())


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
        from asyncrl.launch.local import make_launcher

        self.cfg, self.run_dir, self.resume, self.display = cfg, run_dir, resume, display
        self.state = ControlState(run_dir / "control.sqlite")
        self.launcher = make_launcher(cfg.launcher)
        self.staleness = StalenessPolicy.of(cfg)
        self.tail = MetricTail(run_dir / "metrics")
        self.live = Live()
        self.restarts: dict[str, int] = {}
        self.fills: deque[float] = deque(maxlen=10)
        self.lifetimes: dict[tuple[str, int], list[float]] = {}
        """(role, pid) -> [launched, ended]: the device time each role process held (cost ledger)."""
        self.started = time.time()
        self.rl_seconds = 0.0
        self._merged = (run_dir / "metrics.jsonl").open("a", buffering=1)
        self.telemetry = OrchestratorTelemetry(cfg, run_dir)

    # -- roles ---------------------------------------------------------------------------------------
    def _start(self, name: str, resume_trainer: bool = True) -> None:
        from asyncrl.rollout.worker import worker_main
        from asyncrl.trainer.process import trainer_main

        cfg_json = self.cfg.model_dump_json()
        if name == EVALUATOR:  # not a training device: no lifetime in the cost ledger
            from asyncrl.rollout.evaluator import evaluator_main

            self.launcher.start(name, evaluator_main, cfg_json, str(self.run_dir))
            return
        if name == TRAINER:
            self.launcher.start(name, trainer_main, cfg_json, str(self.run_dir), resume_trainer)
        else:
            self.launcher.start(name, worker_main, cfg_json, str(self.run_dir), int(name.split("-")[1]))
        pid = self.launcher.pid(name)
        if pid is not None:
            self.lifetimes[(name, pid)] = [time.time(), 0.0]
        pids = {n: self.launcher.pid(n) for n in self.launcher.names()}
        (self.run_dir / "pids.json").write_text(json.dumps(pids))  # for operators (and fault tests)

    def _ended(self, name: str) -> None:
        pid = self.launcher.pid(name)
        life = self.lifetimes.get((name, pid)) if pid is not None else None
        if life is not None and not life[1]:
            life[1] = time.time()

    def _supervise(self) -> None:
        for name in self.launcher.names():
            code = self.launcher.exitcode(name)
            if code is None or self.state.flag("trainer_done"):  # done: the loop is about to end
                continue
            self.restarts[name] = self.restarts.get(name, 0) + 1
            self._ended(name)
            if name != TRAINER:  # give back the admissions it will never deliver
                lost = self.state.get(f"inflight:{name}")
                if lost:
                    self.state.add("released", lost)
                    self.state.set_value(f"inflight:{name}", 0)
            self.live.events.append({"event": "role/restart", "role": name, "exitcode": code})
            self._start(name, resume_trainer=True)

    # -- flow control --------------------------------------------------------------------------------
    def _watermarks(self) -> None:
        # ready entries only: leased ones are already the trainer's (acknowledged at its next checkpoint)
        oc, depth = self.cfg.orchestrator, float(self.live.trainer.get("queue/ready") or 0.0)
        fill = depth / self.cfg.transport.capacity
        if fill >= oc.high_watermark and not self.state.flag("paused"):
            self.state.set_flag("paused", True)
        elif fill <= oc.low_watermark and self.state.flag("paused"):
            self.state.set_flag("paused", False)

    def _adapt_staleness(self) -> None:
        """The seed documents' rules: off-policy degree above its limit → tighter lag and faster sync;
        queue utilisation below 30% → faster sync; both relax back to the configured values."""
        configured, configured_sync = self.staleness.max_staleness, self.cfg.trainer.sync_every
        current = self.state.get("max_staleness", configured)
        sync = self.state.get("sync_every", configured_sync)
        ages = self.live.ages
        fill = float(self.live.trainer.get("queue/ready") or 0.0) / self.cfg.transport.capacity
        self.fills.append(fill)
        if len(ages) == ages.maxlen and min(ages) > configured and current > 0:
            current, sync = current - 1, max(1, sync - 1)  # runaway: tighten and sync faster
            ages.clear()
        elif ages and max(ages) <= configured / 2 and current < configured:
            current = current + 1  # recovered: relax
        if len(self.fills) == self.fills.maxlen and max(self.fills) < 0.3:
            sync = max(1, sync - 1)  # under-used queue: sync faster
            self.fills.clear()
        elif len(self.fills) == self.fills.maxlen and min(self.fills) >= 0.3 and sync < configured_sync:
            sync += 1
        sync = min(sync, current + 1)  # samples of one version are trained at most sync_every - 1 steps later
        self.state.set_value("max_staleness", current)
        self.state.set_value("sync_every", sync)

    # -- main ------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        (self.run_dir / "config.yaml").write_text(dump_yaml(self.cfg))
        self.state.set_flag("stop", False)
        if self.resume:
            return
        self.state.set_value("max_staleness", self.staleness.max_staleness)
        self.state.set_value("version", 0)

    def run(self) -> dict[str, Any]:
        self.prepare()
        self._start(TRAINER, resume_trainer=self.resume)
        for i in range(self.cfg.rollout.num_workers):
            self._start(f"rollout-{i}")
        if self.cfg.telemetry.eval_every > 0:
            self._start(EVALUATOR)
        view = _Display(self) if self.display else None
        try:
            with view.live() if view else _null():
                while not self.state.flag("trainer_done"):
                    time.sleep(0.5)
                    rows = self.tail.poll()
                    for r in rows:
                        self._merged.write(json.dumps(r) + "\n")
                    self.live.absorb(rows)
                    self.telemetry.tick(self, rows)
                    self._supervise()
                    self._watermarks()
                    if self.cfg.orchestrator.mode == "async":
                        self._adapt_staleness()
                    if view:
                        view.refresh()
        finally:
            self.shutdown()
            self.rl_seconds = time.time() - self.started
        rows = self.tail.poll()  # the roles' last rows, written as they stopped
        for r in rows:
            self._merged.write(json.dumps(r) + "\n")
        self._merged.close()
        self.live.absorb(rows)
        self.telemetry.close(rows)
        return self.live.trainer

    def shutdown(self) -> None:
        self.state.set_flag("stop", True)
        for name in self.launcher.names():
            self.launcher.stop(name, timeout=2.0 if name == EVALUATOR else 20.0)
            self._ended(name)


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

        o, t = self.orch, self.orch.live.trainer
        total = o.cfg.trainer.total_steps
        step = int(t.get("trainer/step") or 0)
        elapsed = time.time() - o.started
        eta = (elapsed / step * (total - step)) if step else float("nan")
        episodes = o.live.total("rollout/episodes")
        tokens = o.live.total("rollout/tokens")
        table = Table(
            title=f"asyncrl {o.cfg.orchestrator.mode} — {o.run_dir}", show_header=False, expand=False
        )
        table.add_column(style="bold")
        table.add_column(justify="right")
        rows = [
            ("version / step", f"{int(t.get('trainer/version') or 0)} / {step} of {total}"),
            ("samples/s (rollout)", f"{episodes / elapsed:.1f}" if elapsed else "-"),
            ("tokens/s (rollout)", f"{tokens / elapsed:.0f}" if elapsed else "-"),
            (
                "queue depth",
                f"{int(t.get('queue/depth') or 0)}" + (" (paused)" if o.state.flag("paused") else ""),
            ),
            (
                "staleness mean / max",
                f"{float(t.get('staleness/mean') or 0):.2f} / {int(t.get('staleness/max') or 0)}",
            ),
            ("reward (train batch)", f"{float(t.get('reward/mean') or 0):.3f}"),
            ("success (train batch)", f"{float(t.get('reward/success_rate') or 0):.1%}"),
            ("trainer busy", f"{float(t.get('trainer/busy_fraction') or 0):.0%}"),
            (
                "held-out success (periodic)",
                f"{float(o.live.evaluation['eval/success_rate']):.1%} at v{int(o.live.evaluation['eval/version'])}"
                if o.live.evaluation
                else "-",
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
        for k, v in rows:
            table.add_row(k, v)
        return table


# ----------------------------------------------------------------------------------------------------
def train(
    cfg: RunConfig, *, resume: str | Path | None = None, display: bool = True, eval_limit: int | None = None
) -> tuple[Path, dict[str, Any]]:
    """Run the whole job: warm start, initial eval, async RL, final eval, ``summary.json``."""
    from asyncrl.policy import Policy
    from asyncrl.rollout.evaluate import evaluate_policy
    from asyncrl.telemetry.experiment import finish_run_record, write_run_record
    from asyncrl.trainer.sft import warm_start
    from asyncrl.transport import make_queue
    from asyncrl.weights import make_weight_store

    t0 = time.time()
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.yaml").is_file():
            raise UserError(f"--resume {str(run_dir)!r}: not a run directory (no config.yaml)")
        cfg = load_config(run_dir / "config.yaml")
        prior = json.loads((run_dir / "initial_eval.json").read_text())
        write_run_record(cfg, run_dir, resumed=True)
    else:
        run_dir = new_run_dir(cfg)
        write_run_record(cfg, run_dir)
        ws = warm_start(cfg, progress=display)
        shutil.copytree(ws.path, run_dir / "initial_policy")
        policy = Policy.load(run_dir / "initial_policy")
        make_weight_store(cfg.weights, run_dir).publish(0, policy.state_dict_tensors(), step=0)
        prior = evaluate_policy(cfg, policy, limit=eval_limit, seed=cfg.seed)
        (run_dir / "initial_eval.json").write_text(json.dumps(prior, indent=2))
    orch = Orchestrator(cfg, run_dir, resume=resume is not None, display=display)
    last = orch.run()
    # final evaluation on the newest valid weights
    store = make_weight_store(cfg.weights, run_dir)
    loaded = store.load_latest()
    policy = Policy.load(run_dir / "initial_policy")
    if loaded is not None:
        policy.load_tensors(loaded.tensors)
    final = evaluate_policy(cfg, policy, limit=eval_limit, seed=cfg.seed)
    (run_dir / "final_eval.json").write_text(json.dumps(final, indent=2))
    summary = _summary(
        cfg, run_dir, orch, last, prior, final, time.time() - t0, make_queue(cfg.transport, run_dir)
    )
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    finish_run_record(run_dir, summary)
    return run_dir, summary


def _summary(
    cfg: RunConfig,
    run_dir: Path,
    orch: Orchestrator,
    last: dict[str, Any],
    prior: dict[str, Any],
    final: dict[str, Any],
    wall: float,
    queue: Any,
) -> dict[str, Any]:
    state = orch.state
    fates = state.ledger_counts()
    ages = state.ages()
    hist: dict[str, int] = {}
    for a in ages:
        hist[str(a)] = hist.get(str(a), 0) + 1
    qs = queue.stats()
    accepted = int(qs["queue/put_total"])
    leftover = int(qs["queue/depth"])
    consumed = sum(fates.values())
    queue.close()
    cost: dict[str, Any] = {}
    if cfg.cost.enabled:
        from asyncrl.cost.ledger import collect_usage, price, read_rows, stored_bytes

        lifetimes = {k: (end or time.time()) - start for k, (start, end) in orch.lifetimes.items()}
        usage = collect_usage(
            read_rows(run_dir),
            wall_seconds=orch.rl_seconds,
            stored_bytes=stored_bytes(run_dir),
            lifetimes=lifetimes,
        )
        gain = (final["success_rate"] - prior["success_rate"]) * 100
        cost = price(usage, cfg.cost, success_gain_points=gain).to_dict()
        cost["reconciliation"] = {
            "device_seconds": usage.device_seconds,
            "wall_x_devices": orch.rl_seconds * usage.devices,
            "ratio": usage.device_seconds / (orch.rl_seconds * usage.devices) if usage.devices else 0.0,
        }
        (run_dir / "cost.json").write_text(json.dumps(cost, indent=2))
    return {
        "mode": cfg.orchestrator.mode,
        "initial_success": prior["success_rate"],
        "final_success": final["success_rate"],
        "samples_trained": fates.get("trained", 0),
        "samples_dropped_stale": fates.get("dropped_stale", 0),
        "samples_dropped_other": sum(v for k, v in fates.items() if k not in ("trained", "dropped_stale")),
        "samples_left_in_queue": leftover,
        "samples_accepted": accepted,
        "samples_admitted": state.get("admitted"),
        "lost_trajectories": accepted - consumed - leftover - int(qs["queue/dead_letters"]),
        "duplicates_recorded": state.get("duplicates"),
        "staleness_mean": sum(ages) / len(ages) if ages else 0.0,
        "staleness_max": max(ages) if ages else 0,
        "staleness_hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "trainer_busy_fraction": float(last.get("trainer/busy_fraction") or 0.0),
        "wall_seconds": wall,
        "rl_seconds": orch.rl_seconds,
        "versions_published": state.get("versions_published"),
        "last_version": state.get("published"),
        "trainer_steps": int(last.get("trainer/step") or 0),
        "restarts": orch.restarts,
        "dead_letters": int(qs["queue/dead_letters"]),
        "run_dir": str(run_dir),
        "cost_usd": cost.get("total_usd"),
        "cost_waste_share": cost.get("waste_total_share"),
        "cost_usd_per_trained_sample": (cost.get("efficiency") or {}).get("usd_per_trained_sample"),
    }
