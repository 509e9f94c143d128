"""Groups without a reward difference are left out of the gradient (``trainer.skip_equal_reward_groups``).

On a tiny built model: the learner trains on a mixed batch exactly as on its groups with a difference
alone; a batch with none takes no optimiser step; and the trainer role consumes such a batch whole —
every sample's fate ``trained`` and acknowledged after the checkpoint, the step counted, no NaN, the
left-out groups booked as generation-only ``zero_advantage`` waste.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from asyncrl.config import RunConfig, load_config
from asyncrl.records import Group, Task, Trajectory, Turn, groups_of
from helpers import TINY_MODEL

TINY = [
    *TINY_MODEL,
    "trainer.lr=0.01",
    "algo.entropy_coef=0.01",  # a zero-advantage group still has a gradient: its entropy term
    "rollout.group_size=2",
    "trainer.batch_size=4",
]


def _cfg(*extra: str) -> RunConfig:
    return load_config(None, [*TINY, *extra])


def _traj(group: str, n: int, reward: float) -> Trajectory:
    model = [3 + n, 4 + n, 5 + n]
    return Trajectory(
        id=f"{group}-{n}",
        task=Task(id=group, task_type="calc"),
        turns=[
            Turn(role="env", token_ids=[1, 2]),
            Turn(role="model", token_ids=model, logprobs=[-2.0] * len(model), version=0),
        ],
        final_reward=reward,
        outcome="success" if reward > 0 else "failure",
        group_id=group,
    )


def _group(name: str, *rewards: float) -> Group:
    return groups_of([_traj(name, i, r) for i, r in enumerate(rewards)])[0]


def _params_after(
    cfg: RunConfig, batches: list[list[Group]]
) -> tuple[list[torch.Tensor], list[dict[str, float]]]:
    from asyncrl.policy import Policy
    from asyncrl.trainer.learner import Learner

    torch.manual_seed(0)
    policy = Policy.build(cfg.model)
    learner = Learner(cfg, policy)
    metrics = [learner.step(b, version=0) for b in batches]
    return [p.detach().clone() for p in policy.model.parameters()], metrics


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_the_learner_trains_a_mixed_batch_as_its_groups_with_a_difference() -> None:
    mixed = [_group("s", 1.0, 0.0), _group("z", 0.0, 0.0)]
    alone, _ = _params_after(_cfg(), [[_group("s", 1.0, 0.0)]])
    on, (m,) = _params_after(_cfg(), [mixed])
    off, _ = _params_after(_cfg("trainer.skip_equal_reward_groups=false"), [mixed])
    assert _same(on, alone)
    assert not _same(off, alone)  # the switch decides: off, the equal group's entropy term moves the weights
    assert m["train/zero_signal_groups"] == 1 and m["train/zero_signal_samples"] == 2
    assert m["train/samples"] == 2 and m["reward/mean"] == 0.25  # the reward is the whole batch's


def test_a_batch_without_a_difference_takes_no_step() -> None:
    flat = [_group("a", 1.0, 1.0), _group("b", 0.0, 0.0)]
    start, _ = _params_after(_cfg(), [])
    on, (m,) = _params_after(_cfg(), [flat])
    off, _ = _params_after(_cfg("trainer.skip_equal_reward_groups=false"), [flat])
    assert _same(on, start) and not _same(off, start)
    assert m["train/skipped"] == 0 and m["train/samples"] == 0 and m["train/zero_signal_groups"] == 2
    assert all(math.isfinite(v) for v in m.values()), m


def test_other_credit_strategies_train_every_group() -> None:
    flat = [_group("a", 1.0, 1.0), _group("b", 0.0, 0.0)]
    _, (m,) = _params_after(_cfg("credit.baseline=batch_mean"), [flat])
    assert m["train/zero_signal_groups"] == 0 and m["train/samples"] == 4


def test_the_trainer_consumes_an_empty_step_whole_and_acknowledges_it(tmp_path: Path) -> None:
    from asyncrl.control import RunState
    from asyncrl.policy import Policy
    from asyncrl.trainer.process import TrainerRole
    from asyncrl.transport import make_queue
    from asyncrl.weights import make_weight_store

    cfg = _cfg("trainer.total_steps=2", "trainer.checkpoint_every=1", "telemetry.archive=false")
    run = tmp_path / "run"
    run.mkdir()
    Policy.build(cfg.model).save(run / "initial_policy")
    RunState.open(cfg, run).begin(resume=False)
    queue = make_queue(cfg.transport, run)
    # step 1: no group differs (an empty step); step 2: one group of two differs
    for g in [_group("a", 1.0, 1.0), _group("b", 0.0, 0.0), _group("c", 1.0, 0.0), _group("d", 0.0, 0.0)]:
        assert queue.put(g, timeout=5)
    TrainerRole(cfg, run, resume=False).run()

    state = RunState.open(cfg, run)
    assert state.fate_counts() == {"trained": 8}  # every sample of both steps, none lost, none twice
    stats = queue.stats()
    assert stats.depth == 0 and stats.acked_total == 4  # acknowledged after the checkpoints
    rows = [json.loads(x) for x in (run / "metrics" / "trainer.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/zero_signal_groups" in r]
    assert [r["train/zero_signal_groups"] for r in steps[:2]] == [2.0, 1.0]
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float)), rows
    last = rows[-1]
    assert last["trainer/step"] == 2 and last["trainer/empty_steps"] == 1
    assert last["trainer/samples_trained"] == 8 and last["trainer/zero_adv_skipped_samples"] == 6
    assert last["trainer/zero_adv_samples"] == 6
    assert last["trainer/tokens_processed"] == 2 * 5  # only group c was forwarded
    assert last["trainer/zero_adv_tokens"] == 0  # the left-out groups were never processed
    store = make_weight_store(cfg.weights, run)
    initial = Policy.load(run / "initial_policy", cfg=cfg.model).model.state_dict()
    v1, v2 = store.load(1).tensors, store.load(2).tensors
    assert v1.keys() <= initial.keys()
    assert all(torch.equal(initial[k], v1[k]) for k in v1)  # the empty step changed nothing
    assert not all(torch.equal(initial[k], v2[k]) for k in v2)


def test_the_ledger_books_left_out_groups_as_generation_only_waste() -> None:
    from asyncrl.config import CostConfig
    from asyncrl.cost.ledger import Usage, price

    # one zero-advantage group trained (50 tokens processed, 20 of them model tokens) and one left out
    # of the gradient (30 model tokens generated, never processed)
    u = Usage(wall_seconds=3600.0, rollout_alive_s=100.0, rollout_busy_s=100.0, trainer_alive_s=100.0)
    u.trainer_busy_s, u.tokens_generated, u.tokens_processed, u.tokens_trained = 100.0, 1000.0, 500.0, 200.0
    u.zero_adv_tokens, u.zero_adv_model_tokens, u.zero_adv_skipped_model_tokens = 50.0, 50.0, 30.0
    cost = price(u, CostConfig())
    per_gen, per_train = cost.components["rollout_device"] / 1000.0, cost.components["trainer_device"] / 500.0
    assert math.isclose(cost.waste["zero_advantage"], 50 * per_gen + 50 * per_train)
    # the trained group's 30 prompt tokens are zero-advantage waste, not masked-token waste as well
    assert math.isclose(cost.waste["masked_tokens"], (300 - 30) * per_train)


def test_a_trainer_group_trains_every_group() -> None:
    """With ``trainer.world_size > 1`` a rank whose share the filter emptied would sit out the step's
    collectives (the three-node Ray test timed out and retrained steps): the filter stays off there."""
    from asyncrl.trainer.zero_signal import Split

    batch = [_group("a", 1.0, 1.0), _group("b", 0.0, 1.0)]
    one = Split.of(batch, _cfg())
    many = Split.of(batch, _cfg("trainer.world_size=2"))
    assert (len(one.kept), len(one.left_out)) == (1, 1)
    assert (len(many.kept), len(many.left_out)) == (2, 0)
