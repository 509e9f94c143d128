"""The answer environments (``reasoning_gym``, ``dataset``): recipes, splits, scorers and their
hygiene, row readers, ``env check``'s difficulties, and the tool call the guard records for an
environment that reports none (docs/environments.md)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from asyncrl.config import EnvConfig, load_config
from asyncrl.envs import (
    EnvPluginError,
    HashSplitTaskSource,
    StepResult,
    Tool,
    check_environment,
    load_scorer,
    make_env,
    make_raw_env,
    make_task_source,
    read_rows,
)
from asyncrl.envs import reasoning_gym_env as rge
from asyncrl.envs.scoring import exact_score, math_score, numeric_score
from asyncrl.envs.wrappers import GUARD_STATS
from asyncrl.errors import UserError
from asyncrl.records import Task
from helpers import run_texts_sync


def rg_env(*sets: str, extra: tuple[str, ...] = ()) -> EnvConfig:
    return load_config(
        None,
        [
            "env.kind=reasoning_gym",
            f"env.reasoning_gym.datasets=[{', '.join(sets)}]",
            "env.heldout_size=8",
            *extra,
        ],
    ).env


ARITH = "{name: basic_arithmetic, config: {operators: ['+']}}"
"""At difficulty 0 (its curriculum's first level): sums of a few one-digit numbers."""


def ds_env(path: Path, *extra: str) -> EnvConfig:
    return load_config(
        None, ["env.kind=dataset", f"env.dataset.path={path}", "env.heldout_size=2", *extra]
    ).env


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


SUMS = [{"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(80)]


# -- user scorers (module:function) --------------------------------------------------------------
def credits_everything(answer: str, gold: str) -> float:
    return 1.0


def raises_on_words(answer: str, gold: str) -> float:
    return 1.0 if int(answer) == int(gold) else 0.0  # int("abc") raises


def last_digit(answer: str, gold: str) -> float:
    return 1.0 if answer.strip()[-1:] == gold[-1:] and answer.strip() == gold else 0.0


# ---------------------------------------------------------------------------------------------
# reasoning_gym
# ---------------------------------------------------------------------------------------------
def test_a_task_is_a_recipe_and_the_entry_is_regenerated_where_it_is_used() -> None:
    cfg = rg_env(ARITH)
    source = make_task_source(cfg)
    task = source.sample(random.Random(0))
    assert set(task.payload) == {"dataset", "config", "level", "curriculum", "seed", "index"}
    question = rge.entry(task)["question"]
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(task), type=Task)  # as the queue carries it
    rge._entry.cache_clear()
    rge.dataset.cache_clear()  # a worker that never saw the entry
    env = make_raw_env(cfg)
    [res] = run_texts_sync(env, wire, [f"<answer>{rge.entry(wire)['answer']}</answer>"])
    assert asyncio.run(env.reset(wire)) == question and res.outcome == "success" and res.reward == 1.0


def test_arc_entries_keep_their_score_because_they_are_never_shipped() -> None:
    """arc_agi's entries lose their score after a JSON round trip; the recipe does not."""
    cfg = rg_env("{name: arc_agi}", extra=("env.heldout_size=2",))
    task = msgspec.json.decode(msgspec.json.encode(make_task_source(cfg).sample(random.Random(1))), type=Task)
    gold = rge.entry(task)["answer"]
    [res] = run_texts_sync(make_raw_env(cfg), task, [f"<answer>{gold}</answer>"])
    assert res.outcome == "success"


def test_difficulties_are_the_curriculum_levels_and_check_uses_them() -> None:
    cfg = rg_env("{name: basic_arithmetic}", extra=("env.max_difficulty=100",))
    source = make_task_source(cfg)
    assert source.difficulties == (0, 1, 2, 3, 4)  # num_terms has 5 levels, num_digits 4
    terms = [
        rge.entry(source.sample(random.Random(i), d))["question"].count(" ")
        for d in (0, 4)
        for i in range(20)
    ]
    assert max(terms[:20]) < min(terms[20:])  # level 4 has more terms than level 0
    report = check_environment(cfg, episodes=2)
    assert report.ok, report.render()
    assert "difficulties" in report.render()


def test_heldout_split_is_disjoint_by_content() -> None:
    """100 distinct questions (one-digit sums) over 500 indices: each comes back under other indices,
    so only a split by content keeps every held-out question out of training."""
    small = "{name: basic_arithmetic, config: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, operators: ['+'], allow_negation: false, allow_parentheses: false}}"
    source = make_task_source(rg_env(small, extra=("env.reasoning_gym.curriculum=false",)))
    held = {rge.entry(t)["question"] for t in source.heldout()}
    rng = random.Random(0)
    trained = {rge.entry(source.sample(rng))["question"] for _ in range(1000)}
    assert len(held) == 8 and not held & trained and len(trained) > 50


def test_a_scorer_that_credits_a_wrong_answer_is_refused_when_built() -> None:
    """game_of_life_halting scores any non-empty answer 1.0."""
    with pytest.raises(EnvPluginError, match="full credit to the wrong answer"):
        make_task_source(rg_env("{name: game_of_life_halting}"))


def test_a_scorer_that_raises_is_a_counted_failure() -> None:
    """prime_factorization's scorer raises on a non-numeric answer."""
    cfg = rg_env("{name: prime_factorization}")
    task = make_task_source(cfg).sample(random.Random(0))
    before = GUARD_STATS.scorer_errors
    [res] = run_texts_sync(make_raw_env(cfg), task, ["<answer>many</answer>"])
    assert res.outcome == "failure" and res.reward == 0.0 and GUARD_STATS.scorer_errors == before + 1


def test_weights_mix_datasets_and_reward_can_be_the_score() -> None:
    cfg = rg_env(ARITH + ", {name: chain_sum, weight: 3}", extra=("env.reasoning_gym.reward=score",))
    rng = random.Random(0)
    kinds = [make_task_source(cfg).sample(rng, 0).task_type for _ in range(200)]
    assert 0.65 < kinds.count("chain_sum") / 200 < 0.85
    task = next(
        t
        for t in (make_task_source(cfg).sample(rng, 0) for _ in range(50))
        if t.task_type == "basic_arithmetic"
    )
    gold = rge.entry(task)["answer"]
    [res] = run_texts_sync(make_raw_env(cfg), task, [f"<answer>{gold} {gold}</answer>"])  # partial credit
    assert res.outcome == "failure" and 0 < res.reward < 1


def test_tools_are_opt_in_and_pay_the_process_rewards() -> None:
    assert make_raw_env(rg_env(ARITH)).tools == []
    cfg = rg_env(ARITH, extra=("env.reasoning_gym.tools=[calc]",))
    task = make_task_source(cfg).sample(random.Random(0))
    gold = rge.entry(task)["answer"]
    expr = rge.entry(task)["question"].removeprefix("Calculate ").rstrip(".")
    res = run_texts_sync(make_raw_env(cfg), task, [f"<tool>calc({expr})</tool>", f"<answer>{gold}</answer>"])
    assert res[0].tool_call is not None and res[0].tool_call.result == gold and res[0].process_reward > 0
    assert res[1].outcome == "success" and res[1].process_reward > 0  # the answer uses the result


def test_warm_start_demonstrations_are_the_gold_answer_with_corruptions() -> None:
    cfg = rg_env(ARITH)
    task = make_task_source(cfg).sample(random.Random(0))
    env = make_raw_env(cfg)
    rng = random.Random(0)
    demos = [env.demonstrate(task, rng, 0.5)[0] for _ in range(40)]
    gold = f"<answer>{rge.entry(task)['answer']}</answer>"
    assert 10 < demos.count(gold) < 30 and env.solve(task) == [gold]


def test_unknown_dataset_is_a_clear_error() -> None:
    with pytest.raises(EnvPluginError, match="no dataset 'basic_arithmetik'"):
        make_task_source(rg_env("{name: basic_arithmetik}"))


def test_too_few_heldout_tasks_says_to_raise_the_dataset_size() -> None:
    small = "{name: basic_arithmetic, config: {size: 10}}"  # ~1 of 10 entries is held out
    with pytest.raises(ValueError, match=r"could only find \d+ distinct held-out tasks.*config: \{size: N\}"):
        make_task_source(rg_env(small, extra=("env.heldout_size=4",))).heldout()
    assert (
        len(make_task_source(rg_env(small.replace("10", "400"), extra=("env.heldout_size=4",))).heldout())
        == 4
    )


# ---------------------------------------------------------------------------------------------
# dataset
# ---------------------------------------------------------------------------------------------
def test_rows_from_jsonl_and_csv_train_the_same_tasks(tmp_path: Path) -> None:
    jsonl = write_jsonl(tmp_path / "rows.jsonl", SUMS)
    csv_path = tmp_path / "rows.csv"
    csv_path.write_text("question,answer\n" + "".join(f'"{r["question"]}",{r["answer"]}\n' for r in SUMS))
    assert read_rows(str(jsonl)) == read_rows(str(csv_path)) == SUMS
    a, b = make_task_source(ds_env(jsonl)), make_task_source(ds_env(csv_path))
    assert [t.payload for t in a.heldout()] == [t.payload for t in b.heldout()]
    (tmp_path / "bad.jsonl").write_text('{"question": "q", "answer": "a"}\nnot json\n')
    with pytest.raises(UserError, match="line 2: not JSON"):
        read_rows(str(tmp_path / "bad.jsonl"))


def test_parquet_and_saved_datasets_need_their_extra_or_are_read(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    if importlib.util.find_spec("pyarrow") is None:
        path.write_bytes(b"PAR1")
        with pytest.raises(UserError, match=r"asyncrl\[datasets\]"):
            read_rows(str(path))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(SUMS), path)
        assert read_rows(str(path)) == SUMS
    if importlib.util.find_spec("datasets") is None:
        with pytest.raises(UserError, match=r"asyncrl\[datasets\]"):
            read_rows(str(tmp_path))


def test_split_column_is_disjoint_by_content_and_system_prompts_lead(tmp_path: Path) -> None:
    rows = [{**r, "split": "test" if i < 5 else "train", "sys": f"Be brief {i}."} for i, r in enumerate(SUMS)]
    rows.append(
        {"question": "what IS 0 + 1?", "answer": "1", "split": "train", "sys": "x"}
    )  # a test prompt again
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    cfg = ds_env(path, "env.dataset.split_field=split", "env.dataset.system_field=sys", "env.heldout_size=5")
    source = make_task_source(cfg)
    held = source.heldout()
    assert [t.payload["row"] for t in held] == [0, 1, 2, 3, 4]
    rng = random.Random(0)
    trained = {source.sample(rng).payload["row"] for _ in range(500)}
    assert trained and min(trained) >= 5 and len(rows) - 1 not in trained  # the repeated prompt was dropped
    prompt = asyncio.run(make_raw_env(cfg).reset(held[0]))
    assert prompt == "Be brief 0.\n\nWhat is 0 + 1?"


def test_hash_split_is_disjoint_by_content(tmp_path: Path) -> None:
    source = make_task_source(ds_env(write_jsonl(tmp_path / "rows.jsonl", SUMS), "env.heldout_size=3"))
    rng = random.Random(0)
    trained = {source.sample(rng).payload["prompt"] for _ in range(500)}
    assert not trained & {t.payload["prompt"] for t in source.heldout()} and len(trained) > 50


def test_builtin_scorers() -> None:
    assert exact_score(" Paris ", "paris") == 1.0 and exact_score("Paris.", "paris") == 0.0
    assert numeric_score("1,000.0004", "1000", 1e-6) == 1.0 and numeric_score("1001", "1000", 1e-6) == 0.0
    assert numeric_score("abc", "1", 0.5) == 0.0
    assert load_scorer("numeric", tolerance=0.5)("1.4", "1") == 1.0
    assert math_score("0.5", "1/2") == 1.0 and math_score("\\frac{1}{2}", "0.5") == 1.0
    assert (
        math_score("\\sqrt{4}", "2") == math_score("x(x+1)", "x^2+x") == 1.0
        and math_score("1/3", "0.5") == 0.0
    )
    with pytest.raises(UserError, match=r"package\.module:function"):
        load_scorer("fuzzy", tolerance=0)


def test_a_module_function_scorer_grades_and_a_lenient_one_is_refused(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", SUMS)
    cfg = ds_env(path, f"env.dataset.scorer={__name__}:last_digit")
    task = make_task_source(cfg).heldout()[0]
    [good] = run_texts_sync(make_raw_env(cfg), task, [f"<answer>{task.payload['answer']}</answer>"])
    [bad] = run_texts_sync(make_raw_env(cfg), task, ["<answer>99</answer>"])
    assert (good.outcome, bad.outcome) == ("success", "failure")
    with pytest.raises(EnvPluginError, match="full credit to the wrong answer"):
        make_task_source(ds_env(path, f"env.dataset.scorer={__name__}:credits_everything"))


def test_a_raising_user_scorer_is_a_counted_failure(tmp_path: Path) -> None:
    cfg = ds_env(write_jsonl(tmp_path / "rows.jsonl", SUMS), f"env.dataset.scorer={__name__}:raises_on_words")
    task = make_task_source(cfg).heldout()[0]
    before = GUARD_STATS.scorer_errors
    [res] = run_texts_sync(make_raw_env(cfg), task, ["<answer>eleven</answer>"])
    assert res.outcome == "failure" and GUARD_STATS.scorer_errors == before + 1


def test_missing_fields_and_config_mistakes_are_clear(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", [{"q": "a", "answer": "b"}])
    with pytest.raises(EnvPluginError, match="row 0 has no field 'question'"):
        make_task_source(ds_env(path))
    with pytest.raises(ValueError, match=r"needs the env\.dataset section"):
        EnvConfig(kind="dataset")


# ---------------------------------------------------------------------------------------------
# env check's difficulties, and the tool call the guard records (item 7)
# ---------------------------------------------------------------------------------------------
class OneLevelTasks(HashSplitTaskSource):
    task_types = ("word",)
    difficulties = (7,)

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        word = "".join(rng.choice("abcdefgh") for _ in range(4))
        return Task(id=f"w-{word}", task_type="word", difficulty=7, payload={"word": word})

    def content_key(self, task: Task) -> str:
        return str(task.payload["word"])


class SilentToolEnv:
    """A plugin with one level (7) whose tool steps carry no ``tool_call``."""

    def __init__(self) -> None:
        self.tools = [Tool("shout", "upper-case text", {"type": "string", "example": "hi"})]
        self.word = ""

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> OneLevelTasks:
        return OneLevelTasks.from_config(cfg)  # type: ignore[return-value]

    async def reset(self, task: Task) -> str:
        self.word = str(task.payload["word"])
        return f"Say {self.word}"

    async def step(self, text: str) -> StepResult:
        if text.startswith("<tool>shout("):
            arg = text[len("<tool>shout(") : -len(")</tool>")]
            return StepResult(observation="error: empty" if not arg else arg.upper())
        ok = text == f"<answer>{self.word}</answer>"
        return StepResult(observation="", done=True, reward=float(ok), outcome="success" if ok else "failure")


def test_env_check_of_a_plugin_path_uses_its_own_difficulties() -> None:
    report = check_environment(f"{__name__}:SilentToolEnv", episodes=1)
    assert report.ok, report.render()
    assert "difficulties [7]" in report.render()


def test_the_guard_records_the_tool_call_an_environment_left_out_and_check_says_so() -> None:
    cfg = EnvConfig(kind="plugin", path=f"{__name__}:SilentToolEnv", min_difficulty=7, max_difficulty=7)
    env, task = make_env(cfg, 0), make_task_source(cfg).sample(random.Random(0))
    before = GUARD_STATS.tool_calls_recorded
    ok, failed, answer = run_texts_sync(
        env, task, ["<tool>shout(hi)</tool>", "<tool>shout()</tool>", "<answer>x</answer>"]
    )
    assert ok.tool_call is not None and (ok.tool_call.name, ok.tool_call.ok, ok.tool_call.result) == (
        "shout",
        True,
        "HI",
    )
    assert (
        failed.tool_call is not None and not failed.tool_call.ok and failed.tool_call.error == "error: empty"
    )
    assert answer.tool_call is None and GUARD_STATS.tool_calls_recorded == before + 2
    render = check_environment(cfg, episodes=1).render()
    assert "WARN  tool call" in render and "returned no StepResult.tool_call" in render
