"""``env.kind: agent``: the calculator agent (a plain openai tool-calling loop, examples/) through
the gateway on the tiny char model: episodes become token-exact trajectories with the model's own
log-probs; the agent's failures end only its episode; config and loading errors are clear."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.config import RunConfig, load_config
from asyncrl.engine import make_engine
from asyncrl.engine.batcher import TurnBatcher
from asyncrl.envs import make_task_source
from asyncrl.gateway.agent import AgentLoadError, AgentRunner, load_agent
from asyncrl.policy import Policy, token_logprobs
from asyncrl.policy.chat import make_renderer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # examples/ is imported from the working directory, as a user's module is
    torch.set_num_threads(1)


def agent_cfg(*extra: str) -> RunConfig:
    return load_config(
        None,
        [
            "env.kind=agent",
            "env.path=examples.calculator_openai:run",
            "model.hidden_size=32",
            "model.num_layers=1",
            "model.max_context=256",
            "rollout.sampling.max_new_tokens=16",
            *extra,
        ],
    )


def run_agents(cfg: RunConfig, n: int) -> tuple[list[Any], AgentRunner, Policy]:
    policy = Policy.build(cfg.model)
    renderer = make_renderer(cfg.model, policy)
    engine = make_engine(cfg.rollout.engine, policy, renderer.stop_token_ids, seed=0)
    engine.version = 4
    tasks = make_task_source(cfg.env).heldout()[:n]

    async def go() -> tuple[list[Any], AgentRunner]:
        batcher = TurnBatcher(engine, max_wait_s=0.01, max_batch=64)
        runner = await AgentRunner.start(cfg, batcher, renderer, cfg.model.max_context, worker_id="w")
        try:
            return list(await asyncio.gather(*(runner.episode(t, group_id="g") for t in tasks))), runner
        finally:
            await runner.stop()
            batcher.close()

    episodes, runner = asyncio.run(go())
    return episodes, runner, policy


def test_calculator_agent_episodes_are_token_exact_trajectories() -> None:
    cfg = agent_cfg()
    episodes, runner, policy = run_agents(cfg, 6)
    assert runner.counts["episodes"] == 6 and runner.counts["agent_errors"] == 0
    checked = 0
    for trajs in episodes:
        for t in trajs:
            t.validate()
            assert t.model_versions() and set(t.model_versions()) == {4}
            assert t.group_id == "g" and t.worker_id == "w"
        if len(trajs) == 1 and trajs[0].reward_components["gateway/per_call"] == 0:
            t = trajs[0]
            # the trainer recomputes exactly the behaviour log-probs on the recorded ids
            ids = torch.tensor([t.token_ids()])
            lp = token_logprobs(policy.model, ids, torch.ones_like(ids), temperature=1.0)[0]
            mask = torch.tensor(t.loss_mask(), dtype=torch.bool)
            behaviour = torch.tensor(t.behaviour_logprobs())
            torch.testing.assert_close(lp[mask], behaviour[mask], atol=1e-4, rtol=0)
            checked += 1
    assert checked >= 3
    # the untrained model rarely calls a tool correctly, but every episode made at least one call
    assert all(t.num_model_tokens() > 0 for trajs in episodes for t in trajs)


def test_a_failing_agent_ends_only_its_episode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bad_agent.py").write_text(
        "async def run(task, client):\n"
        "    await client.chat.completions.create(model='asyncrl-policy', messages=[{'role': 'user', 'content': 'x'}])\n"
        "    raise RuntimeError('agent bug')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = agent_cfg("env.path=bad_agent:run")
    episodes, runner, _ = run_agents(cfg, 3)
    assert runner.counts["agent_errors"] == 3
    assert all(ts[0].outcome == "env_error" and ts[0].final_reward == 0.0 for ts in episodes)
    assert all(ts[0].num_model_tokens() > 0 for ts in episodes)  # the calls made are still recorded


def test_agent_config_and_loading_errors_are_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Exception, match=r"env\.kind .agent. needs env\.path"):
        load_config(None, ["env.kind=agent"])
    with pytest.raises(AgentLoadError, match=r"package\.module:function"):
        load_agent("no_colon")
    with pytest.raises(AgentLoadError, match="cannot import"):
        load_agent("nowhere_module_xyz:run")
    (tmp_path / "sync_agent.py").write_text("def run(task, client):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AgentLoadError, match="async def run"):
        load_agent("sync_agent:run")
    assert load_agent("examples.calculator_openai:run").__name__ == "run"


# -- success follows the task's verifier, not the sign of the reward (issue 29) --------------------------
AGENTS = {
    "shaped_agent": (
        "async def run(task, client):\n"
        "    await client.chat.completions.create(model='asyncrl-policy', messages=[{'role': 'user', 'content': 'x'}])\n"
        "    return 0.5  # a shaped reward, whatever the answer\n"
    ),
    "explicit_agent": (
        "async def run(task, client):\n"
        "    await client.chat.completions.create(model='asyncrl-policy', messages=[{'role': 'user', 'content': 'x'}])\n"
        "    return {'reward': 0.2, 'success': True}\n"
    ),
    "posting_agent": (
        "async def run(task, client):\n"
        "    await client.chat.completions.create(model='asyncrl-policy', messages=[{'role': 'user', 'content': 'x'}])\n"
        "    sid = client.default_headers['X-Asyncrl-Session']\n"
        "    await client.post(f'/sessions/{sid}/reward', body={'reward': 0.25}, cast_to=object)\n"
        "    return None\n"
    ),
}


def scripted_episodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: str, answer: str) -> list[Any]:
    """Two episodes of ``agent`` (a module of :data:`AGENTS`) on the calculator task whose answer is 12,
    the policy scripted to reply ``answer``."""
    from test_gateway import RENDER, TASK, ScriptedEngine

    (tmp_path / f"{agent}.py").write_text(AGENTS[agent])
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = agent_cfg(f"env.path={agent}:run")

    async def go() -> list[Any]:
        batcher = TurnBatcher(ScriptedEngine([answer] * 2), max_wait_s=0.005, max_batch=64)
        runner = await AgentRunner.start(cfg, batcher, RENDER, 512, worker_id="w")
        try:
            return [await runner.episode(TASK, group_id="g") for _ in range(2)]
        finally:
            await runner.stop()
            batcher.close()

    return [trajs[0] for trajs in asyncio.run(go())]


def test_a_positive_reward_is_no_success_when_the_verifier_says_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = scripted_episodes(tmp_path, monkeypatch, "shaped_agent", "<answer>13</answer>")
    assert [(t.outcome, t.final_reward) for t in wrong] == [("failure", 0.5)] * 2
    right = scripted_episodes(tmp_path, monkeypatch, "shaped_agent", "<answer>12</answer>")
    assert [(t.outcome, t.final_reward) for t in right] == [("success", 0.5)] * 2


def test_an_explicit_success_from_the_agent_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ts = scripted_episodes(tmp_path, monkeypatch, "explicit_agent", "<answer>13</answer>")
    assert [(t.outcome, t.final_reward) for t in ts] == [("success", 0.2)] * 2


def test_an_agent_learns_its_session_id_from_its_client_and_posts_its_reward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ts = scripted_episodes(tmp_path, monkeypatch, "posting_agent", "<answer>12</answer>")
    assert [(t.outcome, t.final_reward) for t in ts] == [("success", 0.25)] * 2


def test_held_out_evaluation_plays_the_agent_through_a_private_gateway() -> None:
    """``asyncrl eval`` on ``env.kind: agent``: one episode of the user's program per held-out task, as
    evaluation (worker ``eval``), every task answered."""
    from asyncrl.rollout.heldout import run_episodes, summarise

    cfg = agent_cfg()
    tasks = make_task_source(cfg.env).heldout()[:4]
    trajs = asyncio.run(run_episodes(cfg, Policy.build(cfg.model), tasks, seed=0))
    assert {t.task.id for t in trajs} == {t.id for t in tasks} and {t.worker_id for t in trajs} == {"eval"}
    assert summarise(trajs)["episodes"] == 4
