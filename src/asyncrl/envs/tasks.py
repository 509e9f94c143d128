"""Task sources more than one environment kind uses (a kind's own source stays in its module).

* :class:`SeedTasks`: an episode is ``reset(seed=s)`` of a game, held out by a hash of (game, seed)
  (``gem``, ``openenv``);
* :class:`RowTasks`: the rows of a file, one task per row (``dataset``, ``class``), with
  :func:`read_rows`;
* :func:`cached_source`: a source built once per process and configuration.
"""

from __future__ import annotations

import csv
import functools
import json
import random
from abc import abstractmethod
from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

import msgspec

from asyncrl.envs.base import HashSplitTaskSource
from asyncrl.envs.base import task_id as make_task_id
from asyncrl.errors import UserError
from asyncrl.records import Task

if TYPE_CHECKING:
    from pydantic import BaseModel

    from asyncrl.config import ClassEnvConfig, DatasetConfig, EnvConfig

__all__ = ["RowTasks", "SeedTasks", "cached_source", "read_rows"]

S = TypeVar("S")


class SeedTasks(HashSplitTaskSource):
    """Tasks ``{game, seed}`` for seeds ``0 .. seeds-1``; held out by a hash of (game, seed)."""

    difficulties = (0,)
    widen_hint = "raise the section's seeds"

    def __init__(self, game: str, seeds: int, *, seed: int, heldout_size: int, prefix: str) -> None:
        self.game, self.seeds, self.prefix = game, seeds, prefix
        self.task_types = (game,)
        self.salt = f"{prefix}-{seed}"
        super().__init__(seed=seed, heldout_size=heldout_size)

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        task = Task(
            id="",
            task_type=self.game,
            difficulty=0,
            payload={"game": self.game, "seed": rng.randrange(self.seeds)},
        )
        return msgspec.structs.replace(task, id=make_task_id(self.prefix, self.content_key(task)))

    def content_key(self, task: Task) -> str:
        return f"{task.payload['game']}|{task.payload['seed']}"


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


def cached_source(source: type[S], section: BaseModel, cfg: EnvConfig) -> S:
    """``source(section, seed=, heldout_size=, lo=, hi=)``, built once per process and configuration
    (one generation or read of the rows, one hygiene check of the scorer)."""
    # classes are hashable; typeshed's lru_cache says Hashable, which type[S] is not to mypy
    key = (cast("Hashable", source), cast("Hashable", type(section)), section.model_dump_json())
    return cast("S", _cached(*key, cfg.seed, cfg.heldout_size, cfg.min_difficulty, cfg.max_difficulty))


@functools.lru_cache(maxsize=8)
def _cached(
    source: type[Any], model: Any, section_json: str, seed: int, heldout_size: int, lo: int, hi: int
) -> Any:
    section = model.model_validate_json(section_json)
    return source(section, seed=seed, heldout_size=heldout_size, lo=lo, hi=hi)
