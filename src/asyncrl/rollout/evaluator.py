"""The evaluator role: held-out evaluation of the newest weights every ``telemetry.eval_every`` versions.

A separate process at the lowest CPU priority (Linux's ``SCHED_IDLE`` with ``telemetry.eval_idle``, and
``nice`` +``telemetry.eval_nice``), so that evaluation never blocks the orchestrator's tick and computes
only on a core the trainer and the rollout workers leave. It watches the weight store; whenever the
newest valid version is at least ``eval_every`` past the last one it evaluated (version 0 is the
run's initial evaluation), it loads that version and runs :func:`~asyncrl.rollout.heldout.evaluate_policy`
on the environment's held-out split — independent of the training reward, with simulated latency and
faults off and the run's seed, so the numbers of different versions are comparable. Each result is a
metric row (``eval/*``, role ``evaluator``) and one line of ``evals.jsonl``. Evaluation is not
training: the cost ledger does not bill this process as a rollout or trainer device.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

from asyncrl.config import RunConfig
from asyncrl.control import RunState
from asyncrl.lending import ThreadLender
from asyncrl.rollout.heldout import evaluate_policy
from asyncrl.telemetry.jsonl import MetricWriter, read_jsonl
from asyncrl.telemetry.reports import EvalFigures, EvaluatorReport

ROLE = "evaluator"
log = logging.getLogger(__name__)


class Evaluator:
    def __init__(self, cfg: RunConfig, run_dir: Path, started: float | None = None) -> None:
        from asyncrl.policy import Policy
        from asyncrl.weights import make_weight_store

        self.cfg, self.run_dir = cfg, run_dir
        self.state = RunState.for_role(cfg, run_dir)
        self.store = make_weight_store(cfg.weights, run_dir)
        self.policy = Policy.load(run_dir / "initial_policy", cfg=cfg.model).to(cfg.model.device)
        self.metrics = MetricWriter(run_dir / "metrics" / f"{ROLE}.jsonl", role=ROLE, started=started)
        done = [
            r["version"] for r in read_jsonl(run_dir / "evals.jsonl") if isinstance(r.get("version"), int)
        ]
        self.last = max(done, default=0)  # version 0: the initial evaluation
        from asyncrl.bootstrap import torch_threads

        # core lending: a niced evaluator holds its core while it evaluates and never borrows; one at
        # SCHED_IDLE holds none (it computes only on a core nobody else wants), so it does not join
        self.lender = (
            None
            if cfg.telemetry.eval_idle
            else ThreadLender.join(run_dir, ROLE, torch_threads(cfg, "evaluator"), borrow=False)
        )

    def due(self) -> bool:
        v = self.store.latest_version()
        return v is not None and v >= self.last + self.cfg.telemetry.eval_every

    def evaluate_newest(self) -> EvalFigures | None:
        loaded = self.store.load_latest()
        if loaded is None or loaded.version <= self.last:
            return None
        self.policy.load_tensors(loaded.tensors)
        t0 = time.time()
        tc = self.cfg.telemetry
        if self.lender is not None:
            self.lender.computing()
        try:
            report = evaluate_policy(self.cfg, self.policy, limit=tc.eval_tasks or None, seed=self.cfg.seed)
        finally:
            if self.lender is not None:
                self.lender.waiting()
        seconds = time.time() - t0
        self.last = loaded.version
        step = int(loaded.manifest.get("step", -1))
        held_out = ("success_rate", "mean_reward", "tool_success_rate", "avg_steps", "distinct_2", "episodes")
        figures = EvalFigures(
            version=float(loaded.version),
            trainer_step=float(step),
            seconds=seconds,
            **{k: float(report[k]) for k in held_out},
        )
        line = {"version": loaded.version, "step": step, "time": time.time(), "seconds": seconds, **report}
        with (self.run_dir / "evals.jsonl").open("a") as f:
            f.write(json.dumps(line) + "\n")
        self.metrics.report(EvaluatorReport(eval=figures))
        return figures

    def run(self) -> None:
        while not self.state.stopping() and not self.state.trainer_finished():
            if self.due():
                self.evaluate_newest()
            else:
                time.sleep(0.5)


def yield_cpu(nice: int, *, idle: bool) -> None:
    """Lower the calling thread's CPU priority so that evaluation yields the cores to training:
    ``nice`` always, and Linux's ``SCHED_IDLE`` policy when ``idle`` (where the OS has it). Both are
    per thread on Linux and every thread this one starts inherits them (the engine's worker thread,
    torch's pool); threads started before (a launcher's, Ray's) keep their priority. A refused policy
    (a sandbox that allows only the default one) is a warning, not a failed role."""
    os.nice(nice)
    if idle and sys.platform.startswith("linux"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError as exc:
            log.warning("evaluator: SCHED_IDLE refused (%s); running at nice %d", exc, nice)


def evaluator_main(cfg_json: str, run_dir: str) -> None:
    """Process entry point (spawned by the launcher)."""
    started = time.time()
    from asyncrl.bootstrap import init_role_process

    cfg = init_role_process(cfg_json, "evaluator")
    yield_cpu(cfg.telemetry.eval_nice, idle=cfg.telemetry.eval_idle)
    Evaluator(cfg, Path(run_dir), started=started).run()
