"""The three built-in environments: solvers succeed, splits are disjoint, difficulty means what
it says, demonstrations are corrupted at the configured rate, tools reject bad input."""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

import pytest

from asyncrl.config import EnvConfig, SandboxConfig
from asyncrl.envs import (
    CalcError,
    CalculatorEnv,
    KBLookupEnv,
    PythonEnv,
    StepResult,
    StringsEnv,
    evaluate,
    make_raw_env,
    make_task_source,
)
from asyncrl.envs.base import parse_action
from asyncrl.records import Task


def run_episode(env: Any, task: Task, texts: list[str]) -> tuple[str, list[StepResult]]:
    async def go() -> tuple[str, list[StepResult]]:
        prompt = await env.reset(task)
        results = []
        for text in texts:
            results.append(await env.step(text))
            if results[-1].done:
                break
        return prompt, results

    return asyncio.run(go())


def cfg(kind: str, lo: int, hi: int, **kw: Any) -> EnvConfig:
    return EnvConfig(kind=kind, min_difficulty=lo, max_difficulty=hi, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# calculator
# ---------------------------------------------------------------------------------------------
def test_calculator_solver_succeeds_and_difficulty_is_tool_calls() -> None:
    c = cfg("calculator", 1, 5)
    src, env = make_task_source(c), make_raw_env(c)
    rng = random.Random(1)
    for i in range(300):
        task = src.sample(rng)
        texts = CalculatorEnv.solve(task)
        prompt, results = run_episode(env, task, texts)
        calls = [t for t in texts if t.startswith("<tool>")]
        assert len(calls) == task.difficulty
        assert results[-1].done and results[-1].outcome == "success" and results[-1].reward == 1.0
        assert all(-1 <= r.process_reward <= 1 for r in results)
        assert all(r.tool_call is not None and r.tool_call.ok for r in results[:-1])
        assert prompt.isascii() and len(prompt) < 220 and "\n" not in prompt
        if i < 50:  # intermediate results non-negative and < 1000
            assert all(0 <= int(r.observation) < 1000 for r in results[:-1])


def test_calculator_chain_property() -> None:
    """Numbers appear in order; each call is <previous result><op><next number>."""
    src = make_task_source(cfg("calculator", 2, 4))
    rng = random.Random(2)
    for _ in range(200):
        task = src.sample(rng)

        numbers = [int(x) for x in re.findall(r"\d+", task.payload["prompt"])]
        steps = task.payload["steps"]
        assert numbers == [task.payload["start"], *[n for _, n in steps]]
        prev = None
        for text in CalculatorEnv.solve(task)[:-1]:
            args = parse_action(text).args  # type: ignore[union-attr]
            lhs = int(re.match(r"\d+", args).group(0))  # type: ignore[union-attr]
            if prev is not None:
                assert lhs == prev
            prev = evaluate(args)
        assert str(prev) == task.payload["answer"]


def test_calculator_heldout_is_disjoint_and_deterministic() -> None:
    c = cfg("calculator", 2, 3)
    src = make_task_source(c)
    held = src.heldout()
    assert len(held) == c.heldout_size and held == make_task_source(c).heldout()
    assert {t.difficulty for t in held} == {2, 3}
    keys = {src.content_key(t) for t in held}  # type: ignore[attr-defined]
    rng = random.Random(3)
    train = [src.sample(rng) for _ in range(3000)]
    assert not keys & {src.content_key(t) for t in train}  # type: ignore[attr-defined]
    assert not {t.id for t in held} & {t.id for t in train}


def test_calculator_demonstrate_corruption_rate() -> None:
    src = make_task_source(cfg("calculator", 1, 4))
    rng = random.Random(4)
    n, rate = 2000, 0.3
    corrupted = 0
    env = make_raw_env(cfg("calculator", 1, 4))
    for i in range(n):
        task = src.sample(rng)
        demo = CalculatorEnv.demonstrate(task, rng, rate)
        if demo != CalculatorEnv.solve(task):
            corrupted += 1
            if i % 20 == 0:  # a corrupted demo is still a valid episode (mostly wrong)
                _, results = run_episode(env, task, demo)
                assert results[-1].done
    assert abs(corrupted / n - rate) < 0.04
    assert all(CalculatorEnv.demonstrate(src.sample(rng), rng, 0.0) for _ in range(10))


@pytest.mark.parametrize(
    ("expr", "value"),
    [("3*4", 12), ("12+12", 24), ("24-5", 19), ("-(2+3)*4", -20), (" 8 / 2 ", 4), ("2*(3+4)", 14)],
)
def test_calc_evaluates(expr: str, value: int) -> None:
    assert evaluate(expr) == value


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os')",
        "2**10",
        "1/0",
        "7/2",
        "",
        "3+",
        "(1",
        "1)",
        "abs(-1)",
        "1e5",
        "9" * 16,
        "2;3",
        "1 2",
    ],
)
def test_calc_rejects_non_arithmetic(expr: str) -> None:
    with pytest.raises(CalcError):
        evaluate(expr)


def test_calc_tool_error_is_an_observation_not_a_crash() -> None:
    env = CalculatorEnv()
    task = make_task_source(cfg("calculator", 2, 2)).sample(random.Random(0))
    _, results = run_episode(
        env, task, ["<tool>calc(__import__('os').system('true'))</tool>", "<tool>nope(1)</tool>", "junk"]
    )
    assert all(not r.done for r in results)
    assert results[0].observation.startswith("error:") and results[0].process_reward < 0
    assert results[0].tool_call is not None and not results[0].tool_call.ok
    assert "unknown tool" in results[1].observation and results[1].process_reward < 0
    assert results[2].process_reward < 0


def test_wrong_answer_fails_and_repeated_final_step_is_stable() -> None:
    env = CalculatorEnv()
    task = make_task_source(cfg("calculator", 2, 2)).sample(random.Random(0))

    async def go() -> tuple[StepResult, StepResult]:
        await env.reset(task)
        first = await env.step("<answer>-1</answer>")
        return first, await env.step("<answer>-1</answer>")

    first, again = asyncio.run(go())
    assert first.done and first.outcome == "failure" and first.reward == 0.0
    assert again.done and again.outcome == "failure" and again.process_reward == 0.0


# ---------------------------------------------------------------------------------------------
# kb_lookup
# ---------------------------------------------------------------------------------------------
def test_kb_solver_succeeds_and_difficulty_is_hops() -> None:
    c = cfg("kb_lookup", 1, 3)
    src, env = make_task_source(c), make_raw_env(c)
    rng = random.Random(5)
    for _ in range(200):
        task = src.sample(rng)
        texts = KBLookupEnv.solve(task)
        assert len(texts) - 1 == task.difficulty == len(task.payload["chain"])
        prompt, results = run_episode(env, task, texts)
        assert results[-1].outcome == "success" and results[-1].reward == 1.0
        assert prompt.isascii() and len(prompt) < 120


def test_kb_is_deterministic_per_seed_and_heldout_disjoint() -> None:
    c = cfg("kb_lookup", 2, 3)
    a, b = make_task_source(c), make_task_source(c)
    assert a.heldout() == b.heldout()
    other = make_task_source(cfg("kb_lookup", 2, 3, seed=99))
    assert other.heldout()[0].payload["start"] != a.heldout()[0].payload["start"]
    held = {a.content_key(t) for t in a.heldout()}  # type: ignore[attr-defined]
    rng = random.Random(6)
    assert not held & {a.content_key(a.sample(rng)) for _ in range(3000)}  # type: ignore[attr-defined]


def test_kb_tool_errors_and_seed_mismatch() -> None:
    c = cfg("kb_lookup", 2, 2)
    task = make_task_source(c).sample(random.Random(0))
    env = make_raw_env(c)
    _, results = run_episode(
        env,
        task,
        [
            "<tool>lookup(Nobody Here, lives_in)</tool>",
            f"<tool>lookup({task.payload['start']}, age)</tool>",
            f"<tool>lookup({task.payload['start']})</tool>",
            f"<tool>lookup({task.payload['start'].upper()},  lives_in )</tool>",  # case-insensitive
        ],
    )
    assert [r.observation.startswith("error:") for r in results] == [True, True, True, False]
    wrong_seed = KBLookupEnv(seed=c.seed + 1)
    with pytest.raises(ValueError, match="seed"):
        run_episode(wrong_seed, task, [])


def test_kb_demonstrate_corruption_rate() -> None:
    src = make_task_source(cfg("kb_lookup", 1, 3))
    rng = random.Random(7)
    n, rate = 1500, 0.25
    corrupted = sum(
        KBLookupEnv.demonstrate(t, rng, rate) != KBLookupEnv.solve(t)
        for t in (src.sample(rng) for _ in range(n))
    )
    assert abs(corrupted / n - rate) < 0.04


def test_kb_options_are_validated() -> None:
    from asyncrl.envs import EnvPluginError

    with pytest.raises(EnvPluginError, match="unknown"):
        make_raw_env(cfg("kb_lookup", 2, 3, options={"num_persons": 5}))
    small = cfg("kb_lookup", 2, 3, options={"num_people": 50})
    task = make_task_source(small).sample(random.Random(0))
    assert run_episode(make_raw_env(small), task, KBLookupEnv.solve(task))[1][-1].outcome == "success"


# ---------------------------------------------------------------------------------------------
# strings
# ---------------------------------------------------------------------------------------------
def test_strings_solver_succeeds_and_difficulty_is_operations() -> None:
    from asyncrl.envs.strings import OPERATIONS, run_pipeline

    c = cfg("strings", 1, 3)
    src, env = make_task_source(c), make_raw_env(c)
    rng = random.Random(5)
    for _ in range(200):
        task = src.sample(rng)
        texts = StringsEnv.solve(task)
        ops = task.payload["ops"]
        assert len(texts) - 1 == task.difficulty == len(ops) == len(set(ops))
        assert (
            set(ops) <= set(OPERATIONS)
            and run_pipeline(task.payload["word"], ops)[-1] == task.payload["answer"]
        )
        prompt, results = run_episode(env, task, texts)
        assert prompt == task.payload["prompt"] and prompt.isascii()
        assert results[-1].outcome == "success" and results[-1].reward == 1.0
        assert [r.observation for r in results[:-1]] == task.payload["path"]  # each step feeds the next
    # hand-checked pipeline
    assert run_pipeline("kolabe", ["reverse", "upper", "drop_vowels"]) == ["ebalok", "EBALOK", "BLK"]


def test_strings_heldout_disjoint_and_demonstrations_corrupted_at_the_rate() -> None:
    src = make_task_source(cfg("strings", 2, 3))
    held = {src.content_key(t) for t in src.heldout()}  # type: ignore[attr-defined]
    rng = random.Random(6)
    assert held and not held & {src.content_key(src.sample(rng)) for _ in range(3000)}  # type: ignore[attr-defined]
    n, rate = 1500, 0.25
    corrupted = [
        t
        for t in (src.sample(rng) for _ in range(n))
        if StringsEnv.demonstrate(t, rng, rate) != StringsEnv.solve(t)
    ]
    assert abs(len(corrupted) / n - rate) < 0.04


def test_strings_tool_rejects_bad_calls_and_answers_are_exact() -> None:
    c = cfg("strings", 1, 1)
    task = make_task_source(c).sample(random.Random(0))
    env = make_raw_env(c)
    word = task.payload["word"]
    _, results = run_episode(
        env,
        task,
        [
            f"<tool>apply(explode, {word})</tool>",
            "<tool>apply(reverse)</tool>",
            "<tool>apply(reverse, )</tool>",
            f"<tool>apply( reverse ,  {word} )</tool>",
            f"<answer>{task.payload['answer'].swapcase()}</answer>",
        ],
    )
    assert [r.observation.startswith("error:") for r in results[:4]] == [True, True, True, False]
    assert results[3].observation == word[::-1]
    assert results[-1].outcome == "failure"  # case matters: the pipeline's answer exactly


def test_strings_by_reference_resolves_underscore_to_the_previous_result() -> None:
    """With ``reference: true`` ``_`` names the last result (the word at first), in calls and in
    the answer; the demonstrations use it and copy no string; grading and the verifier cache see
    the resolved answer, so the same ``_`` on two paths of one task is graded per path."""
    from asyncrl.envs.strings import run_pipeline

    c = cfg("strings", 3, 3, options={"reference": True})
    src, env = make_task_source(c), make_raw_env(c)
    rng = random.Random(7)
    for _ in range(50):
        task = src.sample(rng)
        texts = StringsEnv.solve(task)
        assert task.payload["reference"] is True
        assert all(t.endswith(", _)</tool>") for t in texts[:-1]) and texts[-1] == "<answer>_</answer>"
        _, results = run_episode(env, task, texts)
        assert [r.observation for r in results[:-1]] == task.payload["path"]
        assert results[-1].outcome == "success" and results[-1].reward == 1.0
        # a wrong order on the same task answers "_" too, and is graded on its own path
        ops = task.payload["ops"]
        swapped = [ops[1], ops[0], ops[2]]
        _, wrong = run_episode(
            env, task, [*(f"<tool>apply({o}, _)</tool>" for o in swapped), "<answer>_</answer>"]
        )
        expected = run_pipeline(task.payload["word"], swapped)[-1] == task.payload["answer"]
        assert (wrong[-1].outcome == "success") is expected
    # the first call's _ is the input word; an explicit text still works; _ counts as using a result
    task = src.sample(rng)
    word, (op1, op2, op3) = task.payload["word"], task.payload["ops"]
    first = run_pipeline(word, [op1])[0]
    _, results = run_episode(
        env,
        task,
        [
            f"<tool>apply({op1}, _)</tool>",
            f"<tool>apply({op2}, {first})</tool>",
            f"<tool>apply({op3}, _)</tool>",
        ],
    )
    assert [r.observation for r in results] == task.payload["path"]
    assert results[1].info["reward_parts"].get("uses_result") and results[2].info["reward_parts"].get(
        "uses_result"
    )
    assert results[0].tool_call is not None and results[0].tool_call.arguments == f"{op1}, {word}"
    # by value (the default) "_" is plain text
    plain = make_raw_env(cfg("strings", 1, 1))
    t1 = make_task_source(cfg("strings", 1, 1)).sample(random.Random(0))
    _, results = run_episode(plain, t1, ["<tool>apply(reverse, _)</tool>", "<answer>_</answer>"])
    assert results[0].observation == "_" and results[-1].outcome == "failure"
    # demonstrations by reference: corrupted at the rate, never copying a string
    n, rate = 1500, 0.4
    demos = [StringsEnv.demonstrate(t, rng, rate) for t in (src.sample(rng) for _ in range(n))]
    assert all(d[-1] == "<answer>_</answer>" and all(", _)" in x for x in d[:-1]) for d in demos)
    wrong = 0
    for _ in range(n):
        t = src.sample(rng)
        _, res = run_episode(env, t, StringsEnv.demonstrate(t, rng, rate))
        wrong += res[-1].outcome != "success"
    assert abs(wrong / n - rate) < 0.04  # every corrupted demonstration fails


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"refrence": True}, "unknown ['refrence']; allowed: ['reference']"),
        ({"reference": "yes"}, "true or false"),
    ],
)
def test_strings_options_errors_name_the_field(options: dict[str, Any], message: str) -> None:
    from asyncrl.errors import UserError

    with pytest.raises(UserError, match=re.escape(message)):
        make_task_source(cfg("strings", 1, 3, options=options))
    with pytest.raises(UserError, match="reference"):
        make_raw_env(cfg("strings", 1, 3, options=options))


# ---------------------------------------------------------------------------------------------
# python
# ---------------------------------------------------------------------------------------------
def test_python_solver_succeeds_through_the_sandbox() -> None:
    c = cfg("python", 1, 3)
    src, env = make_task_source(c), make_raw_env(c)
    rng = random.Random(8)
    seen = set()
    for _ in range(12):
        task = src.sample(rng)
        seen.add(task.task_type)
        texts = PythonEnv.solve(task)
        assert all("\n" not in t and t.isascii() for t in texts)
        prompt, results = run_episode(env, task, texts)
        assert results[-1].outcome == "success", (task, [r.observation for r in results])
        assert results[0].tool_call is not None and results[0].tool_call.ok
        assert len(prompt) < 120
    assert len(seen) >= 5


def test_python_heldout_disjoint_and_difficulty_is_tier() -> None:
    src = make_task_source(cfg("python", 1, 3))
    held = src.heldout()
    keys = {src.content_key(t) for t in held}  # type: ignore[attr-defined]
    rng = random.Random(9)
    train = [src.sample(rng, d) for d in (1, 2, 3) for _ in range(600)]
    assert not keys & {src.content_key(t) for t in train}  # type: ignore[attr-defined]
    from asyncrl.envs.python_env import TEMPLATES

    tier = {t.name: t.tier for t in TEMPLATES}
    assert all(tier[t.task_type] == t.difficulty for t in train + held)


def test_python_demonstrate_corruption_rate() -> None:
    src = make_task_source(cfg("python", 1, 3))
    rng = random.Random(10)
    n, rate = 2000, 0.3
    corrupted = sum(
        PythonEnv.demonstrate(t, rng, rate) != PythonEnv.solve(t) for t in (src.sample(rng) for _ in range(n))
    )
    assert abs(corrupted / n - rate) < 0.04


def test_python_tool_errors_are_observations() -> None:
    env = PythonEnv(SandboxConfig(wall_seconds=3.0, cpu_seconds=1))
    task = make_task_source(cfg("python", 1, 1)).sample(random.Random(0))
    _, results = run_episode(env, task, ["<tool>python(1/0)</tool>", "<tool>python(x = 1)</tool>"])
    assert results[0].observation == "error: ZeroDivisionError: division by zero"
    assert results[0].process_reward < 0 and results[0].tool_call is not None and not results[0].tool_call.ok
    assert results[1].observation == "(no output; use print)"


def test_python_sandbox_limits_come_from_the_config() -> None:
    from asyncrl.config import load_config
    from asyncrl.envs import make_raw_env

    env = make_raw_env(load_config(None, ["env.kind=python"]).env)
    assert env.limits == SandboxConfig()  # the defaults are env.sandbox's
    cfg = load_config(
        None, ["env.kind=python", "env.sandbox.wall_seconds=2.5", "env.sandbox.max_code_chars=10"]
    )
    env = make_raw_env(cfg.env)
    assert env.limits.wall_seconds == 2.5
    ok, obs = asyncio.run(env.run_tool("python", "print(1 + 2 + 3 + 4)"))  # refused before any process
    assert not ok and obs == "code longer than 10 chars"


def test_python_env_options_point_to_env_sandbox() -> None:
    from asyncrl.config import load_config
    from asyncrl.envs import make_raw_env
    from asyncrl.envs.registry import EnvPluginError

    with pytest.raises(EnvPluginError, match=r"env\.sandbox\.wall_seconds"):
        make_raw_env(load_config(None, ["env.kind=python", "env.options={wall_seconds: 3}"]).env)
