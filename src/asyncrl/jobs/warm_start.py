"""Warm start: supervised training on (deliberately imperfect) reference-solver demonstrations.

RL needs a starting policy that already knows the format — tool-call syntax, when to answer —
but still makes mistakes, so there is room to improve. The built-in environments' reference
solvers produce demonstrations; a configurable share carries one plausible mistake (wrong
operand, skipped tool call, wrong final copy). Each demonstration is *played through the
environment*, so observations are the environment's real output, tokenised with the same
template the episode runner uses, and the loss covers only the model's tokens.

Demonstrations are rendered the way episodes are (:mod:`asyncrl.policy.chat`): for a pretrained
model in its own chat template, with each demonstrated action written in the model's tool-call
format. Its defaults follow the model kind (``trainer.sft``; a pretrained model needs tens of
steps at a small learning rate, or none).

The result is cached under ``cache_dir/warmstart-{hash}`` keyed by the model settings, the
model's chat template, the tool-call format, the environment's settings and the source code of
its module, and the resolved SFT settings, so a second run with the same config reuses it and
an edited environment does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel

from asyncrl.bootstrap import pinned_threads, torch_threads
from asyncrl.config import EnvConfig, GuardConfig, NoLatencyConfig, RunConfig, config_hash
from asyncrl.envs import make_env, make_task_source
from asyncrl.envs.class_tools import load_object
from asyncrl.envs.registry import env_class
from asyncrl.errors import UserError
from asyncrl.policy.chat import make_renderer
from asyncrl.records import Task
from asyncrl.rollout.heldout import evaluate_policy
from asyncrl.trainer.master import MasterWeights

if TYPE_CHECKING:
    from collections.abc import Callable

    from asyncrl.envs.base import Environment
    from asyncrl.policy.chat import Renderer
    from asyncrl.policy.model import Policy

TEMPLATE_VERSION = 3
"""Bump when the token template changes: it invalidates cached warm starts."""


TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json", "tokenizer.json", "generation_config.json")
"""The model directory's files that decide how demonstrations are tokenised (part of the cache key)."""


@dataclass
class WarmStartResult:
    path: Path
    heldout_success: float
    seconds: float
    cached: bool
    report: dict[str, Any]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def env_code_version(cfg: RunConfig) -> str:
    """Hash of the source of the environment's module (a plugin or a built-in; a mix: and every member's)
    and of the module of a ``demonstrator`` function."""

    envs = [cfg.env, *(m.env for m in cfg.env.mix or [])]
    objects: list[Any] = [env_class(env) for env in envs]
    objects += [load_object(spec, "demonstrator") for env in envs if (spec := _demonstrator(env))]
    sources = []
    for obj in objects:  # the environment's module and the user's demonstrator's: editing either counts
        try:
            sources.append(inspect.getsource(sys.modules[obj.__module__]))
        except (OSError, TypeError, KeyError):  # no source available (e.g. a compiled module)
            sources.append(f"{obj.__module__}.{obj.__qualname__}")
    return _digest("\0".join(sources).encode())


def _demonstrator(env: EnvConfig) -> str | None:
    """The ``demonstrator`` function an environment's section names, if any."""
    for section in (env.dataset, env.reasoning_gym, env.class_env):
        if section is not None and section.demonstrator:
            return section.demonstrator
    return None


def chat_template_version(cfg: RunConfig) -> str:
    """Hash of the model directory's tokenizer and chat-template files (nothing for built models)."""
    if cfg.model.path is None:
        return "built"
    p = Path(cfg.model.path)
    return _digest(b"\0".join((p / name).read_bytes() for name in TEMPLATE_FILES if (p / name).is_file()))


def warm_start_key(cfg: RunConfig) -> str:
    # latency and the guard's timeout do not change demonstrations: the key holds the defaults of both
    guard = cfg.env.guard.model_copy(update={"step_timeout_s": GuardConfig().step_timeout_s})
    env = cfg.env.model_copy(update={"latency": NoLatencyConfig(), "guard": guard})
    model = cfg.model.model_copy(update={"device": "auto"})  # placement does not change the result's meaning
    sft = cfg.trainer.sft.resolved(cfg.model.is_pretrained, cfg.model.lora is not None)
    versions = f"{chat_template_version(cfg)}-{env_code_version(cfg)}"
    parts: list[BaseModel] = [model, env, sft]
    if sft.plays_rounds:  # rounds play with the run's sampling and measure pass@G
        parts.append(cfg.rollout.sampling)
        versions += f"-g{cfg.rollout.group_size}"
    return config_hash(*parts) + f"-{_digest(versions.encode())[:8]}-t{TEMPLATE_VERSION}"


async def _play(
    env: Environment, task: Task, texts: list[str], renderer: Renderer
) -> list[tuple[list[int], list[int]]]:
    """Play scripted model turns (canonical actions) through the environment, rendered as the
    episode runner renders them; return the samples as (token ids, loss mask): one for the
    episode (``multi_turn: bridge``), or one per turn (``per_turn``: the template's own rendering
    of the chat so far + the turn)."""
    tools = list(env.tools)
    conv = renderer.start(await env.reset(task), tools)
    prompt = list(conv.ids)
    ids, mask = list(prompt), [0] * len(prompt)
    per_turn: list[tuple[list[int], list[int]]] = []
    for text in texts:
        turn = renderer.demo_turn(text, tools)
        renderer.add_model_turn(conv, turn)
        per_turn.append((prompt + turn, [0] * len(prompt) + [1] * len(turn)))
        ids, mask = ids + turn, mask + [1] * len(turn)
        result = await env.step(text)
        if result.done:
            break
        if renderer.multi_turn == "per_turn":
            prompt = renderer.next_prompt(conv, result.observation)
            renderer.add_observation(conv, result.observation, [])
            continue
        obs = renderer.observation(conv, result.observation)
        renderer.add_observation(conv, result.observation, obs)
        ids, mask = ids + obs, mask + [0] * len(obs)
    return per_turn if renderer.multi_turn == "per_turn" else [(ids, mask)]


def build_demonstrations(
    cfg: RunConfig, renderer: Renderer, max_context: int, faults: list[str] | None = None
) -> list[tuple[list[int], list[int]]]:
    """The environment's demonstrations played through it as SFT samples. A demonstration whose
    environment or demonstrator raises (a ``reset`` failing past the guard's retries) is skipped and
    its error appended to ``faults``."""
    faults = [] if faults is None else faults
    sft = cfg.trainer.sft.resolved(cfg.model.is_pretrained, cfg.model.lora is not None)
    rng = random.Random(sft.seed)
    from asyncrl.envs.mix import MixTaskSource

    source = make_task_source(cfg.env)
    # a mix draws its demonstrations by the members' shares of the warm start (env.mix[].sft_share)
    draw = source.for_warm_start().sample if isinstance(source, MixTaskSource) else source.sample
    env_cfg = cfg.env.model_copy(update={"latency": NoLatencyConfig()})  # demonstrations need no delays
    env = make_env(env_cfg, sft.seed)
    demonstrate = getattr(env, "demonstrate", None)
    if demonstrate is None:
        raise UserError(
            f"environment {cfg.env.kind!r} has no reference solver (demonstrate) to warm-start from "
            "demonstrations: set trainer.sft.source: rollouts (or auto) to warm-start from the policy's own episodes"
        )

    async def all_demos() -> list[tuple[list[int], list[int]]]:
        out = []
        for _ in range(sft.num_demos):
            task = draw(rng)
            try:
                samples = await _play(env, task, demonstrate(task, rng, sft.corruption_rate), renderer)
            except UserError:  # a mistake in the config (a demonstrator's path, its return type): one line
                raise
            except Exception as exc:  # the user's environment or demonstrator: counted, skipped, reported
                faults.append(f"task {task.id}: {type(exc).__name__}: {exc}")
                continue
            for ids, mask in samples:
                if len(ids) <= max_context:
                    out.append((ids, mask))
        return out

    return asyncio.run(all_demos())


def sft_loss(
    model: Any,
    batch: list[tuple[list[int], list[int]]],
    pad_id: int,
    chunk_tokens: int = 0,
    share_prefixes: bool = False,
) -> torch.Tensor:
    """Mean next-token cross-entropy over the model's tokens (loss mask 1) of a right-padded batch.

    ``loss = −Σ_{b,t} m[b,t] · log p(x[b,t] | x[b,<t]) / Σ m``. The log-probs come from
    :func:`~asyncrl.policy.scoring.token_logprobs` with ``chunk_tokens``
    (``trainer.logits_chunk_tokens``): no ``[B, T, V]`` logits for a pretrained vocabulary, and the
    LM head only at the loss positions. ``share_prefixes`` (``trainer.share_prefixes``): demonstrations
    that share a prefix (the system prompt) forward it once when that saves compute
    (:func:`~asyncrl.policy.packing.shared_microbatches`)."""
    from asyncrl.policy.packing import shared_microbatches
    from asyncrl.policy.scoring import can_chunk_logits, decoder_layer_shape, token_logprobs

    pad, dev = torch.nn.utils.rnn.pad_sequence, next(model.parameters()).device
    ids = pad([torch.tensor(x) for x, _ in batch], batch_first=True, padding_value=pad_id).to(dev)
    mask = pad([torch.tensor(m, dtype=torch.float32) for _, m in batch], batch_first=True).to(dev)
    attn = pad([torch.ones(len(x), dtype=torch.long) for x, _ in batch], batch_first=True).to(dev)
    share = (
        share_prefixes
        and can_chunk_logits(model)
        and shared_microbatches(ids, attn.sum(1), 0, decoder_layer_shape(model)) is not None
    )
    lp = token_logprobs(  # lp[:, 0] = 0 (no context)
        model, ids, attn, chunk_tokens=chunk_tokens, positions=mask > 0, share_prefixes=share
    )
    m = mask[:, 1:] * attn[:, 1:]
    loss: torch.Tensor = -(lp[:, 1:] * m).sum() / m.sum().clamp(min=1.0)
    return loss


def train_sft(
    cfg: RunConfig,
    policy: Policy,
    demos: list[tuple[list[int], list[int]]],
    progress: bool | float = False,
    steps: int | None = None,
) -> list[float]:
    """``trainer.sft``'s optimiser steps on ``demos`` (``steps``: that many instead)."""
    sft = cfg.trainer.sft.resolved(cfg.model.is_pretrained, cfg.model.lora is not None)
    if steps is not None:
        sft = sft.model_copy(update={"steps": steps})
    rng = random.Random(sft.seed + 1)
    torch.manual_seed(sft.seed)
    model = policy.model
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapter alone
    master = MasterWeights(trainable)  # bfloat16 weights: stepped through float32 masters, as the trainer
    opt = torch.optim.AdamW(master.params, lr=sft.lr, weight_decay=0.0)
    warmup = max(1, sft.steps // 20)

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay to 10%
        if step < warmup:
            return sft.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, sft.steps - warmup)
        return sft.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    losses: list[float] = []
    with progress_bar(progress) as bar:
        task_id = bar.add_task("warm start (SFT)", total=sft.steps) if bar else None
        for step in range(sft.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            batch = rng.sample(demos, min(sft.batch_size, len(demos)))
            tc = cfg.trainer
            loss = sft_loss(
                model, batch, policy.tokenizer.pad_token_id, tc.logits_chunk_tokens, tc.share_prefixes
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            master.grads_in()
            torch.nn.utils.clip_grad_norm_(master.params, 1.0)
            opt.step()
            master.weights_out()
            losses.append(float(loss.detach()))
            if bar:
                bar.update(task_id, advance=1, description=f"warm start (SFT) loss {loss.item():.3f}")
    model.train(False)  # eval mode (PreTrainedModel.eval is untyped)
    return losses


class _PlainProgress(contextlib.AbstractContextManager["_PlainProgress"]):
    """``--no-display``: one plain line every ``every_s`` seconds (and at the end), for logs and CI."""

    def __init__(self, every_s: float) -> None:
        self.every_s, self.last, self.done, self.total = every_s, time.monotonic(), 0, 0

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


def progress_bar(enabled: bool | float) -> Any:
    """``True``: a rich progress bar; a number: plain lines every that many seconds; ``False``: none."""
    if enabled is not True and enabled:
        return _PlainProgress(float(enabled))
    if not enabled:
        return contextlib.nullcontext()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()
    )


def uses_demonstrations(cfg: RunConfig) -> bool:
    """Whether the warm start trains on the environment's demonstrations: always with ``source: demos``
    (an environment without any is then an error), with ``auto`` where it has some."""
    source = cfg.trainer.sft.source
    return source == "demos" or (source == "auto" and has_demonstrations(cfg.env))


def has_demonstrations(env: EnvConfig) -> bool:
    """The environment (every member of a mix) can demonstrate its tasks: a ``demonstrate`` method
    (``env.kind: class``: with ``class_env.demo_field`` set)."""
    if env.kind == "mix":  # a member with no share of the warm start (sft_share: 0) is not asked
        return all(has_demonstrations(m.env) for m in env.mix or [] if m.sft_share != 0)
    c = env.class_env
    if c is not None:  # the row's demo_field or the demonstrator (DemoClassEnv), never ClassEnv's methods
        return c.demo_field is not None or c.demonstrator is not None
    return callable(getattr(env_class(env), "demonstrate", None))


def _demonstrations(
    cfg: RunConfig, policy: Policy, faults: list[str], say: Callable[[str], None]
) -> list[tuple[list[int], list[int]]]:
    """:func:`build_demonstrations`, with the ones that faulted reported; too few left is one error."""
    from asyncrl.policy.model import context_limit

    sft = cfg.trainer.sft.resolved(cfg.model.is_pretrained, cfg.model.lora is not None)
    demos = build_demonstrations(
        cfg, make_renderer(cfg.model, policy), context_limit(cfg.model, policy), faults
    )
    if faults:
        say(
            f"warm start: {len(faults)} of {sft.num_demos} demonstrations faulted and were skipped ({faults[0]})"
        )
    if faults and len(demos) < sft.batch_size:
        raise UserError(
            f"the warm start has {len(demos)} demonstration samples left (fewer than trainer.sft.batch_size "
            f"{sft.batch_size}): {len(faults)} of {sft.num_demos} faulted, the first with {faults[0]}; fix the "
            "environment, or warm-start from the policy's own episodes (trainer.sft.source: rollouts)"
        )
    return demos


def _say(progress: bool | float) -> Callable[[str], None]:
    """Where the warm start's one-line reports go: stdout when it shows progress, nowhere otherwise."""
    return (lambda line: print(line, flush=True)) if progress else (lambda _: None)


def warm_start(
    cfg: RunConfig, *, force: bool = False, progress: bool | float = False, eval_limit: int | None = None
) -> WarmStartResult:
    """Return the cached warm-start policy for ``cfg``, training it first if needed."""
    from asyncrl.policy import Policy

    out = Path(cfg.cache_dir) / f"warmstart-{warm_start_key(cfg)}"
    meta_path = out / "warmstart.json"
    if meta_path.is_file() and not force:
        meta = json.loads(meta_path.read_text())
        return WarmStartResult(out, meta["heldout_success"], meta["seconds"], True, meta["eval"])

    t0 = time.perf_counter()
    policy = Policy.from_config(cfg.model).to(cfg.model.device)
    sft = cfg.trainer.sft.resolved(cfg.model.is_pretrained, cfg.model.lora is not None)
    say = _say(progress)
    faults: list[str] = []
    demos = _demonstrations(cfg, policy, faults, say) if sft.steps and uses_demonstrations(cfg) else []
    with pinned_threads(torch_threads(cfg, "warm_start")):  # nothing else computes yet: every core
        losses = train_sft(cfg, policy, demos, progress=progress) if demos else []
        rounds = None
        if sft.plays_rounds:  # rollouts, or auto's rounds after the demonstrations
            from asyncrl.jobs.warm_rollouts import rollout_rounds

            tune = lambda samples, n: train_sft(cfg, policy, samples, progress, n)  # noqa: E731
            rounds = rollout_rounds(cfg, policy, make_task_source(cfg.env), tune, say)
        train_seconds = time.perf_counter() - t0
        report = evaluate_policy(cfg, policy, limit=eval_limit, seed=cfg.seed)
    seconds = time.perf_counter() - t0
    policy.save(out)
    meta = {
        "heldout_success": report["success_rate"],
        "seconds": seconds,
        "train_seconds": train_seconds,
        "source": sft.source,
        "demos": len(demos),
        "demo_faults": len(faults),
        "demo_fault_examples": faults[:3],
        "rollouts": rounds.as_dict() if rounds else None,
        "final_loss": sum(losses[-10:]) / max(1, len(losses[-10:])),
        "first_loss": losses[0] if losses else None,
        "key": warm_start_key(cfg),
        "eval": report,
    }
    meta_path.write_text(json.dumps(meta, indent=2))
    return WarmStartResult(out, report["success_rate"], seconds, False, report)
