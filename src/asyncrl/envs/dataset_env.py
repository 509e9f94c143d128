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

import csv
import json
import random
from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from asyncrl.envs.answer_env import AnswerEnv, cached_source
from asyncrl.envs.base import HashSplitTaskSource, normalize, task_id
from asyncrl.envs.demos import final_answer, solution_turn
from asyncrl.envs.scoring import Scorer, load_scorer, refuse_lenient_scorer, safe_score
from asyncrl.envs.toolenv import env_section
from asyncrl.errors import UserError
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.config import ClassEnvConfig, DatasetConfig, EnvConfig

__all__ = ["DatasetEnv", "DatasetTasks", "RowTasks", "read_rows"]

EXTRA = "pip install 'asyncrl[datasets]'"


def read_rows(path: str, field: str = "env.dataset.path") -> list[dict[str, Any]]:
    """The rows of a JSONL, CSV or Parquet file or a saved ``datasets`` directory; a
    :class:`UserError` naming the config ``field``, the file (and line) for anything unreadable."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{field} {path!r} does not exist")
    if p.is_dir():
        return _saved_dataset(p, field)
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return _jsonl(p, field)
    if suffix == ".csv":
        with p.open(newline="", encoding="utf-8") as f:
            return [dict(row) for row in csv.DictReader(f)]
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UserError(f"{field} {path!r}: reading Parquet needs pyarrow: {EXTRA}") from None
        return pq.read_table(p).to_pylist()  # type: ignore[no-any-return]
    raise UserError(
        f"{field} {path!r}: use a .jsonl, .csv or .parquet file or a datasets save_to_disk directory"
    )


def _jsonl(p: Path, field: str) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{field} {str(p)!r}, line {n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise UserError(f"{field} {str(p)!r}, line {n}: a {type(row).__name__}, not an object")
        rows.append(row)
    return rows


def _saved_dataset(p: Path, field: str) -> list[dict[str, Any]]:
    """A ``save_to_disk`` directory; a ``DatasetDict``'s split names become the ``split`` column."""
    try:
        import datasets
    except ImportError:
        raise UserError(f"{field} {str(p)!r}: a saved dataset directory needs datasets: {EXTRA}") from None
    loaded = datasets.load_from_disk(str(p))
    if isinstance(loaded, datasets.DatasetDict):
        return [{**row, "split": name} for name, part in loaded.items() for row in part]
    return [dict(row) for row in loaded]


class RowTasks(HashSplitTaskSource):
    """The rows of a file as tasks (one per row), with the held-out split of the module docstring.

    Subclasses make a row's task (:meth:`row_task`) and say which rows are the same problem
    (:meth:`content_key`); ``env.kind: dataset`` and ``env.kind: class`` share this."""

    path_field: ClassVar[str] = "env.dataset.path"
    """The config field naming the file, for messages."""

    def __init__(
        self,
        path: str,
        section: DatasetConfig | ClassEnvConfig,
        *,
        seed: int,
        heldout_size: int,
        lo: int,
        hi: int,
    ) -> None:
        """The rows of ``path``; ``section`` names the split column and its held-out value."""
        self.path = path
        tasks = [(self.row_task(i, row), row) for i, row in enumerate(read_rows(path, self.path_field))]
        if not tasks:
            raise UserError(f"{self.path_field} {path!r} has no rows")
        self.split = section.split_field
        held_value = section.heldout_value
        self.held = {t.id for t, row in tasks if self.split and str(row.get(self.split)) == held_value}
        self.difficulties = tuple(sorted({t.difficulty for t, _ in tasks}))
        super().__init__(seed=seed, heldout_size=heldout_size, min_difficulty=lo, max_difficulty=hi)
        held = [t for t, _ in tasks if self.is_heldout(t) and t.difficulty in self.active_difficulties]
        held_keys = {self.content_key(t) for t in held}
        self.train = [t for t, _ in tasks if not self.is_heldout(t) and self.content_key(t) not in held_keys]
        self.dropped = len(tasks) - len(self.train) - sum(self.is_heldout(t) for t, _ in tasks)
        self._held_rows = list({self.content_key(t): t for t in held}.values())

    @abstractmethod
    def row_task(self, i: int, row: dict[str, Any]) -> Task:
        """The task of row ``i`` (numbered from 0); a :class:`UserError` naming a missing field."""

    def checked_difficulty(
        self, i: int, row: dict[str, Any], fields: tuple[str | None, ...], field: str | None
    ) -> int:
        """Row ``i``'s difficulty, its column ``field`` read as an integer (0 without one), once the row has
        every one of ``fields``; a :class:`UserError` naming a missing field or a difficulty that is not an integer."""
        where = f"{self.path_field} {self.path!r}: row {i}"
        for name in fields:
            if name is not None and row.get(name) is None:
                raise UserError(f"{where} has no field {name!r} (it has {sorted(row)})")
        try:
            return int(row[field]) if field else 0
        except (TypeError, ValueError):
            raise UserError(f"{where}: {field!r} is not an integer") from None

    def json_row(self, i: int, row: dict[str, Any]) -> str:
        """Row ``i`` as JSON text (keys sorted); a :class:`UserError` when it cannot travel as JSON."""
        try:
            return msgspec.json.encode(row, order="sorted").decode()
        except (TypeError, msgspec.EncodeError) as exc:
            raise UserError(
                f"{self.path_field} {self.path!r}: row {i} cannot travel as JSON: {exc}"
            ) from None

    def is_heldout(self, task: Task) -> bool:
        return task.id in self.held if self.split else super().is_heldout(task)

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        rows = [t for t in self.train if t.difficulty == difficulty]
        if not rows:
            raise ValueError(f"{self.path_field}: no training rows of difficulty {difficulty}")
        return rng.choice(rows)

    def heldout(self) -> list[Task]:
        """The first ``heldout_size`` held-out rows (file order, distinct content)."""
        if len(self._held_rows) < self.heldout_size:
            raise ValueError(
                f"the file has {len(self._held_rows)} distinct held-out rows (in the difficulty range); "
                f"lower env.heldout_size (now {self.heldout_size}) or add rows"
            )
        return self._held_rows[: self.heldout_size]


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
        return cached_source(DatasetTasks, env_section(cfg, cfg.dataset), cfg)  # type: ignore[no-any-return]

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
