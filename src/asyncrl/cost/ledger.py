"""The cost ledger: where every device-second and dollar of a run went, and how much was wasted.

Inputs are the roles' own reports (``metrics/*.jsonl``, decoded as :mod:`asyncrl.telemetry.reports`):
each carries the process id and how long that process has been alive (``alive_s``), so every
incarnation of a restarted role is counted. :func:`collect_usage` folds them into :class:`Usage`
(physical quantities);
:func:`price` turns usage into dollars with the config's price table.

Accounting model (all components are disjoint, so they add up to the total):

=====================  ===========================================================================
component              quantity × price
=====================  ===========================================================================
rollout_device         Σ rollout processes' alive seconds × device_hour[device] / 3600
trainer_device         Σ trainer processes' alive seconds × device_hour[device] / 3600
value_model            value-model compute seconds × device price (0 until a value model exists)
reward                 seconds spent in answer verifiers × cpu_core_hour / 3600
environment            env calls × env_call  +  env step seconds × cpu_core_hour / 3600
storage                GB kept (weights, checkpoints, queue) × gb_stored_month × run months
transfer               GB through the queue and the weight store × gb_transferred
=====================  ===========================================================================

Waste (each a part of one component, never counted twice):

* ``idle_devices`` — device seconds not spent generating (rollout) or training (trainer);
* ``stale_dropped`` — busy generation cost of the tokens of samples dropped as too stale;
* ``early_terminated`` — busy generation cost of truncated / timed-out trajectories that were trained
  (outside zero-advantage groups: those are counted there);
* ``zero_advantage`` — generation and training cost of groups whose rewards were all equal (no signal;
  those left out of the gradient, ``trainer.skip_equal_reward_groups``, cost their generation alone);
* ``masked_tokens`` — training cost of prompt and observation tokens (processed, not learned from);
* ``failed_env_calls`` — environment cost of calls the guard had to retry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.config import CostConfig
from asyncrl.telemetry.jsonl import read_jsonl_dir
from asyncrl.telemetry.reports import Decoded, TrainerReport, WorkerReport, decode_rows

GB = 1e9
MONTH_S = 30 * 24 * 3600


@dataclass
class Usage:
    wall_seconds: float = 0.0
    devices: int = 0
    rollout_alive_s: float = 0.0
    rollout_busy_s: float = 0.0
    trainer_alive_s: float = 0.0
    trainer_busy_s: float = 0.0
    value_model_s: float = 0.0
    reward_s: float = 0.0
    env_calls: float = 0.0
    env_seconds: float = 0.0
    env_retries: float = 0.0
    queue_bytes: float = 0.0
    weight_bytes: float = 0.0
    stored_bytes: float = 0.0
    tokens_generated: float = 0.0
    tokens_truncated: float = 0.0
    tokens_trained: float = 0.0
    tokens_processed: float = 0.0
    tokens_dropped_stale: float = 0.0
    tokens_dropped_other: float = 0.0
    zero_adv_samples: float = 0.0
    zero_adv_tokens: float = 0.0
    zero_adv_model_tokens: float = 0.0
    zero_adv_skipped_model_tokens: float = 0.0
    """Of ``zero_adv_model_tokens``: those of groups left out of the gradient (generated, never trained)."""
    samples_generated: float = 0.0
    samples_trained: float = 0.0
    reward_cache_hits: float = 0.0
    reward_cache_misses: float = 0.0

    @property
    def tokens_masked(self) -> float:
        return max(0.0, self.tokens_processed - self.tokens_trained)

    @property
    def device_seconds(self) -> float:
        return self.rollout_alive_s + self.trainer_alive_s


def _latest_per_process(reports: Iterable[Decoded]) -> dict[tuple[str, int], WorkerReport | TrainerReport]:
    """The newest report of every training-device process (rollout workers and trainer)."""
    latest: dict[tuple[str, int], WorkerReport | TrainerReport] = {}
    for r in reports:
        if not isinstance(r, (WorkerReport, TrainerReport)) or r.pid is None:
            continue  # events, and the orchestrator and the evaluator: not training devices
        key = (r.role, r.pid)
        if key not in latest or r.time >= latest[key].time:
            latest[key] = r
    return latest


def collect_usage(
    reports: Iterable[Decoded],
    *,
    wall_seconds: float,
    stored_bytes: float = 0.0,
    lifetimes: dict[tuple[str, int], float] | None = None,
) -> Usage:
    """Fold the roles' reports (every incarnation of every role) into one :class:`Usage`.

    ``lifetimes`` — seconds each (role, pid) held its device, from launch to exit, as the orchestrator
    observed them — replaces the processes' self-reported ``alive_s`` (which misses interpreter start-up
    and the time after a process's last report). A process that died before reporting still counts.
    """
    u = Usage(wall_seconds=wall_seconds, stored_bytes=stored_bytes)
    latest = _latest_per_process(reports)
    alive = dict(lifetimes) if lifetimes is not None else {k: r.alive_s for k, r in latest.items()}
    for role, pid in alive:
        if (role, pid) not in latest and (role == "trainer" or role.startswith("rollout")):
            latest[(role, pid)] = TrainerReport(role=role) if role == "trainer" else WorkerReport(role=role)
    for key, r in latest.items():
        if isinstance(r, TrainerReport):
            _add_trainer(u, r, alive.get(key, 0.0))
        else:
            _add_worker(u, r, alive.get(key, 0.0))
    u.devices = len({role for role, _ in latest})
    return u


def _add_trainer(u: Usage, r: TrainerReport, alive_s: float) -> None:
    t = r.trainer
    u.trainer_alive_s += alive_s
    u.trainer_busy_s += t.busy_seconds
    u.tokens_trained += t.tokens_trained
    u.tokens_processed += t.tokens_processed
    u.tokens_truncated += t.truncated_tokens
    u.tokens_dropped_stale += t.dropped_stale_tokens
    u.tokens_dropped_other += t.dropped_other_tokens
    u.zero_adv_samples += t.zero_adv_samples
    u.zero_adv_tokens += t.zero_adv_tokens
    u.zero_adv_model_tokens += t.zero_adv_model_tokens
    u.zero_adv_skipped_model_tokens += t.zero_adv_skipped_model_tokens
    u.weight_bytes += t.bytes_published
    u.samples_trained += t.samples_trained
    u.queue_bytes = max(u.queue_bytes, r.queue.bytes_in)  # a queue-wide total: the newest, not a sum


def _add_worker(u: Usage, r: WorkerReport, alive_s: float) -> None:
    w = r.rollout
    u.rollout_alive_s += alive_s
    u.rollout_busy_s += w.gen_busy_seconds
    u.tokens_generated += w.tokens
    u.samples_generated += w.episodes
    u.env_calls += w.env_calls
    u.env_seconds += w.env_seconds
    u.env_retries += w.env_retries
    u.weight_bytes += w.weight_bytes_loaded
    u.reward_s += r.cost.reward_seconds
    u.reward_cache_hits += r.cost.reward_cache_hits
    u.reward_cache_misses += r.cost.reward_cache_misses


@dataclass
class CostBreakdown:
    components: dict[str, float]
    waste: dict[str, float]
    efficiency: dict[str, float]
    usage: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.components.values())

    @property
    def waste_total(self) -> float:
        return sum(self.waste.values())

    def to_dict(self) -> dict[str, Any]:
        total = self.total
        return {
            "total_usd": total,
            "components_usd": self.components,
            "components_share": {k: (v / total if total else 0.0) for k, v in self.components.items()},
            "waste_usd": self.waste,
            "waste_share": {k: (v / total if total else 0.0) for k, v in self.waste.items()},
            "waste_total_usd": self.waste_total,
            "waste_total_share": self.waste_total / total if total else 0.0,
            "efficiency": self.efficiency,
            "usage": self.usage,
        }


def price(u: Usage, cfg: CostConfig, *, success_gain_points: float | None = None) -> CostBreakdown:
    """Dollars per component, waste per cause, and efficiency figures for ``u`` (see module docstring)."""
    p = cfg.prices
    dev = p.device_hour[cfg.device] / 3600.0
    cpu = p.cpu_core_hour / 3600.0
    months = u.wall_seconds / MONTH_S
    comp = {
        "rollout_device": u.rollout_alive_s * dev,
        "trainer_device": u.trainer_alive_s * dev,
        "value_model": u.value_model_s * dev,
        "reward": u.reward_s * cpu,
        "environment": u.env_calls * p.env_call + u.env_seconds * cpu,
        "storage": u.stored_bytes / GB * p.gb_stored_month * months,
        "transfer": (u.queue_bytes + u.weight_bytes) / GB * p.gb_transferred,
    }
    gen_busy = u.rollout_busy_s * dev
    train_busy = u.trainer_busy_s * dev
    per_gen_token = gen_busy / u.tokens_generated if u.tokens_generated else 0.0
    per_train_token = train_busy / u.tokens_processed if u.tokens_processed else 0.0
    # the prompt and observation tokens of zero-advantage groups the trainer processed (those it left
    # out of the gradient were never processed: zero_adv_tokens holds none of theirs)
    zero_adv_masked = max(
        0.0, u.zero_adv_tokens - (u.zero_adv_model_tokens - u.zero_adv_skipped_model_tokens)
    )
    per_call = comp["environment"] / u.env_calls if u.env_calls else 0.0
    waste = {
        "idle_devices": max(0.0, (u.rollout_alive_s - u.rollout_busy_s) * dev)
        + max(0.0, (u.trainer_alive_s - u.trainer_busy_s) * dev),
        "stale_dropped": u.tokens_dropped_stale * per_gen_token,
        "early_terminated": u.tokens_truncated * per_gen_token,
        "zero_advantage": u.zero_adv_model_tokens * per_gen_token + u.zero_adv_tokens * per_train_token,
        "masked_tokens": max(0.0, u.tokens_masked - zero_adv_masked) * per_train_token,
        "failed_env_calls": u.env_retries * per_call,
    }
    total = sum(comp.values())
    hours = u.wall_seconds / 3600.0
    eff = {
        "cost_rate_usd_per_hour": total / hours if hours else 0.0,
        "cumulative_usd": total,
        "usd_per_trained_sample": total / u.samples_trained if u.samples_trained else 0.0,
        "usd_per_million_trained_tokens": total / u.tokens_trained * 1e6 if u.tokens_trained else 0.0,
        "reward_cache_hit_rate": (
            u.reward_cache_hits / (u.reward_cache_hits + u.reward_cache_misses)
            if u.reward_cache_hits + u.reward_cache_misses
            else 0.0
        ),
    }
    if success_gain_points is not None and success_gain_points > 0:
        eff["usd_per_success_point"] = total / success_gain_points
    usage = {k: float(v) for k, v in asdict(u).items()}
    usage["tokens_masked"] = u.tokens_masked
    usage["device_seconds"] = u.device_seconds
    return CostBreakdown(comp, waste, eff, usage)


def read_reports(run_dir: Path) -> list[Decoded]:
    """Every role's metric rows (``run_dir/metrics/*.jsonl``), decoded."""
    return decode_rows(read_jsonl_dir(run_dir / "metrics"))


def stored_bytes(run_dir: Path) -> float:
    return float(sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file()))
