"""Demonstrations from the user's data (:mod:`asyncrl.envs.demos`): a dataset's worked-solution column
(GSM8K's ``#### N`` understood), a ``demonstrator`` function for ``dataset``, ``reasoning_gym`` and
``class``, the line saying a warm start never shows the tools, and a mix member's system prompt and
share of the warm start."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from asyncrl.config import EnvConfig, load_config
from asyncrl.envs import make_raw_env, make_task_source
from asyncrl.envs import reasoning_gym_env as rge
from asyncrl.envs.check import check_environment
from asyncrl.envs.demos import split_solution
from asyncrl.envs.imports import EnvPluginError
from asyncrl.envs.registry import tool_notes
from asyncrl.errors import UserError
from asyncrl.jobs import train as train_job
from asyncrl.policy.toolcalls import make_format
from helpers import run_texts_sync
from test_envs_class import TRL_STYLE

GSM8K = [
    {
        "question": f"Natalia sold clips to {2 * i} friends in April, and half as many in May. How many in all?",
        "answer": f"In May she sold {2 * i}/2 = <<{2 * i}/2={i}>>{i} clips.\n"
        f"In all she sold {2 * i}+{i} = <<{2 * i}+{i}={3 * i}>>{3 * i} clips.\n#### {3 * i}",
    }
    for i in range(1, 81)
]
"""Rows in GSM8K's own layout: the answer column is the worked solution ending with ``#### N``."""

SUMS = [
    {"question": f"Add {i} and {i + 3}.", "answer": str(2 * i + 3), "a": i, "b": i + 3} for i in range(80)
]

DEMOS = '''
def with_calc(example, rng):
    """dataset: the row's own columns a and b; reasoning_gym: the entry's question."""
    if "question" in example and "a" not in example:
        expr = example.pop("question").removeprefix("Calculate ").rstrip(".")
        example["metadata"].clear()  # changes what it was given: its own copy
        return [f"<tool>calc({expr})</tool>", f"<answer>{example['answer']}</answer>"]
    return [f"<tool>calc({example['a']}+{example['b']})</tool>", f"<answer>{example['a'] + example['b']}</answer>"]


def guess_twice(row, rng):
    return [f"<tool>guess({int(row['secret']) + 1})</tool>", f"<tool>guess({row['secret']})</tool>", "<answer>done</answer>"]


def answers_only(example, rng):
    return [f"<answer>{example['answer']}</answer>"]


def a_string(example, rng):
    return "<answer>1</answer>"


def a_number_inside(example, rng):
    return ["<answer>1</answer>", 7]


def raises(example, rng):
    raise KeyError("no such column")


NOT_A_FUNCTION = 3
'''


@pytest.fixture
def demos_module(tmp_path: Path) -> Iterator[str]:
    """A user module ``user_demos`` on ``sys.path``."""
    (tmp_path / "user_demos.py").write_text(DEMOS)
    sys.path.insert(0, str(tmp_path))
    yield "user_demos"
    sys.path.remove(str(tmp_path))
    sys.modules.pop("user_demos", None)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def ds_env(path: Path, *extra: str) -> EnvConfig:
    return load_config(
        None, ["env.kind=dataset", f"env.dataset.path={path}", "env.heldout_size=4", *extra]
    ).env


def rg_env(*extra: str) -> EnvConfig:
    sets = "[{name: basic_arithmetic, config: {operators: ['+']}}]"
    return load_config(
        None, ["env.kind=reasoning_gym", f"env.reasoning_gym.datasets={sets}", "env.heldout_size=8", *extra]
    ).env


# -- dataset.solution_field --------------------------------------------------------------------------
def test_gsm8k_final_line_is_the_answer_and_the_text_before_it_the_reasoning() -> None:
    assert split_solution("Half of 48 is 24.\nSo 72.\n#### 72") == ("Half of 48 is 24.\nSo 72.", "72")
    assert split_solution("  #### -3.5 ") == ("", "-3.5")
    assert split_solution("No final line, 72.") == ("No final line, 72.", None)
    assert split_solution("a #### 5 in the middle\nthen text") == ("a #### 5 in the middle\nthen text", None)


def test_a_worked_solution_is_demonstrated_and_its_episode_succeeds(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    cfg = ds_env(path, "env.dataset.solution_field=answer", "env.dataset.scorer=numeric")
    env, source = make_raw_env(cfg), make_task_source(cfg)
    task = source.sample(random.Random(0))
    i = int(task.payload["answer"]) // 3
    assert task.payload["answer"] == str(3 * i)  # the answer column read as its #### line
    (turn,) = env.solve(task)
    assert turn == f"{GSM8K[i - 1]['answer'].rsplit('####', 1)[0].strip()}\n<answer>{3 * i}</answer>"
    assert run_texts_sync(env, task, [turn])[-1].outcome == "success"
    rng = random.Random(0)
    wrong = [env.demonstrate(task, rng, 1.0)[0] for _ in range(10)]
    assert all(
        w.startswith("In May she sold") and w != turn for w in wrong
    )  # the reasoning kept, the answer off
    assert all(run_texts_sync(env, task, [w])[-1].outcome == "failure" for w in wrong)
    report = check_environment(cfg, episodes=2, warm_start=load_config(None, []).trainer.sft)
    assert report.ok and "clean demonstrations succeeded on 2 task(s)" in report.render()


def test_a_solution_column_without_a_final_line_is_followed_by_the_rows_answer(tmp_path: Path) -> None:
    rows = [{**r, "why": f"{r['a']} plus {r['b']} is {r['answer']}."} for r in SUMS]
    cfg = ds_env(write_jsonl(tmp_path / "rows.jsonl", rows), "env.dataset.solution_field=why")
    env, task = make_raw_env(cfg), make_task_source(cfg).sample(random.Random(1))
    a, b = task.payload["prompt"].removeprefix("Add ").rstrip(".").split(" and ")
    assert env.solve(task) == [
        f"{a} plus {b} is {task.payload['answer']}.\n<answer>{task.payload['answer']}</answer>"
    ]
    assert run_texts_sync(env, task, env.solve(task))[-1].outcome == "success"
    with pytest.raises(EnvPluginError, match="row 0 has no field 'how'"):
        make_task_source(ds_env(write_jsonl(tmp_path / "r2.jsonl", rows), "env.dataset.solution_field=how"))


def test_a_chat_models_demonstrated_turn_keeps_the_reasoning_before_the_action() -> None:
    hermes = make_format("hermes")
    assert (
        hermes.from_action("Half of 48 is 24.\n<answer>72</answer>", [])
        == "Half of 48 is 24.\n<answer>72</answer>"
    )
    call = hermes.from_action("First add.\n<tool>calc(2+3)</tool>", [])
    assert (
        call.startswith("First add.\n<tool_call>") and hermes.to_action(call, []) == "<tool>calc(2+3)</tool>"
    )


# -- demonstrator: module:function ------------------------------------------------------------------
def test_a_dataset_demonstrator_gets_the_whole_row_and_its_tool_calls_succeed(
    tmp_path: Path, demos_module: str
) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", SUMS)
    cfg = ds_env(path, "env.dataset.tools=[calc]", f"env.dataset.demonstrator={demos_module}:with_calc")
    env, task = make_raw_env(cfg), make_task_source(cfg).sample(random.Random(0))
    row = next(r for r in SUMS if r["question"] == task.payload["prompt"])
    clean = env.solve(task)
    assert clean == [f"<tool>calc({row['a']}+{row['b']})</tool>", f"<answer>{row['answer']}</answer>"]
    results = run_texts_sync(env, task, clean)
    assert results[0].tool_call is not None and results[0].tool_call.result == row["answer"]
    assert results[-1].outcome == "success" and results[-1].process_reward > 0  # the answer uses the result
    corrupted = env.demonstrate(task, random.Random(0), 1.0)
    assert corrupted[0] != clean[0] and corrupted[1] == clean[1]  # one number changed, in the tool call
    report = check_environment(cfg, episodes=2, warm_start=load_config(None, []).trainer.sft)
    assert report.ok and "offers the tools" not in report.render()


def test_a_reasoning_gym_demonstrator_gets_the_entry(demos_module: str) -> None:
    cfg = rg_env("env.reasoning_gym.tools=[calc]", f"env.reasoning_gym.demonstrator={demos_module}:with_calc")
    env, task = make_raw_env(cfg), make_task_source(cfg).sample(random.Random(0))
    turns = env.solve(task)
    assert turns[0].startswith("<tool>calc(") and turns[1] == f"<answer>{rge.entry(task)['answer']}</answer>"
    results = run_texts_sync(env, task, turns)
    assert results[0].tool_call is not None and results[-1].outcome == "success"
    assert env.solve(task) == turns and rge.entry(task)["metadata"]  # the function was given a copy


def test_a_class_demonstrator_replaces_demo_field(tmp_path: Path, demos_module: str) -> None:
    (tmp_path / "guess_env.py").write_text(TRL_STYLE)
    rows = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": f"Find #{i}.", "secret": i} for i in range(60)])
    mod = tmp_path / "guess_env.py"
    section = {"factory": f"{mod}:Guess", "reward": f"{mod}:reward_func", "rows": str(rows)}
    cfg = EnvConfig(
        kind="class", heldout_size=4, class_env={**section, "demonstrator": f"{demos_module}:guess_twice"}
    )
    env, task = make_raw_env(cfg), make_task_source(cfg).sample(random.Random(0))
    secret = task.payload["row"]["secret"]
    assert env.solve(task) == [
        f"<tool>guess({secret + 1})</tool>",
        f"<tool>guess({secret})</tool>",
        "<answer>done</answer>",
    ]
    assert run_texts_sync(env, task, env.solve(task))[-1].outcome == "success"
    with pytest.raises(ValidationError, match="set demo_field or demonstrator, not both"):
        EnvConfig(kind="class", class_env={**section, "demo_field": "secret", "demonstrator": "m:f"})
    run = ["env.kind=class", f"env.class_env.factory={section['factory']}", f"env.class_env.rows={rows}"]
    load_config(
        None, [*run, f"env.class_env.demonstrator={demos_module}:guess_twice"]
    )  # warm-starts: accepted
    with pytest.raises(UserError, match=r"env\.class_env\.demonstrator"):  # demonstrations only: none to give
        load_config(None, [*run, "trainer.sft.source=demos"])
    assert load_config(None, run).trainer.sft.source == "auto"  # auto: rounds of the policy's own episodes


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (
            "no_such_function",
            r"env\.reasoning_gym\.demonstrator: 'user_demos' has no attribute 'no_such_function'",
        ),
        (
            "NOT_A_FUNCTION",
            r"env\.reasoning_gym\.demonstrator 'user_demos:NOT_A_FUNCTION' is a int, not a function",
        ),
        (
            "a_string",
            r"returned '<answer>1</answer>'; it must return the model turns, a non-empty list of strings",
        ),
        ("a_number_inside", r"returned a list holding a int; it must return the model turns"),
        ("raises", r"env\.reasoning_gym\.demonstrator 'user_demos:raises' raised KeyError: 'no such column'"),
    ],
)
def test_demonstrator_mistakes_are_one_line_naming_the_field(
    demos_module: str, function: str, message: str
) -> None:
    cfg = rg_env(f"env.reasoning_gym.demonstrator={demos_module}:{function}")
    with pytest.raises(EnvPluginError, match=message) as caught:
        env = make_raw_env(cfg)
        env.solve(make_task_source(cfg).sample(random.Random(0)))
    assert "\n" not in str(caught.value)


def test_a_missing_demonstrator_module_and_a_second_demonstration_source_are_refused(tmp_path: Path) -> None:
    cfg = rg_env("env.reasoning_gym.demonstrator=no_such_module_xyz:f")
    with pytest.raises(
        EnvPluginError, match=r"env\.reasoning_gym\.demonstrator: module 'no_such_module_xyz' not found"
    ):
        make_raw_env(cfg)
    with pytest.raises(UserError, match="set solution_field or demonstrator, not both"):
        ds_env(tmp_path / "x.jsonl", "env.dataset.solution_field=s", "env.dataset.demonstrator=m:f")


# -- tools the warm start never shows -----------------------------------------------------------------
def test_env_check_and_the_run_say_when_the_warm_start_never_calls_the_tools(
    demos_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    answer_only = rg_env("env.reasoning_gym.tools=[calc]")
    report = check_environment(answer_only, episodes=2)
    line = "env.reasoning_gym offers the tools ['calc'] but none of 2 warm-start demonstrations calls one"
    assert report.ok and f"WARN  tools: {line}" in report.render()
    for good in (
        rg_env(),
        rg_env("env.reasoning_gym.tools=[calc]", f"env.reasoning_gym.demonstrator={demos_module}:with_calc"),
    ):
        assert "offers the tools" not in check_environment(good, episodes=2).render()
    sets = "[{name: basic_arithmetic, config: {operators: ['+']}}]"
    run = ["env.kind=reasoning_gym", f"env.reasoning_gym.datasets={sets}", "env.reasoning_gym.tools=[calc]"]
    train_job._check_env(load_config(None, run), None)  # the preflight: the run's first lines
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "asyncrl: env.reasoning_gym offers the tools ['calc'] but none of 8" in err
    )
    train_job._check_env(load_config(None, [*run, "trainer.sft.steps=0"]), None)  # no warm start: no line
    assert capsys.readouterr().err == ""


# -- mix: a system prompt and a share of the warm start per member -------------------------------------
def mix_cfg(tmp_path: Path, **extra: dict[str, Any]) -> EnvConfig:
    path = write_jsonl(tmp_path / "rows.jsonl", SUMS)
    members = [
        {
            "name": "arith",
            "weight": 3.0,
            "env": {"kind": "calculator", "heldout_size": 4},
            **extra.get("arith", {}),
        },
        {
            "name": "sums",
            "env": {"kind": "dataset", "heldout_size": 4, "dataset": {"path": str(path), "tools": ["calc"]}},
            **extra.get("sums", {}),
        },
    ]
    return EnvConfig(kind="mix", mix=members)


def test_a_members_system_prompt_leads_its_prompts_only(tmp_path: Path) -> None:
    cfg = mix_cfg(tmp_path, sums={"system_prompt": "Answer with a number."})
    env, source = make_raw_env(cfg), make_task_source(cfg)
    held = {t.env: t for t in source.heldout()}
    assert (
        asyncio.run(env.reset(held["sums"])) == f"Answer with a number.\n\n{held['sums'].payload['prompt']}"
    )
    assert asyncio.run(env.reset(held["arith"])) == held["arith"].payload["prompt"]


def test_warm_start_demonstrations_follow_the_members_sft_share(tmp_path: Path) -> None:
    rng = random.Random(0)
    by_weight = make_task_source(mix_cfg(tmp_path)).for_warm_start()
    assert (
        0.70 < Counter(by_weight.sample(rng).env for _ in range(2000))["arith"] / 2000 < 0.80
    )  # weight 3 : 1
    shared = make_task_source(mix_cfg(tmp_path, arith={"sft_share": 1.0}, sums={"sft_share": 3.0}))
    assert 0.70 < Counter(shared.for_warm_start().sample(rng).env for _ in range(2000))["sums"] / 2000 < 0.80
    assert (
        0.70 < Counter(shared.sample(rng).env for _ in range(2000))["arith"] / 2000 < 0.80
    )  # RL keeps the weights
    none = make_task_source(mix_cfg(tmp_path, arith={"sft_share": 0}))
    assert {none.for_warm_start().sample(rng).env for _ in range(200)} == {"sums"}
    with pytest.raises(UserError, match=r"every env\.mix member has sft_share 0"):
        make_task_source(mix_cfg(tmp_path, arith={"sft_share": 0}, sums={"sft_share": 0})).for_warm_start()


def test_a_member_without_demonstrations_and_share_0_passes_the_warm_start_check(tmp_path: Path) -> None:
    (tmp_path / "guess_env.py").write_text(TRL_STYLE)
    rows = write_jsonl(tmp_path / "guess.jsonl", [{"prompt": f"Find #{i}.", "secret": i} for i in range(60)])
    section = {"factory": f"{tmp_path / 'guess_env.py'}:Guess", "rows": str(rows)}
    guess = {"name": "guess", "env": {"kind": "class", "heldout_size": 4, "class_env": section}}
    sft = load_config(None, ["trainer.sft.source=demos"]).trainer.sft  # auto would play rounds instead
    refused = check_environment(
        EnvConfig(kind="mix", mix=[guess, {"name": "a", "env": {"kind": "calculator"}}]),
        episodes=1,
        warm_start=sft,
    )
    assert not refused.ok and "guess: demonstrate" in refused.render()
    shared = EnvConfig(
        kind="mix", mix=[{**guess, "sft_share": 0}, {"name": "a", "env": {"kind": "calculator"}}]
    )
    assert check_environment(shared, episodes=1, warm_start=sft).ok


def test_mix_notes_name_the_member_whose_tools_the_warm_start_never_shows(tmp_path: Path) -> None:
    cfg = mix_cfg(tmp_path)
    notes = tool_notes(cfg, make_task_source(cfg), make_raw_env(cfg))
    assert notes == [
        "env.mix member 'sums' (env.dataset) offers the tools ['calc'] but none of 8 warm-start demonstrations "
        "calls one (they only answer): the warm start teaches answering without tools; give a demonstrator "
        "whose turns call them (docs/environments.md#demonstrations-from-your-data)"
    ]
    assert (
        tool_notes(mix_cfg(tmp_path, sums={"sft_share": 0}), make_task_source(cfg), make_raw_env(cfg)) == []
    )


def test_the_warm_start_plays_each_members_share_and_a_worked_solution_is_trained_whole(
    tmp_path: Path,
) -> None:
    from asyncrl.jobs.warm_start import build_demonstrations
    from asyncrl.policy.renderer import TextRenderer
    from asyncrl.policy.tokenizer import build_tokenizer

    (tmp_path / "guess_env.py").write_text(TRL_STYLE)
    rows = write_jsonl(tmp_path / "guess.jsonl", [{"prompt": f"Find #{i}.", "secret": i} for i in range(60)])
    gsm = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    guess = {
        "kind": "class",
        "heldout_size": 4,
        "class_env": {"factory": f"{tmp_path / 'guess_env.py'}:Guess", "rows": str(rows)},
    }
    ds = {"kind": "dataset", "heldout_size": 4, "dataset": {"path": str(gsm), "solution_field": "answer"}}
    members = [
        {"name": "guess", "weight": 5, "sft_share": 0, "env": guess},
        {"name": "gsm", "system_prompt": "Show your work.", "env": ds},
    ]
    cfg = load_config(None, ["trainer.sft.num_demos=12"])
    cfg = cfg.model_copy(update={"env": EnvConfig(kind="mix", mix=members)})
    tok = build_tokenizer("char")
    demos = build_demonstrations(cfg, TextRenderer(tok), max_context=4096)
    assert len(demos) == 12  # every one from the member with a share: the guess game has no demonstrations
    for ids, mask in demos:
        prompt = tok.decode([i for i, m in zip(ids, mask, strict=True) if m == 0])
        turn = tok.decode([i for i, m in zip(ids, mask, strict=True) if m == 1])
        assert "Show your work." in prompt and turn.startswith("In May she sold") and "####" not in turn
