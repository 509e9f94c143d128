"""Trainer tokens/s of one ``Learner.step`` on the real-model batch: all passes vs only the passes the loss needs.

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python bench/trainer_passes.py [--completions 16] [--threads 1]
        [--variants before,no_prox,loss_positions,after] [--repeats 3] [--out bench/results/trainer-passes.json]
    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python bench/trainer_passes.py \
        --config configs/smollm2_arithmetic.yaml [--batch-file PATH] [--rollout-seed 0] ...

Prints one JSON object. The batch is the ``make demo-real`` trainer's (``configs/smollm2_calculator.yaml``:
SmolLM2-135M-Instruct, float32, LoRA rank 16 on every projection, the memory-lean settings —
gradient checkpointing, 2,048-token micro-batches, 256-token logit chunks — and ppo_clip):
``completions / 4`` calculator tasks rendered with the model's chat template and tools (~213 tokens
each), each followed by 4 completions of 48 tokens (random ids from the prompts' tokens, behaviour
log-probs −1, rewards 1, 0, 1, 0 in each group so every token has an advantage). The variants, each a
fresh ``Learner`` on the same adapter weights, each step in a process forked from the loaded policy
(with the variant's ``launcher.malloc_mmap_threshold_kb``, as a role process sets it):

* ``before``: what the learner did before issue #26 — a proximal pass every step, the LM head and
  log-softmax at every position, the padded ``[B, T]`` layout (``AllPasses`` below);
* ``no_prox``: ``before`` without the proximal pass (ppo_clip does not read it);
* ``loss_positions``: also the LM head at the loss positions only;
* ``after``: ``Learner`` as it is (also the prefix-shared forward, ``trainer.share_prefixes``).

Per variant: wall and CPU seconds of the step (on a shared machine the CPU seconds of the one
thread are the steadier figure; both ratios are reported), real tokens/s (prompt + completion tokens of the batch / step
seconds, the figure the issue quotes) and that work as a share of the machine's measured matmul
ceiling: ``tokens/s × 4·P / ceiling`` with ``P`` the policy's parameters (a LoRA step's useful work
per token: a forward, ``2P``, and a backward through the activations, ``2P``; no weight gradients
for the frozen base) and the ceiling the GFLOP/s of a 2048² float32 ``torch.mm`` on the same threads
(measured before and after every variant; the best single call). ``ceiling_share_cpu`` is the same
with the step's CPU seconds and the matmul's CPU-time ceiling (the figures to read on a shared
machine, where wall time counts the other jobs too). ``after`` can pass 100%: it computes less
than the padded batch's work.

``executed_share`` (and ``executed_share_cpu``) is the other way round (issue #37 item 2): the FLOPs
the variant's step actually runs — an estimate from its real micro-batch layout, :func:`executed_flops`
— per second of the step, as a share of the same ceiling. It cannot pass 100% (the padding, the
trie's dense attention, the recomputation under checkpointing all count). ``--estimate-only`` prints
the variants' micro-batches and estimates (linear layers, attention, head) without running a step;
``--profile`` one step of each under ``torch.profiler`` (self CPU time by kind of op, the top ops).
``decoder_shape_gflops_wall_cpu``: the same gauge at the decoder's own linear shapes (as many rows as
the batch's trie has nodes, :func:`shape_gflops`), the rate these layers can reach at all.
``peak_rss_mb``: the process's resident high-water mark during the step (reset before it; the
model's weights included), ``rss_before_mb`` the resident memory just before it (what earlier
variants left to the allocator counts in both: for one variant's own peak run it alone, first).

``--config`` (issue #35 item 7, #37 item 2): the step on that config's OWN batch instead of the
synthetic one — real rollouts: ``trainer.batch_size / rollout.group_size`` distinct training tasks,
each played ``group_size`` times by the config's warm-start policy (:func:`asyncrl.jobs.warm_start.warm_start`,
built or read from the cache) through :func:`asyncrl.rollout.heldout.run_episodes` on the training
environment, so the rows carry the real multi-turn layout (system prompt, task, model turn, tool
result, model turn), the real behaviour log-probs and rewards. The batch is written to
``--batch-file`` (MessagePack of the project's records, :class:`SavedBatch`) on the first run and read
back on every later one, so runs and variants train on the identical batch; the variants' config is
that file's, with its own trainer settings (checkpointing, micro-batch tokens, logit chunks), and
the policy is the warm start (its adapter restored between variants). Extra variants for the gap to
the ceiling (``after_no_ckpt``, ``after_mb0``, ``after_mb640``, ``after_chunk0``, ``after_chunk1k``,
``after_no_mmap``, see :data:`VARIANTS`) change one setting of ``after`` each; ``after_speed`` turns
both memory-lean settings off (checkpointing and the allocator's mmap threshold);
``after_speed_dense``, ``after_speed_unfused`` and ``after_speed_dense_unfused`` take issue #37's two
trainer kernels out of ``after_speed`` (:data:`PATCHES`): the trie's attention over the dense tree mask
instead of :mod:`asyncrl.policy.trie_attention`, the LM head's log-softmax through autograd instead of
the fused ``asyncrl.policy.scoring._HeadScores``. ``--warmup N`` runs N untimed steps before the timed
one in each child (a run's steps are warm; the first step of a process pays first-call costs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import msgspec
import torch

from asyncrl.config import RunConfig, load_config
from asyncrl.policy import Policy
from asyncrl.policy.chat import make_renderer
from asyncrl.policy.trie_attention import TriePlan, trie_plan
from asyncrl.records import Group, SamplingParams, Task, Trajectory, Turn, decode, encode, groups_of, members
from asyncrl.trainer.learner import Batch, Learner, _Part

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "smollm2_calculator.yaml"
GROUP, NEW_TOKENS = 4, 48


class AllPasses(Learner):
    """The learner before issue #26: every pass, every position, padded rows (``share_prefixes`` off)."""

    def _proximal(self, b: Batch, first: torch.Tensor) -> torch.Tensor | None:
        return self._logprobs(self.parallel.scorer, b)

    def _positions(self, b: Batch, part: _Part) -> torch.Tensor | None:
        return None


class NoProx(AllPasses):
    def _proximal(self, b: Batch, first: torch.Tensor) -> torch.Tensor | None:
        return Learner._proximal(self, b, first)


class LossPositions(NoProx):
    def _positions(self, b: Batch, part: _Part) -> torch.Tensor | None:
        return Learner._positions(self, b, part)


VARIANTS: dict[str, tuple[type[Learner], list[str]]] = {
    "before": (AllPasses, ["trainer.share_prefixes=false"]),
    "no_prox": (NoProx, ["trainer.share_prefixes=false"]),
    "loss_positions": (LossPositions, ["trainer.share_prefixes=false"]),
    "after": (Learner, []),
    # one trainer setting of ``after`` changed each (issue #37 item 2: where the gap to the ceiling is)
    "after_no_ckpt": (Learner, ["trainer.gradient_checkpointing=false"]),
    "after_mb0": (Learner, ["trainer.max_tokens_per_microbatch=0"]),  # one pass, whatever its size
    "after_chunk0": (Learner, ["trainer.logits_chunk_tokens=0"]),  # the plain (unchunked) head
    "after_chunk1k": (Learner, ["trainer.logits_chunk_tokens=1024"]),
    "after_mb640": (
        Learner,
        ["trainer.max_tokens_per_microbatch=640"],
    ),  # smaller tries: less dense attention
    # the allocator (issue #37 item 4): the config's ``launcher.malloc_mmap_threshold_kb`` and its
    # price in page faults; ``after_speed`` both memory-lean settings off
    "after_no_mmap": (Learner, ["launcher.malloc_mmap_threshold_kb=0"]),
    "after_speed": (
        Learner,
        ["trainer.gradient_checkpointing=false", "launcher.malloc_mmap_threshold_kb=0"],
    ),
    # issue #37's two trainer kernels taken out of ``after_speed`` (:data:`PATCHES`): the trie's attention
    # over the dense N x N tree mask, and the LM head's log-softmax unfused (autograd through each op)
    "after_speed_dense": (
        Learner,
        ["trainer.gradient_checkpointing=false", "launcher.malloc_mmap_threshold_kb=0"],
    ),
    "after_speed_unfused": (
        Learner,
        ["trainer.gradient_checkpointing=false", "launcher.malloc_mmap_threshold_kb=0"],
    ),
    "after_speed_dense_unfused": (
        Learner,
        ["trainer.gradient_checkpointing=false", "launcher.malloc_mmap_threshold_kb=0"],
    ),
}


def _dense(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: TriePlan, scale: float
) -> torch.Tensor:
    """The trie's attention as transformers' sdpa ran it over the dense ``N × N`` tree mask (the
    key/value heads repeated, a boolean mask): the same numbers, every pair computed."""
    n = query.shape[2]
    allowed = _DENSE_MASKS.get(id(plan))
    if allowed is None:
        allowed = torch.zeros(n, n, dtype=torch.bool)
        for (first, owned, at, length), mask in zip(plan.spans, plan.masks, strict=True):
            rows = plan.keys[at : at + length]
            causal = (
                torch.ones(owned, length, dtype=torch.bool).tril(length - owned) if mask is None else mask
            )
            allowed[first : first + owned, rows] = causal
        _DENSE_MASKS.clear()  # one plan per forward: its 30 layers share the mask
        _DENSE_MASKS[id(plan)] = allowed
    rep = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    return torch.nn.functional.scaled_dot_product_attention(
        query, k, v, attn_mask=allowed[None, None], scale=scale
    )


_DENSE_MASKS: dict[int, torch.Tensor] = {}


@contextlib.contextmanager
def dense_trie_attention() -> Iterator[None]:
    """Inside the block, trie forwards attend over the dense tree mask (:func:`_dense`)."""
    import asyncrl.policy.trie_attention as ta

    kept = ta.trie_attention
    ta.trie_attention = _dense
    try:
        yield
    finally:
        ta.trie_attention = kept
        _DENSE_MASKS.clear()


@contextlib.contextmanager
def unfused_head() -> Iterator[None]:
    """Inside the block, the LM head's chunks run unfused: autograd through each elementwise op, each
    chunk under activation checkpointing (``asyncrl.policy.scoring._head_scores`` for any other head)."""
    from asyncrl.policy import scoring

    kept = scoring._fusable
    scoring._fusable = lambda head: False
    try:
        yield
    finally:
        scoring._fusable = kept


PATCHES: dict[str, tuple[Any, ...]] = {
    "after_speed_dense": (dense_trie_attention,),
    "after_speed_unfused": (unfused_head,),
    "after_speed_dense_unfused": (dense_trie_attention, unfused_head),
}
"""Variants that run a kernel as it was before issue #37's trainer work (a context manager each)."""


@contextlib.contextmanager
def patched(name: str) -> Iterator[None]:
    """Variant ``name``'s :data:`PATCHES` applied inside the block."""
    with contextlib.ExitStack() as stack:
        for patch in PATCHES.get(name, ()):
            stack.enter_context(patch())
        yield


class SavedBatch(msgspec.Struct, kw_only=True):
    """A real batch of ``config`` as the bench saves it (``--batch-file``): the groups and where they
    came from."""

    config: str
    rollout_seed: int
    warm_start_key: str
    warm_start_heldout: float
    created: str
    groups: list[Group]


def matmul_gflops(seconds: float = 3.0, n: int = 2048) -> tuple[float, float]:
    """GFLOP/s of repeated ``n × n`` float32 ``torch.mm`` on this process's threads: the best call by
    wall time and by CPU time (on a shared machine a call is often descheduled mid-way, so the CPU
    figure is the core's own ceiling)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    wall = cpu = 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0, c0 = time.perf_counter(), time.process_time()
        torch.mm(a, b)
        wall = max(wall, 2 * n**3 / (time.perf_counter() - t0) / 1e9)
        cpu = max(cpu, 2 * n**3 / max(time.process_time() - c0, 1e-6) / 1e9)
    return wall, cpu


def shape_gflops(policy: Policy, tokens: int, seconds: float = 0.5) -> tuple[float, float]:
    """GFLOP/s of ``torch.mm`` at the decoder's own linear shapes (``tokens`` rows: q, k, v, o, gate, up,
    down) — by wall and by CPU time, each shape's best call, FLOP-weighted (total FLOPs / total time):
    the matmul rate this model's layers can reach at all, against the 2048² gauge."""
    c = policy.model.config
    h, inter = int(c.hidden_size), int(c.intermediate_size)
    kv = int(c.num_key_value_heads) * (getattr(c, "head_dim", None) or h // int(c.num_attention_heads))
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, inter), (h, inter), (inter, h)]
    flops = wall = cpu = 0.0
    for k, n in shapes:
        a, b = torch.randn(tokens, k), torch.randn(k, n)
        torch.mm(a, b)
        best_w = best_c = math.inf
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0, c0 = time.perf_counter(), time.process_time()
            torch.mm(a, b)
            best_w, best_c = (
                min(best_w, time.perf_counter() - t0),
                min(best_c, max(time.process_time() - c0, 1e-6)),
            )
        flops, wall, cpu = flops + 2.0 * tokens * k * n, wall + best_w, cpu + best_c
    return flops / wall / 1e9, flops / cpu / 1e9


def batch(cfg: RunConfig, policy: Policy, completions: int) -> list[Trajectory]:
    """``completions / 4`` calculator prompts × 4 completions of 48 tokens (see the module docstring)."""
    from asyncrl.envs.registry import make_raw_env, make_task_source

    renderer = make_renderer(cfg.model, policy)
    env, source = make_raw_env(cfg.env), make_task_source(cfg.env)
    rng, out = random.Random(0), []
    for g in range(completions // GROUP):
        task: Task = source.sample(rng)
        prompt = renderer.start(asyncio.run(env.reset(task)), list(env.tools or [])).ids
        for k in range(GROUP):
            done = [rng.choice(prompt) for _ in range(NEW_TOKENS)]
            turns = [
                Turn(role="env", token_ids=list(prompt)),
                Turn(role="model", token_ids=done, logprobs=[-1.0] * NEW_TOKENS, version=0),
            ]
            out.append(
                Trajectory(
                    id=f"t{g}-{k}",
                    task=task,
                    turns=turns,
                    final_reward=float(k % 2 == 0),
                    outcome="success" if k % 2 == 0 else "failure",
                    group_id=f"g{g}",
                    sampling=SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS),
                )
            )
    return out


def trie_figures(policy: Policy, trajs: list[Trajectory]) -> dict[str, float]:
    """Nodes of the batch's token trie and its estimated decoder FLOPs against the padded rows'."""
    from asyncrl.policy.packing import trie_counts
    from asyncrl.policy.scoring import decoder_layer_shape
    from asyncrl.trainer.learner import collate

    b = collate(trajs, policy.tokenizer.pad_token_id)
    lengths = b.attn.sum(1)
    nodes = trie_counts(b.ids, lengths)[0]
    layer = decoder_layer_shape(policy.model)
    padded = sum(layer.cost(int(n), int(n) ** 2) for n in lengths)
    return {"trie_nodes": nodes, "trie_flops_share": round(layer.cost(nodes, nodes * nodes) / padded, 3)}


def batch_figures(trajs: list[Trajectory]) -> dict[str, Any]:
    """The batch's shape: tokens, prompt tokens (each row's tokens before its first sampled one), the
    tokens in the loss (the model's), the non-loss share (prompt and tool results), rows' lengths."""
    masks = [t.loss_mask() for t in trajs]
    lengths = sorted(len(m) for m in masks)
    total, loss = sum(lengths), sum(sum(m) for m in masks)
    prompt = sum(m.index(1) if 1 in m else len(m) for m in masks)
    groups = groups_of(trajs)
    return {
        "rows": len(trajs),
        "groups": len(groups),
        "batch_tokens": total,
        "prompt_tokens": prompt,
        "prompt_tokens_per_row": round(prompt / len(trajs), 1),
        "loss_tokens": loss,
        "prompt_share": round(prompt / total, 3),
        "non_loss_share": round(1 - loss / total, 3),
        "row_tokens_min_median_max": [lengths[0], int(statistics.median(lengths)), lengths[-1]],
        "model_turns_per_row": round(
            sum(sum(u.role == "model" for u in t.turns) for t in trajs) / len(trajs), 2
        ),
        "reward_mean": round(sum(t.final_reward for t in trajs) / len(trajs), 3),
        "groups_with_reward_spread": sum(len({t.final_reward for t in g.members}) > 1 for g in groups),
    }


def real_batch(cfg: RunConfig, policy: Policy, seed: int) -> list[Group]:
    """``trainer.batch_size / rollout.group_size`` distinct training tasks of ``cfg``'s environment,
    each played ``group_size`` times by ``policy`` through the episode runner: the config's real groups."""
    from asyncrl.envs import make_task_source
    from asyncrl.rollout.heldout import run_episodes

    size = cfg.rollout.group_size
    n = max(1, cfg.trainer.batch_size // size)
    source, rng, tasks = make_task_source(cfg.env), random.Random(seed), dict[str, Task]()
    for _ in range(1000 * n):  # distinct task ids: a group is the samples of one task
        task = source.sample(rng)
        tasks.setdefault(task.id, task)
        if len(tasks) == n:
            break
    picked = [t for t in tasks.values() for _ in range(size)]
    trajs = asyncio.run(run_episodes(cfg, policy, picked, seed=seed))  # the recipe has no latency or faults
    by_task: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_task.setdefault(t.task.id, []).append(t)
    return [Group.of(tasks[k], v, id=f"g{i}") for i, (k, v) in enumerate(by_task.items())]


def load_saved(path: Path) -> SavedBatch:
    """A batch written by :func:`real_policy_and_batch` (each group validated)."""
    saved: SavedBatch = decode(path.read_bytes(), SavedBatch)
    for g in saved.groups:
        g.validate()
    return saved


def real_policy_and_batch(config: Path, path: Path, seed: int) -> tuple[Policy, SavedBatch]:
    """``config``'s warm-start policy (cached) and its real batch: read from ``path``, else played
    (:func:`real_batch`) and written there."""
    import sys

    from asyncrl.jobs.warm_start import warm_start, warm_start_key

    cfg = load_config(config)
    ws = warm_start(cfg)
    policy = Policy.load(ws.path, cfg=cfg.model).to(cfg.model.device)
    key = warm_start_key(cfg)
    if path.is_file():
        saved = load_saved(path)
        if saved.warm_start_key != key:  # the step's cost does not depend on it; its loss does
            print(
                f"note: {path} was sampled by warm start {saved.warm_start_key}, training {key}",
                file=sys.stderr,
            )
        return policy, saved
    saved = SavedBatch(
        config=str(config),
        rollout_seed=seed,
        warm_start_key=key,
        warm_start_heldout=float(ws.heldout_success),
        created=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        groups=real_batch(cfg, policy, seed),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(saved))
    return policy, saved


def proximal_rows(learner: Learner, n: int) -> torch.Tensor:
    """The rows the variant's proximal (no-grad) pass scores: every row for ``AllPasses``; else, when
    read, all but epoch 0's first minibatch (its gradient pass fills them in, ``Learner._proximal``)."""
    rows = torch.arange(n)
    if type(learner)._proximal is AllPasses._proximal:
        return rows
    if not learner.needs_prox:
        return rows[:0]
    return rows[len(torch.chunk(rows, min(learner.cfg.trainer.minibatches, n))[0]) :]


def _pass_flops(learner: Learner, b: Batch, part: _Part) -> tuple[float, float, float, bool]:
    """One forward of micro-batch ``part`` as it runs: FLOPs of the decoder's linear layers, of its
    attention (``rows × width²`` query-key pairs padded; for a trie of ``N`` nodes the pairs its plan
    computes, ``N²`` over the dense tree mask), of the
    LM head (``2·hidden·vocab`` at each scored position), and whether the head runs chunked (then it
    is recomputed in the backward) — see :func:`asyncrl.policy.scoring.token_logprobs_and_entropy`."""
    from asyncrl.policy.scoring import can_chunk_logits, decoder_layer_shape

    model, tc = learner.model, learner.cfg.trainer
    layer, c = decoder_layer_shape(model), model.config
    rows, width = part.rows, part.width
    valid = b.attn[rows, :width] > 0
    if part.shared:
        import asyncrl.policy.trie_attention as ta
        from asyncrl.policy.packing import build_prefix_tree

        tree = build_prefix_tree(b.ids[rows, :width], valid)
        dense = ta.trie_attention is _dense  # under dense_trie_attention
        tokens, pairs = tree.size, (tree.size**2 if dense else trie_plan(tree.paths).pairs)
    else:
        tokens, pairs = len(rows) * width, len(rows) * width * width
    chunked = (part.shared or tc.logits_chunk_tokens > 0) and can_chunk_logits(model)
    keep = valid[:, 1:] & valid[:, :-1]
    positions = learner._positions(b, part)
    if positions is not None:
        keep = keep & positions[:, 1:]
    scored = int(keep.sum()) if chunked else len(rows) * (width - 1)
    n = int(c.num_hidden_layers)
    return (
        2.0 * layer.params * tokens * n,
        4.0 * layer.width * pairs * n,
        2.0 * c.hidden_size * c.vocab_size * scored,
        chunked,
    )


def executed_flops(learner: Learner, trajs: list[Trajectory]) -> dict[str, float]:
    """Estimated FLOPs one ``step`` of ``learner`` runs on ``trajs``, from the micro-batches it cuts:
    ``linear`` (the decoder's linear layers), ``attention``, ``head`` (the LM head) and their ``total``.

    The gradient pass of a micro-batch: its forward (:func:`_pass_flops`), the decoder's forward again
    under gradient checkpointing, the head's again when chunked, and a backward through the
    activations (linear layers once more, attention twice, the head once: the frozen base has no
    weight gradients). The proximal pass, when the variant runs one: a forward of every row. Left
    out: embeddings, norms, softmax, the optimiser and the LoRA weight gradients (rank 16: small).
    """
    from asyncrl.trainer.learner import collate

    b = collate(trajs, learner.policy.tokenizer.pad_token_id)
    rows = torch.arange(len(trajs))
    lin = att = head = 0.0
    prox = proximal_rows(learner, len(trajs))
    for p in learner._parts(b, prox) if prox.numel() else []:
        f = _pass_flops(learner, b, p)
        lin, att, head = lin + f[0], att + f[1], head + f[2]
    ckpt = learner.cfg.trainer.gradient_checkpointing
    for _ in range(learner.cfg.trainer.epochs):
        for mb in torch.chunk(rows, min(learner.cfg.trainer.minibatches, len(trajs))):
            for p in learner._parts(b, mb):
                pl, pa, ph, chunked = _pass_flops(learner, b, p)
                lin += pl * (2 + ckpt)  # forward, backward (input gradients), recomputed forward
                att += pa * (3 + ckpt)  # the backward's attention is two forwards'
                head += ph * (2 + chunked)
    return {"linear": lin, "attention": att, "head": head, "total": lin + att + head}


def estimates(policy: Policy, trajs: list[Trajectory], config: Path, names: list[str]) -> dict[str, Any]:
    """Per variant, without running it: its micro-batches and the executed-FLOPs estimate (GFLOP)."""
    from asyncrl.trainer.learner import collate

    out: dict[str, Any] = {}
    for name in names:
        cls, overrides = VARIANTS[name]
        learner = cls(load_config(config, [f"trainer.batch_size={len(trajs)}", *overrides]), policy)
        parts = learner._parts(collate(trajs, policy.tokenizer.pad_token_id), torch.arange(len(trajs)))
        f = executed_flops(learner, trajs)
        out[name] = {
            "microbatches": [[len(p.rows), p.width, p.shared] for p in parts],
            **{f"{k}_gflop": round(v / 1e9, 1) for k, v in f.items()},
        }
    return out


def no_checkpointing(policy: Policy) -> None:
    """Gradient checkpointing off: ``Learner`` only ever turns it on, and the variants share the model."""
    hf: Any = policy.model
    (getattr(hf, "activation_checkpointing_disable", None) or hf.gradient_checkpointing_disable)()


def reset_peak_rss() -> None:
    """Start a new resident-memory high-water mark (Linux: ``clear_refs`` 5 resets ``VmHWM``)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mb(field: str = "VmHWM") -> float | None:
    """The process's resident-memory high-water mark (MB) since :func:`reset_peak_rss` (``VmRSS``: the
    resident memory now); ``None`` off Linux."""
    try:
        line = next(
            x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":")
        )
    except (OSError, StopIteration):
        return None
    return round(int(line.split()[1]) / 1024, 1)


def run_variant(
    name: str, policy: Policy, trajs: list[Trajectory], cfg: RunConfig, warmup: int = 0
) -> dict[str, Any]:
    """One ``Learner.step`` of variant ``name`` (its config ``cfg``) after ``warmup`` untimed ones; its
    times and a few metrics (``loss/policy`` and ``train/grad_norm`` of the timed step)."""
    cls = VARIANTS[name][0]
    if not cfg.trainer.gradient_checkpointing:
        no_checkpointing(policy)
    learner = cls(cfg, policy)
    with patched(name):
        flops = executed_flops(learner, trajs)["total"]
        torch.manual_seed(0)
        for v in range(warmup):  # a run's steps are warm: allocator, kernels' first calls
            learner.step(groups_of(trajs), version=v)
        reset_peak_rss()
        rss = peak_rss_mb("VmRSS")
        t0, c0 = time.perf_counter(), time.process_time()
        m = learner.step(groups_of(trajs), version=warmup)
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = peak_rss_mb()
    tokens = sum(len(t.token_ids()) for t in trajs)
    return {
        "seconds": round(secs, 2),
        "cpu_seconds": round(cpu, 2),
        "tokens_per_s": round(tokens / secs, 2),
        "tokens_per_cpu_s": round(tokens / cpu, 2),
        "executed_gflop": round(flops / 1e9, 1),
        "rss_before_mb": rss,
        "peak_rss_mb": peak,
        "loss_policy": m["loss/policy"],
        "grad_norm": m["train/grad_norm"],
        "microbatches": m["train/microbatches"],
    }


def summarize(
    runs: dict[str, list[dict[str, Any]]], ceiling: list[tuple[float, float]], n_params: int
) -> dict[str, Any]:
    """Per variant: the run with the median CPU seconds (the figure least moved by other jobs) with
    its shares of the matmul ceiling, and the spread of the step's wall and CPU seconds over the repeats."""
    results = {k: dict(sorted(v, key=lambda x: x["cpu_seconds"])[(len(v) - 1) // 2]) for k, v in runs.items()}
    peak, peak_cpu = max(c[0] for c in ceiling), max(c[1] for c in ceiling)
    for k, r in results.items():
        r["ceiling_share"] = round(r["tokens_per_s"] * 4 * n_params / (peak * 1e9), 4)
        r["ceiling_share_cpu"] = round(r["tokens_per_cpu_s"] * 4 * n_params / (peak_cpu * 1e9), 4)
        r["executed_share"] = round(r["executed_gflop"] / r["seconds"] / peak, 4)
        r["executed_share_cpu"] = round(r["executed_gflop"] / r["cpu_seconds"] / peak_cpu, 4)
        for f in ("seconds", "cpu_seconds"):
            xs = [x[f] for x in runs[k]]
            r[f"{f}_median_min_max"] = [round(statistics.median(xs), 2), min(xs), max(xs)]
    base = results.get("before")
    for r in results.values():
        if base:
            r["speedup_vs_before"] = round(base["seconds"] / r["seconds"], 2)
            r["cpu_speedup_vs_before"] = round(base["cpu_seconds"] / r["cpu_seconds"], 2)
    return results


def prepare(args: argparse.Namespace) -> tuple[Policy, list[Trajectory], Path, dict[str, Any]]:
    """The policy, the batch, the config the variants load and where the batch came from."""
    if args.config is None:
        cfg = load_config(CONFIG, [f"trainer.batch_size={args.completions}"])
        policy = Policy.from_config(cfg.model)
        source = {"batch": "synthetic", "config": str(CONFIG.relative_to(REPO))}
        return policy, batch(cfg, policy, args.completions), CONFIG, source
    name = f"trainer-passes-batch-{args.config.stem}.msgpack"
    path = args.batch_file or REPO / "bench" / "results" / name
    policy, saved = real_policy_and_batch(args.config, path, args.rollout_seed)
    shown = path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path
    source = {"batch": "real", "config": str(args.config), "batch_file": str(shown)}
    source |= {
        k: getattr(saved, k) for k in ("rollout_seed", "warm_start_key", "warm_start_heldout", "created")
    }
    return policy, members(saved.groups), args.config, source


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--completions", type=int, default=16, help="the synthetic batch's rows (no --config)")
    ap.add_argument("--config", type=Path, default=None, help="the step on this config's real batch")
    ap.add_argument(
        "--batch-file", type=Path, default=None, help="--config's saved batch (read, else written)"
    )
    ap.add_argument("--rollout-seed", type=int, default=0, help="--config: the seed the batch is played with")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default="before,after")
    ap.add_argument("--repeats", type=int, default=1, help="rounds, the order reversed every other one")
    ap.add_argument("--warmup", type=int, default=0, help="untimed steps before each timed one")
    ap.add_argument("--out", default=None)
    ap.add_argument("--estimate-only", action="store_true", help="the variants' FLOPs estimates, no step")
    ap.add_argument("--profile", action="store_true", help="one profiled step of each variant, no timing")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    policy, trajs, config, source = prepare(args)
    if args.estimate_only:
        print(
            json.dumps(
                {**source, **batch_figures(trajs), "variants": estimates(policy, trajs, config, names)}
            )
        )
        return 0
    if args.profile:
        for name in names:
            print(json.dumps(profile_variant(name, policy, trajs, config), indent=1), flush=True)
        return 0
    runs, ceiling = measure(policy, trajs, config, names, args.repeats, args.warmup)
    trie = trie_figures(policy, trajs)
    report = {
        "bench": "trainer_passes",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "threads": args.threads,
        **source,
        "completions": len(trajs),
        **batch_figures(trajs),
        **trie,
        "params": policy.num_parameters(),
        "repeats": args.repeats,
        "warmup_steps": args.warmup,
        "matmul_gflops_wall": [round(c[0], 1) for c in ceiling],
        "matmul_gflops_cpu": [round(c[1], 1) for c in ceiling],
        "decoder_shape_gflops_wall_cpu": [round(x, 1) for x in shape_gflops(policy, int(trie["trie_nodes"]))],
        "variants": summarize(runs, ceiling, policy.num_parameters()),
        "runs": runs,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def run_forked(
    name: str, policy: Policy, trajs: list[Trajectory], config: Path, warmup: int = 0
) -> dict[str, Any]:
    """:func:`run_variant` in a forked child with the variant's ``launcher.malloc_mmap_threshold_kb``
    (as every role process sets it, ``asyncrl.bootstrap``): the allocator's setting is process-wide
    and cannot be undone, so each step gets a process of its own, forked from the loaded policy; what
    the step changes (adapter, allocator state, checkpointing) dies with the child."""
    from asyncrl.policy.memory import set_mmap_threshold

    cfg = load_config(config, [f"trainer.batch_size={len(trajs)}", *VARIANTS[name][1]])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one step, its figures down the pipe
        os.close(read)
        code = 1
        try:
            set_mmap_threshold(cfg.launcher.malloc_mmap_threshold_kb)
            out = run_variant(name, policy, trajs, cfg, warmup)
            out["malloc_mmap_threshold_kb"] = cfg.launcher.malloc_mmap_threshold_kb
            with os.fdopen(write, "w") as f:
                f.write(json.dumps(out))
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not text:
        raise RuntimeError(f"variant {name}: the child failed (wait status {status})")
    return cast(dict[str, Any], json.loads(text))


def measure(
    policy: Policy, trajs: list[Trajectory], config: Path, names: list[str], repeats: int, warmup: int = 0
) -> tuple[dict[str, list[dict[str, Any]]], list[tuple[float, float]]]:
    """``repeats`` rounds of the variants (the order reversed every other round), each from the start
    adapter (a forked child's step leaves the parent's untouched), the matmul ceiling measured before
    and after every variant."""
    ceiling = [matmul_gflops()]
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            runs.setdefault(name, []).append(run_forked(name, policy, trajs, config, warmup))
            print(json.dumps({name: runs[name][-1]}), flush=True)
            ceiling.append(matmul_gflops())
    return runs, ceiling


OP_KINDS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
    "attention": ("aten::_scaled_dot_product", "aten::_flash_attention", "aten::_efficient_attention"),
    "softmax": ("aten::_softmax", "aten::_log_softmax", "aten::logsumexp", "aten::_softmax_backward_data"),
    "copies": ("aten::copy_", "aten::index", "aten::index_put_", "aten::gather", "aten::cat", "aten::clone"),
}


def profile_variant(
    name: str, policy: Policy, trajs: list[Trajectory], config: Path, top: int = 25
) -> dict[str, Any]:
    """One step of ``name`` under ``torch.profiler``: the top ops by self CPU time and the step's time
    by kind of op (``OP_KINDS``; the rest is "other": elementwise, norms, autograd bookkeeping)."""
    from torch.profiler import ProfilerActivity, profile

    cls, overrides = VARIANTS[name]
    cfg = load_config(config, [f"trainer.batch_size={len(trajs)}", *overrides])
    if not cfg.trainer.gradient_checkpointing:
        no_checkpointing(policy)
    learner = cls(cfg, policy)
    torch.manual_seed(0)
    with (
        patched(name),
        profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof,
    ):
        learner.step(groups_of(trajs), version=0)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    kinds = dict.fromkeys([*OP_KINDS, "other"], 0.0)
    for e in events:
        kind = next((k for k, names in OP_KINDS.items() if e.key.startswith(names)), "other")
        kinds[kind] += e.self_cpu_time_total
    events.sort(key=lambda e: -e.self_cpu_time_total)
    return {
        "variant": name,
        "self_cpu_s": round(total / 1e6, 2),
        "share_by_kind": {k: round(v / total, 3) for k, v in kinds.items()},
        "top_ops": [[e.key, round(e.self_cpu_time_total / 1e6, 3), e.count] for e in events[:top]],
        "mm_by_shape": mm_shapes(prof, top),
    }


def mm_shapes(prof: Any, top: int) -> list[list[Any]]:
    """``aten::mm`` grouped by its operands' shapes: ``[shapes, self CPU s, calls, GFLOP/s]``, most time
    first (the LoRA adapters' rank-16 products against the base layers' and the head's)."""
    out = []
    for e in prof.key_averages(group_by_input_shape=True):
        shapes = e.input_shapes
        if e.key != "aten::mm" or len(shapes) < 2 or len(shapes[0]) != 2 or len(shapes[1]) != 2:
            continue
        (m, k), (_, n) = shapes[0], shapes[1]
        secs = e.self_cpu_time_total / 1e6
        out.append(
            [
                f"{m}x{k}@{k}x{n}",
                round(secs, 3),
                e.count,
                round(2 * m * k * n * e.count / max(secs, 1e-9) / 1e9, 1),
            ]
        )
    return sorted(out, key=lambda r: -r[1])[:top]


if __name__ == "__main__":
    raise SystemExit(main())
