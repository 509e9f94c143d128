"""The episode runner: multi-turn token layout, loss mask, context limit, and fault isolation."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from asyncrl.config import EnvConfig, GuardConfig, load_config
from asyncrl.engine import GenerationEngine, Sample
from asyncrl.engine.batcher import TurnBatcher
from asyncrl.envs import GuardedEnv, StepResult, make_env, make_task_source
from asyncrl.policy.chat import TextRenderer
from asyncrl.policy.tokenizer import build_tokenizer
from asyncrl.records import SamplingParams, Task
from asyncrl.rollout.episode import EpisodeSettings, run_episode
from helpers import calc_task

TOK = build_tokenizer("char")
TEMPLATE = TextRenderer(TOK)


class ScriptedEngine(GenerationEngine):
    """Returns scripted model turns (as the tokens a sampler would have produced), version 7."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = list(texts)
        self.version = 7
        self.max_context = 10_000
        self.calls: list[int] = []

    def generate(self, prompts: list[list[int]], sampling: Any) -> list[Sample]:
        self.calls.append(len(prompts))
        out = []
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        for _prompt, sp in zip(prompts, params, strict=True):
            ids = TEMPLATE.encode_content(self.texts.pop(0) if self.texts else "<answer>0</answer>")
            ids = ids[: sp.max_new_tokens]
            out.append(Sample(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop"))
        return out

    def load_weights(
        self, version: int, tensors: dict[str, torch.Tensor], *, path: str | Path | None = None
    ) -> None:  # pragma: no cover - unused
        self.version = version


def settings(max_context: int = 512, max_turns: int = 6) -> EpisodeSettings:
    return EpisodeSettings(
        max_turns=max_turns,
        max_context=max_context,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=40),
        early_stop_invalid=0,
    )


def play(texts: list[str], env: Any = None, **kw: Any) -> Any:
    async def go() -> Any:
        batcher = TurnBatcher(ScriptedEngine(texts), max_batch=64, max_wait_s=0.02)
        try:
            (traj,) = await run_episode(
                calc_task(), env or make_env(EnvConfig(), 0), batcher, TEMPLATE, settings(**kw)
            )
            return traj
        finally:
            batcher.close()

    return asyncio.run(go())


def test_token_layout_and_loss_mask() -> None:
    texts = ["<tool>calc(3*4)</tool>", "<tool>calc(12+5)</tool>", "<answer>17</answer>"]
    traj = play(texts)
    assert traj.outcome == "success" and traj.final_reward == 1.0
    roles = [t.role for t in traj.turns]
    assert roles == ["env", "model", "tool", "model", "tool", "model"]
    # model tokens are exactly the sampled ones; observations go through the one template
    for turn, text in zip([t for t in traj.turns if t.role == "model"], texts, strict=True):
        assert turn.token_ids == TEMPLATE.encode_content(text)
        assert turn.version == 7 and turn.logprobs == [-0.25] * len(turn.token_ids)
    assert TOK.decode(traj.turns[2].token_ids) == "<obs>12</obs>"
    assert traj.turns[0].token_ids[0] == TEMPLATE.bos
    mask = traj.loss_mask()
    model_positions = {i for i, m in enumerate(mask) if m}
    pos, expected = 0, set()
    for turn in traj.turns:
        if turn.role == "model":
            expected |= set(range(pos, pos + len(turn.token_ids)))
        pos += len(turn.token_ids)
    assert model_positions == expected
    assert traj.turns[1].tool_call is not None and traj.turns[1].tool_call.ok
    assert sum(t.process_reward for t in traj.turns) > 0


def test_context_limit_ends_as_truncated() -> None:
    traj = play(["<tool>calc(3*4)</tool>"] * 6, max_context=90)
    assert traj.outcome == "truncated"
    assert len(traj.token_ids()) <= 90


def test_turn_limit_ends_as_truncated() -> None:
    traj = play(["<tool>calc(3*4)</tool>"] * 10, max_turns=2)
    assert traj.outcome == "truncated"
    assert sum(1 for t in traj.turns if t.role == "model") == 2


class Misbehaving:
    """An environment that raises, hangs, returns garbage or a non-finite reward, by name."""

    tools: ClassVar[list[Any]] = []

    def __init__(self, how: str) -> None:
        self.how = how

    async def reset(self, task: Task) -> str:
        if self.how == "reset_raises":
            raise RuntimeError("cannot reset")
        return "Q?"

    async def step(self, text: str) -> Any:
        if self.how == "raises":
            raise RuntimeError("tool crashed")
        if self.how == "hangs":
            await asyncio.Event().wait()
        if self.how == "garbage":
            return {"not": "a StepResult"}
        if self.how == "nan_reward":
            return StepResult(observation="x", process_reward=math.nan, done=True, reward=math.inf)
        return StepResult(observation="ok")


@pytest.mark.parametrize("how", ["raises", "hangs", "garbage", "nan_reward"])
def test_nothing_an_environment_does_crashes_the_runner(how: str) -> None:
    env = GuardedEnv(Misbehaving(how), GuardConfig(step_timeout_s=0.2, retries=1, fault_reward=-0.5))
    traj = play(["<tool>calc(1+1)</tool>"] * 2, env=env, max_turns=2)
    faults = [t.fault for t in traj.turns if t.fault is not None]
    assert faults, traj
    assert all(math.isfinite(t.process_reward) for t in traj.turns)
    assert math.isfinite(traj.final_reward)
    assert traj.turns[1].process_reward == -0.5


def test_reset_failure_is_recorded_as_env_error() -> None:
    env = GuardedEnv(Misbehaving("reset_raises"), GuardConfig(step_timeout_s=0.2, retries=0))
    traj = play([], env=env)
    assert traj.outcome == "env_error"
    assert traj.turns[0].fault is not None and "cannot reset" in traj.turns[0].fault.message
    assert traj.oldest_version() is None  # nothing to train on


def test_concurrent_episodes_share_batches() -> None:
    engine = ScriptedEngine(["<answer>1</answer>"] * 16)

    async def go() -> list[Any]:
        batcher = TurnBatcher(engine, max_wait_s=0.05, max_batch=64)
        src = make_task_source(EnvConfig())
        import random

        rng = random.Random(0)
        tasks = [src.sample(rng) for _ in range(16)]
        try:
            return await asyncio.gather(
                *(
                    run_episode(t, make_env(EnvConfig(), i), batcher, TEMPLATE, settings())
                    for i, t in enumerate(tasks)
                )
            )
        finally:
            batcher.close()

    trajs = [t for samples in asyncio.run(go()) for t in samples]
    assert len(trajs) == 16
    assert engine.calls == [16]  # one batched call served all sixteen first turns


def test_eval_json_cli(tmp_path: Any) -> None:
    import json
    import subprocess
    import sys

    from asyncrl.policy import Policy

    cfg = load_config(
        None,
        [
            "model.hidden_size=32",
            "model.num_layers=1",
            "model.num_heads=2",
            "model.num_kv_heads=1",
            "model.intermediate_size=64",
            "env.heldout_size=4",
        ],
    )
    Policy.build(cfg.model).save(tmp_path / "step_00000004" / "policy")  # a trainer checkpoint's layout
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "eval",
            "--set",
            "env.heldout_size=4",
            "--set",
            "model.max_context=256",
            "--checkpoint",
            str(tmp_path / "step_00000004"),
            "--json",
            "configs/demo.yaml",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    for key in ("success_rate", "avg_steps", "tool_success_rate", "per_task_type", "distinct_2"):
        assert key in report
    assert report["episodes"] == 4 and 0.25 <= report["top_reply_share"] <= 1.0
    assert report["checkpoint"] == str(tmp_path / "step_00000004" / "policy")


def test_the_batcher_says_when_it_has_nothing_left_to_generate() -> None:
    """``idle`` (the rollout worker's core-lending announcement) runs after a generation call that
    leaves no request waiting — not after one whose successors are already queued."""
    engine = ScriptedEngine([])
    seen: list[int] = []

    async def go() -> None:
        batcher = TurnBatcher(
            engine, idle=lambda: seen.append(len(engine.calls)), max_wait_s=0.0, max_batch=2
        )
        sp = SamplingParams(max_new_tokens=4)
        try:
            await asyncio.gather(*(batcher.generate([1, 2], sp) for _ in range(5)))  # batches of 2, 2, 1
            assert seen == [3]
            await batcher.generate([1], sp)
            assert seen == [3, 4]
        finally:
            batcher.close()

    asyncio.run(go())


class _Ticket:
    """What a group's ticket hears from its episodes (the worker's in-flight load)."""

    def __init__(self) -> None:
        self.turns, self.ended = 0, list[int]()

    def turn_done(self) -> None:
        self.turns += 1

    def episode_done(self, turns_taken: int) -> None:
        self.ended.append(turns_taken)


def test_the_worker_and_evaluation_play_episodes_through_one_player() -> None:
    """``EpisodePlayer`` is the one episode player: the worker calls it with a ticket (each model turn and
    the episode's end reported, the temperature scaled by the task's factor), held-out evaluation calls
    its ``episode`` (``run_episodes``); nothing else in src plays an episode (``run_episode``)."""
    import ast
    import random

    from asyncrl.rollout.runners import EpisodePlayer

    texts = ["<tool>calc(3*4)</tool>", "<tool>calc(12+5)</tool>", "<answer>17</answer>"]
    ticket = _Ticket()

    async def go() -> list[Any]:
        batcher = TurnBatcher(ScriptedEngine(texts), max_batch=64, max_wait_s=0.02)
        rs = load_config(None, ["rollout.sampling.temperature=0.8"]).rollout_settings()
        player = EpisodePlayer(rs, batcher, TEMPLATE, 512, "w0", random.Random(0), lambda: 0.0, lambda _: 0.5)
        try:
            return await player(ticket, calc_task(), "g1")  # type: ignore[arg-type]
        finally:
            batcher.close()

    (traj,) = asyncio.run(go())
    assert traj.outcome == "success" and (traj.worker_id, traj.group_id) == ("w0", "g1")
    assert traj.sampling.temperature == pytest.approx(0.4)
    assert (ticket.turns, ticket.ended) == (3, [3])
    src = Path(__file__).resolve().parents[1] / "src" / "asyncrl"
    callers = {
        f"{path.relative_to(src)}:{fn.name}"
        for path in src.rglob("*.py")
        for fn in ast.walk(ast.parse(path.read_text()))
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for call in ast.walk(fn)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "run_episode"
    }
    assert callers == {"rollout/runners.py:episode"}
    heldout = ast.parse((src / "rollout" / "heldout.py").read_text())
    assert "EpisodePlayer" in {n.id for n in ast.walk(heldout) if isinstance(n, ast.Name)}
