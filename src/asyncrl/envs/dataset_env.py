"""``dataset``: question/answer rows from a file, scored by a built-in or a user scorer.

Rows come from a ``.jsonl``, ``.csv`` or ``.parquet`` file, or a directory written by the
``datasets`` library's ``save_to_disk`` (never the hub). ``env.dataset`` names the prompt,
answer and optional system-prompt, difficulty, split and worked-solution columns. A task carries its
row's texts (``payload = {row, prompt, answer[, system][, solution][, example]}``: ``example``, the
whole row, only for a ``demonstrator``). An answer ending with GSM8K's line ``#### N`` is ``N``;
demonstrations from a solution column or a demonstrator: :mod:`asyncrl.envs.demos`.

Held-out split: rows whose ``split_field`` is ``heldout_value``, or -- without a split column --
rows whose prompt hashes into the held-out bucket (:class:`~asyncrl.envs.base.HashSplitTaskSource`).
Either way it is disjoint from training by content: a training row whose prompt (ignoring case
and whitespace) is also a held-out prompt is dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from asyncrl.envs.answer_env import AnswerEnv
from asyncrl.envs.base import normalize, task_id
from asyncrl.envs.demos import final_answer, solution_turn
from asyncrl.envs.scoring import Scorer, load_scorer, refuse_lenient_scorer, safe_score
from asyncrl.envs.tasks import RowTasks, cached_source
from asyncrl.envs.toolenv import env_section
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.config import DatasetConfig, EnvConfig

__all__ = ["DatasetEnv", "DatasetTasks"]


class DatasetTasks(RowTasks):
    """The rows of a file as tasks; ``task_type`` ``dataset``, difficulty from ``difficulty_field``."""

    task_types = ("dataset",)
    salt = "dataset"

    def __init__(self, dc: DatasetConfig, **kwargs: int) -> None:
        self.dc = dc
        super().__init__(dc.path, dc, **kwargs)
        self.scorer = load_scorer(dc.scorer, tolerance=dc.tolerance)
        sample = self.train[: dc.hygiene_tasks]
        refuse_lenient_scorer(
            f"env.dataset.scorer {dc.scorer!r}",
            lambda answer, k: self.scorer(answer, str(sample[k].payload["answer"])),
            [str(t.payload["answer"]) for t in sample],
        )

    def row_task(self, i: int, row: dict[str, Any]) -> Task:
        dc = self.dc
        fields = (dc.prompt_field, dc.answer_field, dc.system_field, dc.difficulty_field, dc.split_field)
        difficulty = self.checked_difficulty(i, row, (*fields, dc.solution_field), dc.difficulty_field)
        answer = final_answer(str(row[dc.answer_field]))
        payload: dict[str, Any] = {"row": i, "prompt": str(row[dc.prompt_field]), "answer": answer}
        if dc.system_field:
            payload["system"] = str(row[dc.system_field])
        if dc.solution_field:
            payload["solution"] = str(row[dc.solution_field])
        if dc.demonstrator:
            payload["example"] = msgspec.json.decode(self.json_row(i, row))
        key = f"{payload['prompt']}\x00{payload['answer']}\x00{payload.get('system', '')}"
        return Task(id=task_id("ds", key), task_type="dataset", difficulty=difficulty, payload=payload)

    def content_key(self, task: Task) -> str:
        return normalize(str(task.payload["prompt"]))


class DatasetEnv(AnswerEnv):
    """Answer a row's prompt; scored by ``env.dataset.scorer`` against the row's answer."""

    kind = "dataset"

    def __init__(self, dc: DatasetConfig, cfg: EnvConfig) -> None:
        super().__init__(dc.tools, dc.reward, cfg.sandbox, dc.demonstrator)
        self.scorer: Scorer = load_scorer(dc.scorer, tolerance=dc.tolerance)

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> DatasetTasks:
        return cached_source(DatasetTasks, env_section(cfg, cfg.dataset), cfg)

    @classmethod
    def from_config(cls, cfg: EnvConfig) -> DatasetEnv:
        return cls(env_section(cfg, cfg.dataset), cfg)

    @staticmethod
    def gold(task: Task) -> str:
        return str(task.payload["answer"])

    def example(self, task: Task) -> dict[str, Any]:
        return dict(task.payload["example"])

    def answer_turn(self, task: Task, answer: str) -> str:
        solution = task.payload.get("solution")
        return (
            solution_turn(str(solution), answer)
            if solution is not None
            else super().answer_turn(task, answer)
        )

    def prompt(self, task: Task) -> str:
        system = task.payload.get("system")
        return f"{system}\n\n{task.payload['prompt']}" if system else str(task.payload["prompt"])

    def score(self, answer: str) -> float:
        assert self.task is not None
        gold = str(self.task.payload["answer"])
        return safe_score(lambda: self.scorer(answer, gold))
