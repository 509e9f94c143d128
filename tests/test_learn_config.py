"""configs/smollm2_arithmetic.yaml, the real-model task chosen to start with signal (issue #26).

Its numbers were measured (docs/benchmarks.md "Choosing the demo-real task"); these tests keep the
file meaning what was measured: the held-out size, the portable device, and a system prompt whose
example call is one the environment runs, written the way the warm start's demonstrations are.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

from asyncrl.config import load_config
from asyncrl.envs import make_task_source
from asyncrl.envs.registry import make_raw_env
from asyncrl.policy.toolcalls import HermesFormat

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "smollm2_arithmetic.yaml"


def test_the_config_is_a_portable_lora_run_with_64_heldout_tasks() -> None:
    cfg = load_config(CONFIG)
    assert cfg.model.device == "auto"  # runs on a GPU unchanged
    assert cfg.model.lora is not None and cfg.model.path is not None
    assert cfg.control.mode == "async"
    assert cfg.env.heldout_size >= 64
    assert cfg.trainer.sft.steps  # the measured 25 % is after the warm start, not at base
    assert (cfg.env.kind, cfg.env.min_difficulty, cfg.env.max_difficulty) == ("calculator", 1, 1)


def test_64_distinct_heldout_tasks_exist_and_training_never_draws_one() -> None:
    cfg = load_config(CONFIG)
    source = make_task_source(cfg.env)
    heldout = {source.content_key(t) for t in source.heldout()}
    assert len(heldout) == cfg.env.heldout_size
    rng = random.Random(0)
    train = {source.content_key(source.sample(rng)) for _ in range(3000)}
    assert not heldout & train
    assert len(train) > 300  # enough distinct training problems for the RL steps


def test_system_prompt_example_is_a_call_the_env_runs_in_the_demonstrations_format() -> None:
    cfg = load_config(CONFIG)
    assert cfg.model.system_prompt is not None
    fmt = HermesFormat()
    found = fmt.find_call(cfg.model.system_prompt)
    assert isinstance(found, tuple), found
    name, arguments = found[0], found[1]  # later formats also return the call's id
    env = make_raw_env(cfg.env)
    action = fmt.to_action(cfg.model.system_prompt.split("The result")[0], env.tools)
    task = make_task_source(cfg.env).heldout()[0]

    async def run() -> tuple[bool, str]:
        await env.reset(task)
        result = await env.step(action)
        return result.tool_call is not None and result.tool_call.ok, result.observation

    ok, observation = asyncio.run(run())
    assert ok and observation == "19", (action, observation)
    # the warm start writes its calls with the same name and argument keys as the prompt's example
    demo = fmt.from_action(env.solve(task)[0], env.tools)
    demo_call = json.loads(demo.removeprefix(fmt.OPEN).removesuffix(fmt.CLOSE))
    assert demo_call["name"] == name
    assert set(demo_call["arguments"]) == set(arguments)


STRINGS = CONFIG.parent / "smollm2_strings.yaml"


def test_the_strings_config_branches_between_calls_by_reference() -> None:
    """configs/smollm2_strings.yaml (issue #27's SmolLM2 study): two calls by reference, 64 held-out
    tasks never drawn in training, and a system-prompt example the environment runs the way the
    demonstrations write it."""
    cfg = load_config(STRINGS)
    assert cfg.model.lora is not None and cfg.model.device == "auto" and cfg.control.mode == "async"
    assert (cfg.env.kind, cfg.env.min_difficulty, cfg.env.max_difficulty) == ("strings", 2, 2)
    assert cfg.env.options == {"reference": True} and cfg.env.max_turns >= 3
    source = make_task_source(cfg.env)
    heldout = {source.content_key(t) for t in source.heldout()}
    rng = random.Random(0)
    assert len(heldout) == cfg.env.heldout_size == 64
    assert not heldout & {source.content_key(source.sample(rng)) for _ in range(3000)}
    assert cfg.model.system_prompt is not None
    fmt = HermesFormat()
    env = make_raw_env(cfg.env)
    action = fmt.to_action(cfg.model.system_prompt.split("_ is the")[0], env.tools)
    task = source.heldout()[0]

    async def run() -> str:
        await env.reset(task)
        result = await env.step(action)
        assert result.tool_call is not None and result.tool_call.ok, result.observation
        return result.observation

    assert asyncio.run(run()) == task.payload["word"][::-1]  # "reverse, _" on the input word
    demo = fmt.from_action(env.solve(task)[0], env.tools)
    demo_call = json.loads(demo.removeprefix(fmt.OPEN).removesuffix(fmt.CLOSE))
    assert demo_call["name"] == "apply" and demo_call["arguments"]["call"].endswith(", _")
