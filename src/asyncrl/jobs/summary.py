"""``summary.json``: what a finished run reports — success before and after, the queue's and the
ledger's accounting (lost, duplicates, staleness), token-exactness, the train–inference log-prob gap,
the weight canary, core lending, peak memory, environment faults, (with ``cost.enabled``) the cost ledger (``cost.json``) and, for an
``env.kind: mix``, one row per environment (``per_env``, :mod:`asyncrl.telemetry.report_envs`)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import RunConfig
from asyncrl.cost.ledger import collect_usage, price, read_reports, stored_bytes
from asyncrl.orchestrator.run import Orchestrator
from asyncrl.orchestrator.telemetry import TRAINER
from asyncrl.telemetry.jsonl import memory
from asyncrl.telemetry.report_envs import EnvTally, per_env
from asyncrl.telemetry.report_metrics import constant_reply_note
from asyncrl.telemetry.report_signal import signal_summary
from asyncrl.telemetry.reports import Decoded, GapFigures, QueueStats, Report, TrainerReport, WorkerReport

if TYPE_CHECKING:
    from asyncrl.transport import TrajectoryQueue


def _peak_memory(reports: list[Decoded]) -> dict[str, float]:
    """Peak resident memory (MB) per role, from the ``mem/peak_rss_mb`` of its metric rows (the
    highest over restarts), and of this launcher process (warm start and evaluations)."""
    peaks: dict[str, float] = {}
    for r in reports:
        if isinstance(r, Report) and r.mem is not None:
            peaks[r.role] = max(peaks.get(r.role, 0.0), r.mem.peak_rss_mb)
    peaks["launcher"] = memory().peak_rss_mb
    return dict(sorted(peaks.items()))


def _token_exactness(orch: Orchestrator) -> dict[str, float | None]:
    """Token-exactness of the run's samples (see :func:`asyncrl.rollout.heldout.retokenization_stats`):
    the rate counts only checked samples; the unchecked ones are reported beside it."""
    w = orch.live.rollout()
    checked = int(w.token_exact_checked)

    def share_exact(inexact: float) -> float | None:
        return (1.0 - inexact / checked) if checked else None

    return {
        "token_exact_checked": checked,
        "token_exact_unchecked": int(w.token_exact_unchecked),
        "token_exact_rate": share_exact(w.token_inexact),
        "retokenization_exact_rate": share_exact(w.retokenization_inexact),
        "retokenization_diff_tokens": int(w.retokenization_diff_tokens),
    }


def train_inference_gap(reports: list[Decoded]) -> dict[str, float | None]:
    """The train–inference log-prob gap over the run (:class:`~asyncrl.telemetry.reports.GapFigures`,
    :mod:`asyncrl.trainer.gap`), from the last row of each trainer process (its figures are cumulative
    for the process): tokens and sequences add up, the mean and k3 are token-weighted, the max is the
    largest; the p99 is the largest process's (exact up to the histogram's bin with one trainer
    process, an upper bound of the run's after a restart). ``None`` figures: no comparable token."""
    last: dict[int | None, GapFigures] = {}
    for r in reports:
        if isinstance(r, TrainerReport) and r.gap is not None:
            last[r.pid] = r.gap
    n = sum(g.tokens for g in last.values())
    seqs = sum(g.sequences for g in last.values())

    def weighted(field: str) -> float | None:
        return sum(getattr(g, field) * g.tokens for g in last.values()) / n if n else None

    return {
        "tokens": int(n),
        "mean": weighted("mean"),
        "p99": max(g.p99 for g in last.values()) if n else None,
        "max": max(g.max for g in last.values()) if n else None,
        "sequences": int(seqs),
        "sequences_over_0.1_share": sum(g.sequences_over for g in last.values()) / seqs if seqs else None,
        "k3": weighted("k3"),
    }


def _canary(orch: Orchestrator) -> dict[str, int]:
    """The weight-sync canary over the run: loads checked (of which with the probe riding along a call),
    versions refused, loads that could not be checked."""
    c = orch.live.canary()
    return {
        "checked": int(c.canary_checked),
        "rode": int(c.canary_rode),
        "failed": int(c.canary_failed),
        "unverified": int(c.canary_unverified),
        "alerts": orch.rules.alerts.counts.get("weight_canary", 0),
    }


def _cost(
    cfg: RunConfig, run_dir: Path, orch: Orchestrator, gain: float, reports: list[Decoded]
) -> dict[str, Any]:
    """The run's cost ledger from every role's reports (``cost.json``), reconciled with the wall time."""
    lifetimes = {k: (end or time.time()) - start for k, (start, end) in orch.lifetimes.items()}
    usage = collect_usage(
        reports, wall_seconds=orch.rl_seconds, stored_bytes=stored_bytes(run_dir), lifetimes=lifetimes
    )
    cost = price(usage, cfg.cost, success_gain_points=gain).to_dict()
    cost["reconciliation"] = {
        "device_seconds": usage.device_seconds,
        "wall_x_devices": orch.rl_seconds * usage.devices,
        "ratio": usage.device_seconds / (orch.rl_seconds * usage.devices) if usage.devices else 0.0,
    }
    (run_dir / "cost.json").write_text(json.dumps(cost, indent=2))
    return cost


def _lending(orch: Orchestrator) -> dict[str, float | dict[str, float]]:
    """Core lending over the run (:mod:`asyncrl.lending`): thread-seconds each role borrowed
    from a waiting one (the ``cores`` section of the roles' latest reports)."""
    reports: dict[str, WorkerReport | TrainerReport] = {**orch.live.workers}
    if orch.live.trainer is not None:
        reports[TRAINER] = orch.live.trainer
    by_role = {name: round(r.cores.borrowed_thread_seconds, 1) for name, r in reports.items() if r.cores}
    return {"threads_lent_seconds": round(sum(by_role.values()), 1), "threads_borrowed_by": by_role}


def sample_accounting(
    qs: QueueStats, unacked: list[str], fated: set[str], consumed: int
) -> tuple[int, int, int]:
    """(accepted, left over, lost), in samples, once the roles have stopped. Every sample the queue
    accepted is consumed (its fate is in the ledger: ``consumed`` of them, ids ``fated``), left over
    (a member of an un-acked entry, ids ``unacked``, without a fate) or dead-lettered; ``lost`` is what
    is none of these and must be 0. An un-acked entry can hold members that have a fate — a tree group some of whose leaves were dropped
    stale, held for the rest when the run ended — and those count as consumed, not left over."""
    accepted, dead = int(qs.samples_in), int(qs.samples_dead)
    unacked_samples = accepted - int(qs.samples_acked) - dead  # an entry is a group: counted in samples
    leftover = unacked_samples - sum(i in fated for i in unacked)
    return accepted, leftover, accepted - consumed - leftover - dead


def summarize(
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
    consumed = sum(fates.values())
    qs = queue.stats()
    accepted, leftover, lost = sample_accounting(qs, queue.unacked_members(), state.ids_with_fate(), consumed)
    queue.close()
    gain = (final["success_rate"] - prior["success_rate"]) * 100
    reports = read_reports(run_dir)  # every role's metric rows, read once
    cost = _cost(cfg, run_dir, orch, gain, reports) if cfg.cost.enabled else {}
    if cfg.env.mix:  # one row per environment: its own held-out split, groups, faults, tokens, cost share
        weights, tally = {m.name: m.weight for m in cfg.env.mix}, EnvTally.of(reports)
        envs = per_env(weights, tally, prior, final, cost.get("total_usd"), orch.rules.env_shares())
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
        # accepted by put = consumed (a fate in the ledger) + still queued + dead-lettered, counted in samples
        # by the queue (dead letters of bytes written into the queue from outside hold none)
        "lost_trajectories": lost,
        "duplicates_recorded": tallies.duplicates,
        "staleness_mean": sum(ages) / len(ages) if ages else 0.0,
        "staleness_max": max(ages) if ages else 0,
        "staleness_hist": {str(a): n for a, n in sorted(Counter(ages).items())},
        "trainer_busy_fraction": last.trainer.busy_fraction if last else 0.0,
        "wall_seconds": wall,
        "rl_seconds": orch.rl_seconds,
        "rl_started_at": orch.started,  # epoch seconds: the orchestrator's start, before any role launched
        "versions_published": tallies.versions_published,
        "last_version": tallies.last_published,
        # the trainer's own count in the control state: a resumed run whose trainer had nothing left to
        # train (stopped in its final evaluation) reports every step, never fewer than were trained
        "trainer_steps": max(int(last.trainer.step) if last else 0, state.trainer_step()),
        "restarts": orch.restarts,
        "dead_letters": int(qs.dead_letters),
        "dead_letters_foreign": int(qs.dead_letters_foreign),
        "run_dir": str(run_dir),
        "cost_usd": cost.get("total_usd"),
        "cost_waste_share": cost.get("waste_total_share"),
        "cost_usd_per_trained_sample": (cost.get("efficiency") or {}).get("usd_per_trained_sample"),
        **_token_exactness(orch),
        "train_inference_gap": train_inference_gap(reports),
        "weights_canary": _canary(orch),
        **_lending(orch),
        "peak_rss_mb": _peak_memory(reports),
        "env_faults": {cfg.env.path or cfg.env.kind: faults},
        **({"per_env": envs} if cfg.env.mix else {}),
        "signal": signal_summary(reports, cfg),
        "initial_top_reply_share": prior.get("top_reply_share"),
        "final_top_reply_share": final.get("top_reply_share"),
        "notes": [n for n in (faults["note"], constant_reply_note(prior, final)) if n],
    }
