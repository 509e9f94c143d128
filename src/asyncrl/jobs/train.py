"""The training job: preflight, run directory, warm start, version 0, initial evaluation; the
orchestrator's supervision of the roles (:class:`~asyncrl.orchestrator.run.Orchestrator`); final
evaluation; ``summary.json`` (:mod:`asyncrl.jobs.summary`). ``asyncrl train``, ``asyncrl demo`` and
``asyncrl role orchestrator`` run it.

Stopping and resuming (:mod:`asyncrl.orchestrator.stopping`): a stop signal in any phase leaves a run
that ``--resume`` continues — ``run.json`` says ``stopped`` with the phase, step and version. A run
stopped while it was being prepared keeps its directory (``config.yaml`` is written first) and is
prepared again; one stopped while training continues from its newest checkpoint; one stopped in its
final evaluation only evaluates. ``--resume`` of a finished run changes nothing.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.bootstrap import pinned_threads, torch_threads
from asyncrl.config import RunConfig, dump_yaml, load_config
from asyncrl.control import RunState
from asyncrl.credentials import check_connections
from asyncrl.envs import call_env, check_heldout, close_env, make_raw_env, make_task_source
from asyncrl.envs.registry import tool_notes
from asyncrl.errors import UserError
from asyncrl.jobs.summary import summarize
from asyncrl.orchestrator.run import Orchestrator, new_run_dir
from asyncrl.orchestrator.runctl import finished_summary, record_orchestrator
from asyncrl.orchestrator.stopping import Stopped, StopSignals, stop_signals
from asyncrl.policy.memory import release_memory, set_mmap_threshold
from asyncrl.rollout.heldout import evaluate_policy
from asyncrl.telemetry.experiment import update_run_record, write_run_record
from asyncrl.transport import make_queue

if TYPE_CHECKING:
    from asyncrl.policy.model import Policy
    from asyncrl.policy.preflight import ModelPlan

log = logging.getLogger("asyncrl.orchestrator")

CONTEXT_PROBE_TASKS = 4  # held-out and training tasks each whose episode openings the preflight renders


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
    ``resume``: continue a stopped (or killed) run; a finished one is returned as it is.
    A stop signal raises :class:`~asyncrl.orchestrator.stopping.Stopped` once the run is stopped and
    ``run.json`` says so (:mod:`asyncrl.orchestrator.stopping`).
    """
    if resume is not None and (done := finished_summary(Path(resume))) is not None:
        return Path(resume), done
    if cfg.rollout.engine.kind == "vllm":  # optional backend: fail before the warm start, not after
        from asyncrl.engine.vllm_backend import preflight

        preflight(cfg)
    with stop_signals() as signals:
        return _train(cfg, signals, resume, display, eval_limit, run_dir)


def _train(
    cfg: RunConfig,
    signals: StopSignals,
    resume: str | Path | None,
    display: bool,
    eval_limit: int | None,
    run_dir: str | Path | None,
) -> tuple[Path, dict[str, Any]]:
    t0, phase, where = time.time(), "preparation", run_dir
    try:
        if resume is not None:
            where = Path(resume)
            cfg, run_dir, prior = _resumed(Path(resume), display, eval_limit)
        else:
            run_dir, prior = _fresh(cfg, run_dir, display, eval_limit)
        where, phase = run_dir, "training"
        orch = Orchestrator(cfg, run_dir, resume=resume is not None, display=display, signals=signals)
        with signals.mode(raising=False):  # the loop polls; roles stop at their next safe point
            last = orch.run()
        if orch.stopped_by is not None:  # after the trainer finished, what a stop leaves is the evaluation
            raise Stopped(
                orch.stopped_by, "final evaluation" if orch.state.trainer_finished() else "training"
            )
        phase = "final evaluation"
        final = _final_eval(cfg, run_dir, eval_limit)
        queue = make_queue(cfg.transport, run_dir)
        summary = summarize(cfg, run_dir, orch, last, prior, final, time.time() - t0, queue)
    except Stopped as stop:
        stop.phase, where = stop.phase or phase, stop.run_dir or where
        if where is not None and Path(where, "run.json").is_file():
            stop.run_dir = str(where)
            _record_stop(Path(where), stop)
        raise
    except Exception as exc:
        if where is not None and Path(where, "run.json").is_file():
            update_run_record(
                Path(where), status="failed", error=f"{type(exc).__name__}: {exc}", failed_phase=phase
            )
        raise
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    update_run_record(
        run_dir,
        status="finished",
        finished=time.time(),
        wall_seconds=summary.get("wall_seconds"),
        trainer_steps=summary.get("trainer_steps"),
    )
    return run_dir, summary


def _record_stop(run_dir: Path, stop: Stopped) -> None:
    """``run.json``: stopped, by which signal, in which phase, at which step and version."""
    step = version = None
    if (run_dir / "config.yaml").is_file():
        state = RunState.open(load_config(run_dir / "config.yaml"), run_dir)  # the run's own (on resume)
        step, version = state.trainer_step(), state.version()
        state.store.set_flag("halt", False)  # honoured: a resumed run must not stop at once
        state.store.set_flag("halt_now", False)
        state.close()
    info = {
        "signal": signal.Signals(stop.signum).name,
        "phase": stop.phase,
        "step": step,
        "version": version,
        "at": time.time(),
    }
    update_run_record(run_dir, status="stopped", stopped=info)
    log.warning("stopped by %s during %s at step %s", info["signal"], stop.phase, step)


def _resumed(run_dir: Path, display: bool, eval_limit: int | None) -> tuple[RunConfig, Path, dict[str, Any]]:
    """``--resume``: the run's own config, and its initial evaluation (a run stopped while it was being
    prepared is prepared again, in its own directory)."""
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"--resume {str(run_dir)!r}: not a run directory (no config.yaml)")
    cfg = load_config(run_dir / "config.yaml")
    check_connections(cfg)  # bad Redis settings fail here, before any work
    if not (run_dir / "initial_eval.json").is_file():
        _, prior = _fresh(cfg, run_dir, display, eval_limit)
        return cfg, run_dir, prior
    prior = json.loads((run_dir / "initial_eval.json").read_text())
    write_run_record(cfg, run_dir, resumed=True)
    record_orchestrator(run_dir)
    return cfg, run_dir, prior


def _fresh(
    cfg: RunConfig, run_dir: str | Path | None, display: bool, eval_limit: int | None
) -> tuple[Path, dict[str, Any]]:
    """A new run: preflight, run directory, warm start, version 0 published, initial evaluation.

    A stop signal meanwhile leaves the directory (``config.yaml``, ``run.json`` stopped) for ``--resume``,
    which prepares it again here (the warm start restarts, or comes from its cache if it had finished);
    any other failure of a new directory removes it."""
    _preflight(cfg)
    existing = run_dir is not None and Path(run_dir, "run.json").is_file()  # a stopped preparation
    fresh = run_dir is None or not Path(run_dir).exists()
    run_dir = Path(run_dir) if run_dir is not None else new_run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        write_run_record(cfg, run_dir, resumed=existing)
        record_orchestrator(run_dir)
        (run_dir / "config.yaml").write_text(dump_yaml(cfg))  # resumable from the first second
        prior = _prepare(cfg, run_dir, display, eval_limit)
    except Stopped as stop:
        stop.run_dir = str(run_dir)  # the directory stays: `asyncrl train --resume` prepares it again
        raise
    except BaseException:
        if fresh:  # nothing ran yet: leave no half-made run directory behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_dir, prior


def _preflight(cfg: RunConfig) -> ModelPlan | None:
    """What fails before any work: connections, the device, the model directory, the environment."""
    from asyncrl.policy import resolve_device
    from asyncrl.policy.preflight import preflight_model

    check_connections(cfg)
    resolve_device(cfg.model.device)  # a GPU that is not there fails here, before the warm start
    plan = preflight_model(cfg.model)  # a model directory asyncrl cannot run fails here,
    if plan is not None and cfg.rollout.tree.enabled and plan.renderer.multi_turn == "per_turn":
        raise UserError(
            "rollout.tree replays an episode's turns into one trajectory; model.multi_turn is per_turn "
            "for this template (set model.multi_turn: bridge, or rollout.tree.enabled: false)"
        )
    _check_env(cfg, plan)  # so do a bad env.path or option and a context too small for a turn
    return plan


def _prepare(cfg: RunConfig, run_dir: Path, display: bool, eval_limit: int | None) -> dict[str, Any]:
    """Warm start, ``initial_policy``, version 0 published, the initial evaluation (``initial_eval.json``)."""
    from asyncrl.jobs.warm_start import warm_start
    from asyncrl.weights import make_weight_store, publish_policy

    set_mmap_threshold(cfg.launcher.malloc_mmap_threshold_kb)  # this process trains the warm start
    ws = warm_start(cfg, progress=display or cfg.telemetry.progress_every_s, eval_limit=eval_limit)
    shutil.rmtree(run_dir / "initial_policy", ignore_errors=True)  # a stopped preparation's copy
    shutil.copytree(ws.path, run_dir / "initial_policy")
    policy = _initial_policy(cfg, run_dir)
    store = make_weight_store(cfg.weights, run_dir)
    if store.latest_version() is None:  # a stopped preparation may have published it already
        publish_policy(store, 0, policy, step=0, canary=cfg.weights.canary)
    # a warm start trained just now was evaluated with this very call (same limit, same
    # seed) on the weights it saved: reuse it rather than play the held-out set twice
    prior = _evaluate_alone(cfg, policy, eval_limit) if ws.cached else ws.report
    (run_dir / "initial_eval.json").write_text(json.dumps(prior, indent=2))
    del policy, ws
    release_memory()  # the warm start's peak is not this supervisor's to keep for the run
    return prior


def _final_eval(cfg: RunConfig, run_dir: Path, eval_limit: int | None) -> dict[str, Any]:
    """Held-out evaluation of the newest valid weights, written to ``final_eval.json``."""
    from asyncrl.weights import make_weight_store

    loaded = make_weight_store(cfg.weights, run_dir).load_latest()
    policy = _initial_policy(cfg, run_dir)
    if loaded is not None:
        policy.load_tensors(loaded.tensors)
    final = _evaluate_alone(cfg, policy, eval_limit)
    (run_dir / "final_eval.json").write_text(json.dumps(final, indent=2))
    return final


def _initial_policy(cfg: RunConfig, run_dir: Path) -> Policy:
    """The run's ``initial_policy`` (the warm start's copy), on the model's device."""
    from asyncrl.policy import Policy

    return Policy.load(run_dir / "initial_policy", cfg=cfg.model).to(cfg.model.device)


def _evaluate_alone(cfg: RunConfig, policy: Policy, eval_limit: int | None) -> dict[str, Any]:
    """The held-out evaluation of ``policy`` while no role runs (before the roles start, or after they
    stopped): on every core."""
    with pinned_threads(torch_threads(cfg, "evaluation")):
        return evaluate_policy(cfg, policy, limit=eval_limit, seed=cfg.seed)


def _check_env(cfg: RunConfig, plan: ModelPlan | None) -> None:
    """Build the environment and its task source once: a wrong ``env.path`` or option, or a held-out
    split smaller than ``env.heldout_size``, raises its :class:`~asyncrl.envs.EnvPluginError` (a user
    error) now. With a pretrained model's ``plan``, also render the opening of a few episodes
    (held-out and training tasks) and check that the context holds the longest one plus a whole
    model turn (``rollout.sampling.max_new_tokens``)."""
    import asyncio
    import random

    source = make_task_source(cfg.env)
    check_heldout(source, cfg.env)
    env = make_raw_env(cfg.env)
    if cfg.trainer.sft.resolved(cfg.model.is_pretrained, cfg.model.lora is not None).steps:
        for note in tool_notes(cfg.env, source, env):  # tools the warm start never shows
            print(f"asyncrl: {note}", file=sys.stderr, flush=True)
    if plan is None or cfg.env.kind == "agent":  # an agent's prompts are its own: the gateway checks them
        asyncio.run(close_env(env))
        return
    rng = random.Random(cfg.seed)
    tasks = list(source.heldout())[:CONTEXT_PROBE_TASKS] + [
        source.sample(rng) for _ in range(CONTEXT_PROBE_TASKS)
    ]

    async def openings() -> list[tuple[int, str]]:
        tools, out = list(env.tools), []  # the registry checked it is a list
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
