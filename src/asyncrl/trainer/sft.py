"""Warm start: supervised training on (deliberately imperfect) reference-solver demonstrations.

RL needs a starting policy that already knows the format — tool-call syntax, when to answer —
but still makes mistakes, so there is room to improve. The built-in environments' reference
solvers produce demonstrations; a configurable share carries one plausible mistake (wrong
operand, skipped tool call, wrong final copy). Each demonstration is *played through the
environment*, so observations are the environment's real output, tokenised with the same
template the episode runner uses, and the loss covers only the model's tokens.

The result is cached under ``cache_dir/warmstart-{hash}`` keyed by the model, environment and
SFT settings, so a second run with the same config reuses it.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from asyncrl.config import RunConfig, config_hash
from asyncrl.records import Task

TEMPLATE_VERSION = 1
"""Bump when the token template changes: it invalidates cached warm starts."""


@dataclass
class WarmStartResult:
    path: Path
    heldout_success: float
    seconds: float
    cached: bool
    report: dict[str, Any]


def warm_start_key(cfg: RunConfig) -> str:
    env = cfg.env.model_copy(deep=True)
    env.latency.kind, env.guard.step_timeout_s = "none", 10.0  # latency does not change demonstrations
    model = cfg.model.model_copy(update={"device": "auto"})  # placement does not change the result's meaning
    return config_hash(model, env, cfg.trainer.sft) + f"-t{TEMPLATE_VERSION}"


async def _play(env: Any, task: Task, texts: list[str], template: Any) -> tuple[list[int], list[int]]:
    """Play scripted model turns through the environment; return token ids and loss mask."""
    ids = template.prompt(await env.reset(task))
    mask = [0] * len(ids)
    for text in texts:
        turn = template.encode_text(text)
        ids += turn
        mask += [1] * len(turn)
        result = await env.step(text)
        if result.done:
            break
        obs = template.observation(result.observation)
        ids += obs
        mask += [0] * len(obs)
    return ids, mask


def build_demonstrations(cfg: RunConfig, template: Any) -> list[tuple[list[int], list[int]]]:
    from asyncrl.envs import make_env, make_task_source

    sft = cfg.trainer.sft
    rng = random.Random(sft.seed)
    source = make_task_source(cfg.env)
    env_cfg = cfg.env.model_copy(deep=True)
    env_cfg.latency.kind = "none"
    env = make_env(env_cfg, sft.seed)
    demonstrate = getattr(env, "demonstrate", None)
    if demonstrate is None:
        from asyncrl.errors import UserError

        raise UserError(
            f"environment {cfg.env.kind!r} has no reference solver (demonstrate); cannot warm-start"
        )

    async def all_demos() -> list[tuple[list[int], list[int]]]:
        out = []
        for _ in range(sft.num_demos):
            task = source.sample(rng)
            texts = demonstrate(task, rng, sft.corruption_rate)
            ids, mask = await _play(env, task, texts, template)
            if len(ids) <= cfg.model.max_context:
                out.append((ids, mask))
        return out

    return asyncio.run(all_demos())


def sft_loss(model: Any, batch: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Mean next-token cross-entropy over the model's tokens (loss mask 1) of a right-padded batch."""
    T = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), T), dtype=torch.float32)
    attn = torch.zeros((len(batch), T), dtype=torch.long)
    for i, (x, xm) in enumerate(batch):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(xm)] = torch.tensor(xm, dtype=torch.float32)
        attn[i, : len(x)] = 1
    dev = next(model.parameters()).device
    ids, mask, attn = ids.to(dev), mask.to(dev), attn.to(dev)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    target, m = ids[:, 1:], mask[:, 1:]
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="none"
    )
    loss: torch.Tensor = (nll.view_as(m) * m).sum() / m.sum().clamp(min=1.0)
    return loss


def train_sft(
    cfg: RunConfig, policy: Any, demos: list[tuple[list[int], list[int]]], progress: bool | float = False
) -> list[float]:
    sft = cfg.trainer.sft
    rng = random.Random(sft.seed + 1)
    torch.manual_seed(sft.seed)
    model = policy.model
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=0.0)
    warmup = max(1, sft.steps // 20)

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay to 10%
        if step < warmup:
            return sft.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, sft.steps - warmup)
        return sft.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    losses: list[float] = []
    ctx = _progress(progress, sft.steps)
    with ctx as bar:
        task_id = bar.add_task("warm start (SFT)", total=sft.steps) if bar else None
        for step in range(sft.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            batch = rng.sample(demos, min(sft.batch_size, len(demos)))
            loss = sft_loss(model, batch, policy.tokenizer.pad_token_id)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.detach()))
            if bar is not None and task_id is not None:
                bar.update(task_id, advance=1, description=f"warm start (SFT) loss {loss.item():.3f}")
    model.eval()
    return losses


class _NoProgress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _PlainProgress:
    """``--no-display``: one plain line every ``every_s`` seconds (and at the end), for logs and CI."""

    def __init__(self, every_s: float) -> None:
        self.every_s, self.last, self.done, self.total = every_s, time.monotonic(), 0, 0

    def __enter__(self) -> _PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        print(f"warm start (SFT): step {self.done}/{self.total} done", flush=True)

    def add_task(self, description: str, total: int) -> int:
        self.total = total
        return 0

    def update(self, task_id: int, advance: int, description: str) -> None:
        self.done += advance
        if time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            print(f"{description}: step {self.done}/{self.total}", flush=True)


def _progress(enabled: bool | float, total: int) -> Any:
    """``True``: a rich progress bar; a number: plain lines every that many seconds; ``False``: none."""
    if enabled is not True and enabled:
        return _PlainProgress(float(enabled))
    if not enabled:
        return _NoProgress()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()
    )


def warm_start(
    cfg: RunConfig, *, force: bool = False, progress: bool | float = False, eval_limit: int | None = None
) -> WarmStartResult:
    """Return the cached warm-start policy for ``cfg``, training it first if needed."""
    from asyncrl.policy import Policy
    from asyncrl.rollout.episode import ChatTemplate
    from asyncrl.rollout.evaluate import evaluate_policy

    out = Path(cfg.cache_dir) / f"warmstart-{warm_start_key(cfg)}"
    meta_path = out / "warmstart.json"
    if meta_path.is_file() and not force:
        meta = json.loads(meta_path.read_text())
        return WarmStartResult(out, meta["heldout_success"], meta["seconds"], True, meta["eval"])

    t0 = time.perf_counter()
    policy = (Policy.load(cfg.model.path) if cfg.model.path else Policy.build(cfg.model)).to(cfg.model.device)
    template = ChatTemplate(policy.tokenizer)
    demos = build_demonstrations(cfg, template)
    losses = train_sft(cfg, policy, demos, progress=progress)
    train_seconds = time.perf_counter() - t0
    report = evaluate_policy(cfg, policy, limit=eval_limit, seed=cfg.seed)
    seconds = time.perf_counter() - t0
    policy.save(out)
    meta = {
        "heldout_success": report["success_rate"],
        "seconds": seconds,
        "train_seconds": train_seconds,
        "demos": len(demos),
        "final_loss": sum(losses[-10:]) / max(1, len(losses[-10:])),
        "first_loss": losses[0] if losses else None,
        "key": warm_start_key(cfg),
        "eval": report,
    }
    meta_path.write_text(json.dumps(meta, indent=2))
    return WarmStartResult(out, report["success_rate"], seconds, False, report)
