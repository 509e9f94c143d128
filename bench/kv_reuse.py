"""Multi-turn KV reuse: the same calculator episodes on the real model with the prefix cache off and on.

    PYTHONPATH=src python bench/kv_reuse.py [--model .cache/models/smollm2-135m-instruct]
        [--episodes 8] [--turns 3] [--max-new-tokens 32] [--repeats 1] [--threads 1]

Every episode runs exactly ``--turns`` model turns: the untrained 135M model mostly answers in
plain text at once, which ends a calculator episode, so an answer is met with a nudge observation
(``NUDGE``) instead, as a tool result would be. The bench measures the engine, not the model.

Runs ``--episodes`` held-out calculator tasks (SmolLM2-135M-Instruct by default, in its own chat
template with the tool-call format its renderer uses) through the episode runner and the built-in
engine, once per mode and ``--repeats`` times, the modes interleaved (off, on, off, on, ...) so a
busy shared machine slows both alike. Every run uses the same seed: the episodes are the same, and
the script reports how many sampled tokens agree between the modes and the largest log-prob gap.
Prints one JSON object: per mode, the per-episode prefill / decode / generation seconds (median
over repeats), prefill tokens computed and reused; and the on/off ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

NUDGE = "Check each step with the calc tool, then give the final answer again."


class KeepGoing:
    """The calculator environment, except that an answer does not end the episode (see above)."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.tools = getattr(env, "tools", None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    async def step(self, action: Any) -> Any:
        result = await self.env.step(action)
        return replace(result, observation=NUDGE, done=False, info={}) if result.done else result


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".cache/models/smollm2-135m-instruct")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_args()


async def episodes(
    cfg: Any, policy: Any, tasks: list[Any], prefix_cache: bool
) -> tuple[list[Any], Any, float]:
    """Run one episode per task on a fresh engine (as ``rollout.heldout.run_episodes`` does)."""
    from asyncrl.config.run import quiet_env
    from asyncrl.engine import make_engine
    from asyncrl.engine.batcher import TurnBatcher
    from asyncrl.envs import make_env
    from asyncrl.policy.chat import make_renderer
    from asyncrl.policy.model import context_limit
    from asyncrl.records import SamplingParams
    from asyncrl.rollout.episode import EpisodeSettings, run_episode

    renderer = make_renderer(cfg.model, policy)
    assert cfg.rollout.engine.kind == "hf", "the prefix cache is the built-in engine's"
    engine_cfg = cfg.rollout.engine.model_copy(update={"prefix_cache": prefix_cache})
    engine = make_engine(engine_cfg, policy, renderer.stop_token_ids, seed=cfg.seed)
    batcher = TurnBatcher.of(engine, engine_cfg)
    s = cfg.rollout.sampling
    settings = EpisodeSettings(
        max_turns=cfg.env.max_turns,
        max_context=context_limit(cfg.model, policy),
        sampling=SamplingParams(temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens),
        worker_id="bench",
        early_stop_invalid=0,
    )
    env_cfg = quiet_env(cfg.env)
    t0 = time.perf_counter()
    try:
        episodes = await asyncio.gather(
            *(
                run_episode(t, KeepGoing(make_env(env_cfg, cfg.seed + i)), batcher, renderer, settings)
                for i, t in enumerate(tasks)
            )
        )
        trajs = [t for samples in episodes for t in samples]
    finally:
        batcher.close()
    return list(trajs), engine, time.perf_counter() - t0


def model_turns(trajs: list[Any]) -> list[Any]:
    return [u for t in trajs for u in t.turns if u.role == "model"]


def main() -> None:
    args = parse()
    import torch

    from asyncrl.config import load_config
    from asyncrl.policy import Policy
    from asyncrl.rollout.heldout import heldout_tasks

    torch.set_num_threads(args.threads)
    model = Path(args.model).resolve()
    cfg = load_config(
        "configs/calculator.yaml",
        [
            f"model.path={model}",
            f"env.max_turns={args.turns}",
            f"rollout.sampling.max_new_tokens={args.max_new_tokens}",
            f"rollout.concurrent_episodes={args.episodes}",
        ],
    )
    policy = Policy.load(model, cfg=cfg.model)
    tasks = heldout_tasks(cfg, limit=args.episodes)
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    outputs: dict[str, list[Any]] = {}
    for _ in range(args.repeats):
        for mode in ("off", "on"):
            trajs, engine, wall = asyncio.run(episodes(cfg, policy, tasks, prefix_cache=mode == "on"))
            outputs[mode] = trajs
            n = len(trajs)
            runs[mode].append(
                {
                    "wall_s_per_episode": wall / n,
                    "prefill_s_per_episode": engine.prefill_seconds / n,
                    "decode_s_per_episode": engine.decode_seconds / n,
                    "cache_bookkeeping_s_per_episode": engine.prefix_cache_seconds / n,
                    "prefill_tokens_computed": engine.prefill_tokens_computed,
                    "prefill_tokens_reused": engine.prefill_tokens_reused,
                    "decode_steps": engine.decode_steps,
                    "model_turns": len(model_turns(trajs)),
                    "sampled_tokens": sum(len(u.token_ids) for u in model_turns(trajs)),
                }
            )
    off_turns, on_turns = model_turns(outputs["off"]), model_turns(outputs["on"])
    same = sum(a.token_ids == b.token_ids for a, b in zip(off_turns, on_turns, strict=False))
    gaps = [
        abs(x - y)
        for a, b in zip(off_turns, on_turns, strict=False)
        if a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs, strict=True)
    ]

    def median(mode: str) -> dict[str, float]:
        return {k: round(statistics.median(r[k] for r in runs[mode]), 4) for k in runs[mode][0]}

    off, on = median("off"), median("on")
    ratio = {
        k: round(on[k] / off[k], 3)
        for k in (
            "wall_s_per_episode",
            "prefill_s_per_episode",
            "decode_s_per_episode",
            "prefill_tokens_computed",
        )
        if off[k]
    }
    print(
        json.dumps(
            {
                "bench": "kv_reuse",
                "date": datetime.now(UTC).strftime("%Y-%m-%d"),
                "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
                "torch_threads": args.threads,
                "model": model.name,
                "episodes": args.episodes,
                "max_turns": args.turns,
                "max_new_tokens": args.max_new_tokens,
                "repeats": args.repeats,
                "off": off,
                "on": on,
                "on_over_off": ratio,
                "model_turns_compared": min(len(off_turns), len(on_turns)),
                "model_turns_identical": same,
                "max_abs_logprob_gap": max(gaps, default=0.0),
                "runs": runs,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
