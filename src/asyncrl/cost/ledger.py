"""The cost ledger: where every device-second and dollar of a run went, and how much was wasted.

Inputs are the roles' own metric rows (``metrics/*.jsonl``): each row carries the process id and
how long that process has been alive (``alive_s``), so every incarnation of a restarted role is
counted. :func:`collect_usage` folds the rows into :class:`Usage` (physical quantities);
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
* ``zero_advantage`` — generation and training cost of groups whose rewards were all equal (no signal);
* ``masked_tokens`` — training cost of prompt and observation tokens (processed, not learned from);
* ``failed_env_calls`` — environment cost of calls the guard had to retry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.config import CostConfig

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


def _latest_per_process(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        if "event" in r or "pid" not in r:
            continue
        key = (str(r["role"]), int(r["pid"]))
        if key not in latest or r["time"] >= latest[key]["time"]:
            latest[key] = r
    return latest


def collect_usage(
    rows: list[dict[str, Any]],
    *,
    wall_seconds: float,
    stored_bytes: float = 0.0,
    lifetimes: dict[tuple[str, int], float] | None = None,
) -> Usage:
    """Fold the roles' metric rows (every incarnation of every role) into one :class:`Usage`.

    ``lifetimes`` — seconds each (role, pid) held its device, from launch to exit, as the orchestrator
    observed them — replaces the processes' self-reported ``alive_s`` (which misses interpreter start-up
    and the time after a process's last report). A process that died before reporting still counts.
    """
    u = Usage(wall_seconds=wall_seconds, stored_bytes=stored_bytes)
    roles: set[str] = set()

    def g(r: dict[str, Any], key: str) -> float:
        v = r.get(key)
        return float(v) if isinstance(v, (int, float)) else 0.0

    latest = _latest_per_process(rows)
    alive = dict(lifetimes) if lifetimes is not None else {k: g(r, "alive_s") for k, r in latest.items()}
    for key in alive:
        latest.setdefault(key, {"role": key[0]})
    for (role, pid), r in latest.items():
        if role != "trainer" and not role.startswith("rollout"):
            continue  # the orchestrator and the evaluator are not training devices
        roles.add(role)
        if role == "trainer":
            u.trainer_alive_s += alive.get((role, pid), 0.0)
            u.trainer_busy_s += g(r, "trainer/busy_seconds")
            u.tokens_trained += g(r, "trainer/tokens_trained")
            u.tokens_processed += g(r, "trainer/tokens_processed")
            u.tokens_truncated += g(r, "trainer/truncated_tokens")
            u.tokens_dropped_stale += g(r, "trainer/dropped_stale_tokens")
            u.tokens_dropped_other += g(r, "trainer/dropped_other_tokens")
            u.zero_adv_samples += g(r, "trainer/zero_adv_samples")
            u.zero_adv_tokens += g(r, "trainer/zero_adv_tokens")
            u.zero_adv_model_tokens += g(r, "trainer/zero_adv_model_tokens")
            u.weight_bytes += g(r, "trainer/bytes_published")
            u.samples_trained += g(r, "trainer/samples_trained")
            u.queue_bytes = max(u.queue_bytes, g(r, "queue/bytes_in"))
        elif role.startswith("rollout"):
            u.rollout_alive_s += alive.get((role, pid), 0.0)
            u.rollout_busy_s += g(r, "rollout/gen_busy_seconds")
            u.tokens_generated += g(r, "rollout/tokens")
            u.samples_generated += g(r, "rollout/episodes")
            u.env_calls += g(r, "rollout/env_calls")
            u.env_seconds += g(r, "rollout/env_seconds")
            u.env_retries += g(r, "rollout/env_retries")
            u.weight_bytes += g(r, "rollout/weight_bytes_loaded")
            u.reward_s += g(r, "cost/reward_seconds")
            u.reward_cache_hits += g(r, "cost/reward_cache_hits")
            u.reward_cache_misses += g(r, "cost/reward_cache_misses")
    u.devices = len(roles)
    return u


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
    zero_adv_masked = max(0.0, u.zero_adv_tokens - u.zero_adv_model_tokens)
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


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Every role's metric rows (``run_dir/metrics/*.jsonl``)."""
    from asyncrl.telemetry.jsonl import read_jsonl_dir

    return read_jsonl_dir(run_dir / "metrics")


def stored_bytes(run_dir: Path) -> float:
    return float(sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file()))
