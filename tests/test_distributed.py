"""Data-parallel trainer ranks: N ranks take the one-rank step (invariance, in the spirit of TRL's
``tests/invariant/``), the micro-batch split is deterministic, checkpoints resume across world sizes."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from asyncrl.config import LocalLauncherConfig, RunConfig, load_config
from asyncrl.launch.local import role_context
from asyncrl.records import Task, Trajectory, Turn, decode_trajectory, encode, groups_of
from asyncrl.trainer.distributed import assign
from helpers import free_port

# two spawned ranks train a tiny model: about a minute alone, several while other sessions share the cores
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.timeout(900)]
START = LocalLauncherConfig().start
"""The ranks start as the launcher starts roles."""
SPAWNS = pytest.mark.slow  # two spawned gloo ranks: ~1 min each on a loaded 2-core machine (imports)

TINY = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "trainer.lr=0.01",
    "rollout.group_size=2",
    "trainer.batch_size=6",
    "trainer.max_tokens_per_microbatch=24",  # several micro-batches per minibatch
    "algo.entropy_coef=0.01",  # a token-mean term beside the policy loss
]


def batch() -> list[Trajectory]:
    """Six trajectories of different lengths in three groups (rewards differ within each group)."""
    out = []
    for i in range(6):
        model = [3 + (i + k) % 7 for k in range(2 + i)]
        turns = [
            Turn(role="env", token_ids=[1, 2, 1 + i % 3]),
            Turn(
                role="model", token_ids=model, logprobs=[-0.7 - 0.1 * k for k in range(len(model))], version=0
            ),
        ]
        out.append(
            Trajectory(
                id=f"t{i}",
                task=Task(id=f"g{i // 2}", task_type="calc"),
                turns=turns,
                final_reward=float(i % 2),
                outcome="success" if i % 2 else "failure",
                group_id=f"g{i // 2}",
            )
        )
    return out


def _policy(cfg: RunConfig, model_dir: str | None) -> Any:
    from asyncrl.policy import Policy

    torch.manual_seed(0)
    return Policy.load(model_dir, cfg=cfg.model) if model_dir else Policy.build(cfg.model)


def _train(cfg: RunConfig, policy: Any, group: Any, steps: int) -> tuple[Any, dict[str, float]]:
    from asyncrl.trainer.learner import Learner
    from asyncrl.trainer.parallel import make_parallel

    learner = Learner(cfg, policy)
    learner.parallelize(make_parallel(cfg, group))
    trajs = [decode_trajectory(encode(t)) for t in batch()]
    metrics: dict[str, float] = {}
    for v in range(steps):
        torch.manual_seed(100 + v)  # the minibatch permutation: the same on every rank (rank 0 sends it)
        metrics = learner.step(groups_of(trajs), version=v)
    return learner, metrics


def _full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter as a plain tensor (a sharded one gathered: collective, the same order on every rank)."""
    from torch.distributed.tensor import DTensor

    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in model.named_parameters()
    }


def _rank(rank: int, port: int, cfg_json: str, model_dir: str | None, out: str, steps: int) -> None:
    from torch.distributed.tensor import DTensor

    from asyncrl.trainer.distributed import RankGroup

    torch.set_num_threads(1)
    cfg = RunConfig.model_validate_json(cfg_json)
    group = RankGroup.join(cfg, rank, "127.0.0.1", port)
    policy = _policy(cfg, model_dir)
    learner, metrics = _train(cfg, policy, group, steps)
    whole = learner.parallel.gather()  # sharded: rank 0's full state (collective)
    local = [p.to_local() if isinstance(p, DTensor) else p for p in policy.model.parameters()]
    metrics["held_elements"] = float(sum(t.numel() for t in local))  # this rank's share of the weights
    params = _full_params(policy.model)
    if whole is not None:  # rank 0 of a sharded group publishes and checkpoints it, as the role does
        _publish_and_save(cfg, whole, Path(out))
    save_file(params, f"{out}/params-{rank}.safetensors")
    Path(f"{out}/metrics-{rank}.json").write_text(json.dumps(metrics))
    group.close()


def run_ranks(cfg: RunConfig, world: int, out: Path, model_dir: str | None, steps: int) -> None:
    ctx = role_context(START)
    port = free_port()
    procs = [
        ctx.Process(target=_rank, args=(r, port, cfg.model_dump_json(), model_dir, str(out), steps))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)  # imports and two steps of two ranks on a loaded 2-core machine
    assert [p.exitcode for p in procs] == [0] * world


def _check_invariance(tmp_path: Path, args: list[str], model_dir: str | None, steps: int) -> None:
    cfg = load_config(None, [*TINY, *args, "trainer.world_size=2"])
    policy = _policy(cfg, model_dir)
    one = _train(cfg, policy, None, steps)[1]
    run_ranks(cfg, 2, tmp_path, model_dir, steps)
    ref = {n: p.detach() for n, p in policy.model.named_parameters()}
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    for rank in (0, 1):
        got = load_file(str(tmp_path / f"params-{rank}.safetensors"))
        assert set(got) == set(ref)
        for n in ref:
            torch.testing.assert_close(got[n], ref[n], atol=2e-6, rtol=1e-5, msg=f"rank {rank}: {n}")
        m = json.loads((tmp_path / f"metrics-{rank}.json").read_text())
        for k in ("loss/policy", "train/grad_norm", "entropy/mean", "policy/tokens", "train/microbatches"):
            assert m[k] == pytest.approx(one[k], rel=1e-5, abs=1e-7), k
        whole = sum(p.numel() for p in policy.model.parameters())
        share = 0.5 if cfg.trainer.parallel == "fsdp" else 1.0  # fsdp: each rank holds half of each tensor
        assert m["held_elements"] == pytest.approx(share * whole, rel=0.02)
    assert one["train/microbatches"] >= 2  # the split had something to split (one per rank at least)
    assert not any(k.startswith("train/microbatches_rank") for k in one)  # one rank: no split to report
    for rank in (0, 1):  # each rank did its share: the sum alone would not show a rank that ran nothing
        m = json.loads((tmp_path / f"metrics-{rank}.json").read_text())
        counts = [m[f"train/microbatches_rank{r}"] for r in (0, 1)]
        assert min(counts) >= 1 and sum(counts) == m["train/microbatches"] == one["train/microbatches"], (
            counts
        )
    if cfg.trainer.parallel == "fsdp":
        _check_published_and_saved(cfg, policy, tmp_path)
    start = _policy(cfg, model_dir).model.state_dict()  # the same start, built once (not once a tensor)
    moved = [n for n in trainable if not torch.equal(ref[n], start[n])]
    assert moved, "the step should have changed the trainable parameters"


def _publish_and_save(cfg: RunConfig, whole: Any, out: Path) -> None:
    """Rank 0 of a sharded group: publish version 1 (canary included) and save the policy, as the role does."""
    from asyncrl.weights import make_weight_store, publish_policy

    store = make_weight_store(cfg.weights, out)
    publish_policy(store, 1, whole, step=1, canary=cfg.weights.canary)
    whole.save(out / "saved-policy")


def _check_published_and_saved(cfg: RunConfig, policy: Any, out: Path) -> None:
    """The sharded group's published version and saved policy are the one-rank policy's weights."""
    from asyncrl.policy import Policy
    from asyncrl.weights import make_weight_store

    loaded = make_weight_store(cfg.weights, out).load(1)
    want = policy.state_dict_tensors()  # the adapter alone with LoRA
    assert set(loaded.tensors) == set(want)
    for n, t in want.items():
        torch.testing.assert_close(loaded.tensors[n], t, atol=2e-6, rtol=1e-5, msg=n)
    canary = loaded.manifest["extra"]["canary"]  # the twin's forward on the probe: the one-rank model's
    from asyncrl.policy.canary import probe_logprobs

    want_lp = probe_logprobs(policy.model, canary["probe_ids"])
    assert canary["probe_logprobs"] == pytest.approx(want_lp, abs=1e-4)
    saved = Policy.load(out / "saved-policy", cfg=cfg.model).model.state_dict()
    for n, t in policy.model.state_dict().items():
        torch.testing.assert_close(saved[n], t, atol=2e-6, rtol=1e-5, msg=n)


@SPAWNS
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_take_the_one_rank_step_full_finetuning(tmp_path: Path, parallel: str) -> None:
    """2 ranks vs 1 rank, full fine-tuning, two minibatches × two steps (optimiser moments too), with
    decoupled PPO: the proximal log-probs the first minibatch fills are summed over the ranks. fsdp:
    the ranks run unequal shares of micro-batches (padding passes keep them in lock-step)."""
    args = ["trainer.minibatches=2", "algo.policy_loss.kind=decoupled_ppo", f"trainer.parallel={parallel}"]
    _check_invariance(tmp_path, args, None, steps=2)


@SPAWNS
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_take_the_one_rank_step_lora(tmp_path: Path, parallel: str) -> None:
    """2 ranks vs 1 rank with a LoRA adapter on a tiny pretrained-format model (fsdp: with activation
    checkpointing, whose recomputation re-gathers each layer in the backward)."""
    from models_util import family_tokenizer, load_tokenizer, smollm2_dir, tiny_model_dir

    tok = family_tokenizer(load_tokenizer(smollm2_dir()), "smollm2")
    model = tiny_model_dir(tmp_path / "model", tok)
    args = [f"model.path={model}", "model.lora.rank=4", "model.lora.alpha=8", f"trainer.parallel={parallel}"]
    if parallel == "fsdp":
        args.append("trainer.gradient_checkpointing=true")
    out = tmp_path / "out"
    out.mkdir()
    _check_invariance(out, args, str(model), steps=2)


def test_assign_is_deterministic_and_balanced() -> None:
    assert assign([10, 40, 30, 20], 2) == [0, 0, 1, 1]  # 40→0, 30→1, 20→1, 10→0: 50 each
    assert assign([5, 5, 5], 4) == [0, 1, 2]  # more ranks than micro-batches: rank 3 idles
    assert assign([], 3) == []
    sizes = [7, 3, 9, 1, 4, 4]
    owner = assign(sizes, 3)
    assert owner == assign(sizes, 3)
    loads = [sum(s for s, o in zip(sizes, owner, strict=True) if o == r) for r in range(3)]
    assert max(loads) - min(loads) <= max(sizes)


# ---- rank 1 does its share of the gradient (replicated) -------------------------------------------
def _contribution_rank(rank: int, port: int, cfg_json: str, out: str) -> None:
    """Two steps under DDP, recording this rank's gradient buckets before and after DDP's all-reduce
    (the SUM comm hook wrapped); the second step with every micro-batch given to rank 0."""
    import asyncrl.trainer.parallel as par
    from asyncrl.trainer.distributed import RankGroup

    torch.set_num_threads(1)
    cfg = RunConfig.model_validate_json(cfg_json)
    group = RankGroup.join(cfg, rank, "127.0.0.1", port)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # (local, summed) of every bucket
    real = par._sum

    def recording(pg, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
        local = bucket.buffer().clone()
        return real(pg, bucket).then(lambda f: seen.append((local, f.value().clone())) or f.value())

    par._sum = recording  # DDP registers the hook when the learner is wrapped
    policy = _policy(cfg, None)
    learner = _train(cfg, policy, group, steps=1)[0]
    first = len(seen)
    group.mine = lambda sizes: list(range(len(sizes))) if rank == 0 else []  # type: ignore[method-assign]
    torch.manual_seed(101)
    learner.step(groups_of([decode_trajectory(encode(t)) for t in batch()]), version=1)
    record = {}
    for name, part in (("busy", seen[:first]), ("idle", seen[first:])):
        record[f"{name}-local"] = torch.cat([lo.reshape(-1) for lo, _ in part])
        record[f"{name}-sum"] = torch.cat([su.reshape(-1) for _, su in part])
    save_file(record | _full_params(policy.model), f"{out}/contribution-{rank}.safetensors")
    group.close()


@SPAWNS
def test_rank_1_contributes_its_share_of_the_replicated_gradient(tmp_path: Path) -> None:
    """Under DDP each rank's bucket holds the gradient of its own micro-batches: rank 1's is not zero,
    and the all-reduced bucket is the SUM of the ranks' (the learner's weights normalise, not DDP). The
    same check sees an idle rank: with every micro-batch on rank 0, rank 1's bucket is all zeros (and
    the replicas still agree)."""
    cfg = load_config(None, [*TINY, "trainer.world_size=2", "trainer.parallel=ddp"])
    ctx, port = role_context(START), free_port()
    procs = [
        ctx.Process(target=_contribution_rank, args=(r, port, cfg.model_dump_json(), str(tmp_path)))
        for r in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0]
    got = [load_file(str(tmp_path / f"contribution-{r}.safetensors")) for r in (0, 1)]
    for name in ("busy", "idle"):
        local0, local1 = got[0][f"{name}-local"], got[1][f"{name}-local"]
        torch.testing.assert_close(got[0][f"{name}-sum"], local0 + local1)  # a SUM, on both ranks
        torch.testing.assert_close(got[1][f"{name}-sum"], local0 + local1)
        assert float(local0.abs().sum()) > 0
    assert float(got[1]["busy-local"].abs().sum()) > 0  # rank 1 computed gradient of its own
    assert float(got[1]["idle-local"].abs().sum()) == 0  # an idle rank shows as zeros
    for n in got[0]:
        if "-" not in n:
            torch.testing.assert_close(got[0][n], got[1][n], atol=0, rtol=0, msg=n)  # the replicas agree


# ---- the learner asks the parallelism object -------------------------------------------------------
_BRANCH_NAMES = {"RankGroup", "Sharded", "Replicated", "ShardedPolicy", "DTensor", "dist"}
_BRANCH_ATTRS = {"group", "sharded", "world", "rank", "leader", "ddp"}
_BRANCH_MODULES = ("asyncrl.trainer.distributed", "asyncrl.trainer.fsdp", "torch.distributed")


def _parallelism_branches(source: str) -> list[str]:
    """Where ``source`` asks which parallelism runs instead of asking the object: a group, a sharded
    policy, a world size or a rank, their classes, or torch.distributed."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in _BRANCH_NAMES:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in _BRANCH_ATTRS:
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_BRANCH_MODULES):
            found.append(f"{node.lineno}: from {node.module}")
        elif isinstance(node, ast.Import) and any(a.name.startswith(_BRANCH_MODULES) for a in node.names):
            found.append(f"{node.lineno}: import")
    return sorted(found, key=lambda f: int(f.split(":")[0]))


def test_the_learner_has_no_parallelism_branches() -> None:
    learner = Path(__file__).resolve().parent.parent / "src" / "asyncrl" / "trainer" / "learner.py"
    assert _parallelism_branches(learner.read_text()) == []


def test_the_parallelism_scan_can_fail() -> None:
    old = (
        "from torch.distributed.tensor import DTensor\n"
        "def f(self, total):\n"
        "    if self.group is not None:\n"
        "        total = self.group.sum_(total)\n"
        "    if self.sharded is None and self.parallel.world > 1:\n"
        "        pass\n"
        "    return isinstance(total, DTensor)\n"
    )
    assert _parallelism_branches(old) == [
        "1: from torch.distributed.tensor",
        "3: .group",
        "4: .group",
        "5: .sharded",
        "5: .world",
        "7: DTensor",
    ]


# ---- checkpoints across world sizes ---------------------------------------------------------------
def _learner(cfg: RunConfig) -> Any:
    from asyncrl.trainer.learner import Learner

    return Learner(cfg, _policy(cfg, None))


def _optimizer_tensors(learner: Any) -> dict[str, torch.Tensor]:
    """The optimiser state's tensors, whole (sharded ones gathered: collective, on every rank)."""
    from torch.distributed.tensor import DTensor

    from asyncrl.trainer.checkpoint import _optimizer_payload

    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).clone()
        for k, v in _optimizer_payload(learner.optimizer)[0].items()
    }


def _resume_rank(rank: int, port: int, cfg_json: str, ckpt: str, out: str) -> None:
    """Load the one-rank checkpoint ``ckpt``, take a step, write a sharded checkpoint under ``out``."""
    from asyncrl.trainer.checkpoint import (
        TrainerState,
        load_checkpoint,
        save_checkpoint,
        write_optimizer_shards,
    )
    from asyncrl.trainer.distributed import Checkpoint, RankGroup
    from asyncrl.trainer.parallel import make_parallel

    torch.set_num_threads(1)
    cfg = RunConfig.model_validate_json(cfg_json)
    group = RankGroup.join(cfg, rank, "127.0.0.1", port)
    learner = _learner(cfg)
    ts = load_checkpoint(Path(ckpt), learner.policy, learner.optimizer, learner.scheduler)
    learner.parallelize(make_parallel(cfg, group))  # as load_learner does: load whole, then parallelize
    torch.manual_seed(101)
    learner.step(groups_of([decode_trajectory(encode(t)) for t in batch()]), version=1)
    # the collectives of rank 0's checkpoint, in its order: the full policy, then the optimiser shards
    whole = learner.parallel.gather() or learner.policy
    optimizer, params = _optimizer_tensors(learner), _full_params(learner.model)
    if rank == 0:

        def shards(path: Path) -> None:
            group.send(Checkpoint(str(path)))
            write_optimizer_shards(path, learner.optimizer)

        state = TrainerState(ts.step + 1, 0, 0, {})
        save_checkpoint(
            Path(out), whole, learner.optimizer, learner.scheduler, state, optimizer_shards=shards
        )
        save_file(optimizer, f"{out}/saved-optimizer.safetensors")
        save_file(params, f"{out}/saved-params.safetensors")
    else:
        cmd = group.receive()
        assert isinstance(cmd, Checkpoint)
        write_optimizer_shards(Path(cmd.dir), learner.optimizer)
    group.close()


@SPAWNS
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_checkpoints_resume_on_another_world_size(tmp_path: Path, parallel: str) -> None:
    """1 rank → checkpoint → 2 ranks resume, step, sharded checkpoint → 1 rank resumes it exactly,
    and the result is the one-rank run's (fsdp: the policy written is the gathered full state, each
    rank writes its slices of the AdamW moments)."""
    from asyncrl.trainer.checkpoint import OPTIMIZER_SHARDS, TrainerState, load_checkpoint, save_checkpoint

    cfg = load_config(
        None, [*TINY, "trainer.minibatches=2", "trainer.world_size=2", f"trainer.parallel={parallel}"]
    )
    one = _learner(cfg)
    torch.manual_seed(100)
    one.step(groups_of(batch()), version=0)
    first = save_checkpoint(
        tmp_path / "one", one.policy, one.optimizer, one.scheduler, TrainerState(1, 0, 0, {})
    )
    torch.manual_seed(101)
    one.step(groups_of(batch()), version=1)  # the one-rank continuation, for comparison

    ctx, port, out = role_context(START), free_port(), tmp_path / "two"
    procs = [
        ctx.Process(target=_resume_rank, args=(r, port, cfg.model_dump_json(), str(first), str(out)))
        for r in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    sharded = out / "step_00000002"
    shard_files = sorted((sharded / OPTIMIZER_SHARDS).glob("*.safetensors"))
    assert len(shard_files) == 2 and not (sharded / "optimizer.safetensors").exists()  # both ranks wrote

    resumed = _learner(cfg)
    assert load_checkpoint(sharded, resumed.policy, resumed.optimizer, resumed.scheduler).step == 2
    saved_opt = load_file(str(out / "saved-optimizer.safetensors"))
    got_opt = _optimizer_tensors(resumed)
    assert set(got_opt) == set(saved_opt) and all(torch.equal(got_opt[k], saved_opt[k]) for k in saved_opt)
    saved = load_file(str(out / "saved-params.safetensors"))
    for n, p in resumed.model.named_parameters():
        assert torch.equal(p.detach(), saved[n]), n  # exactly what rank 0 held
        torch.testing.assert_close(
            p.detach(), dict(one.model.named_parameters())[n].detach(), atol=2e-6, rtol=1e-5
        )
    assert resumed.scheduler.state_dict()["last_epoch"] == one.scheduler.state_dict()["last_epoch"]


def test_a_rank_service_without_its_rendezvous_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncrl.errors import UserError
    from asyncrl.service import _rank_from_env

    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(UserError, match=r"missing RANK, MASTER_ADDR, MASTER_PORT"):
        _rank_from_env(2)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(UserError, match=r"RANK=2 WORLD_SIZE=2: need 0 <= RANK < trainer.world_size = 2"):
        _rank_from_env(2)
    monkeypatch.setenv("RANK", "1")
    assert _rank_from_env(2) == 1


def test_what_a_sharded_policy_cannot_do_is_one_clear_config_error() -> None:
    from asyncrl.errors import UserError

    fsdp = ["trainer.world_size=2", "trainer.parallel=fsdp"]
    with pytest.raises(UserError, match=r"behaviour_kl scores groups with the policy on rank 0 alone"):
        load_config(None, [*fsdp, "trainer.buffer_sampling=behaviour_kl"])
    with pytest.raises(UserError, match=r"credit.value.kind=head reads the policy's decoder"):
        load_config(None, [*fsdp, "credit.strategy=gae"])
    load_config(None, [*fsdp, "credit.strategy=gae", "credit.value.kind=separate"])  # its own backbone
    load_config(None, ["trainer.world_size=2", "trainer.buffer_sampling=behaviour_kl"])  # ddp: replicated
