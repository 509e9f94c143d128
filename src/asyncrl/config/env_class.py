"""``env.class_env``: a TRL-style environment class (``env.kind: class``, :mod:`asyncrl.envs.class_env`)."""

from __future__ import annotations

from pydantic import Field, model_validator

from asyncrl.config.base import Section


class ClassEnvConfig(Section):
    """``env.kind: class``: a class written for TRL's ``environment_factory``, unchanged
    (docs/environments.md#class). Its tasks are the rows of a file, read and split as ``env.kind:
    dataset`` reads them; ``reset(**row)`` starts an episode."""

    factory: str = Field(min_length=3)
    """The class (or any zero-argument callable returning an instance): ``package.module:Class`` or
    ``path/to/file.py:Class`` (relative to the working directory). ``env.options`` are passed to it."""
    reward: str | None = None
    """A TRL reward function ``reward_func(environments, **kwargs) -> list[float]`` as
    ``package.module:function`` or ``file.py:function``. Unset: the class's own ``get_reward()``; with
    both, their sum (TRL's rule). One of them is required."""
    rows: str = Field(min_length=1)
    """The task rows: a ``.jsonl``, ``.csv`` or ``.parquet`` file or a ``datasets`` ``save_to_disk``
    directory (as ``env.dataset.path``). Each row is passed to ``reset(**row)``."""
    prompt_field: str | None = "prompt"
    """Column holding the prompt (a string, or a list of chat messages whose last user message is
    the prompt). Unset: the prompt is what ``reset`` returns."""
    system_field: str | None = None
    """Column holding a per-row system prompt (placed before the prompt), if any."""
    difficulty_field: str | None = None
    """Integer column holding each row's difficulty (unset: every row is difficulty 0)."""
    split_field: str | None = None
    """Column naming each row's split; rows whose value is ``heldout_value`` are held out. Unset: the
    held-out split is chosen by a hash of the whole row (disjoint by content)."""
    heldout_value: str = "test"
    """The ``split_field`` value of held-out rows."""
    demo_field: str | None = None
    """Column holding each row's demonstration for the warm start: a gold final answer (a string),
    or the model turns in asyncrl's text protocol (a list of strings, tool calls included). Unset
    (and no ``demonstrator``): the run must not warm-start (``trainer.sft.steps: 0``)."""
    demonstrator: str | None = None
    """The warm start's demonstrations from your code (instead of ``demo_field``):
    ``package.module:function`` or ``path/to/file.py:function``, called as ``function(row, rng) ->
    list[str]`` with the task's row (every column) and a ``random.Random``; it returns the model
    turns in asyncrl's text protocol, tool calls included, as a ``demo_field`` list holds them."""
    success_reward: float = Field(1.0, ge=-1e9, le=1e9)
    """An episode whose reward is at least this is a success."""

    @model_validator(mode="after")
    def _one_demonstration(self) -> ClassEnvConfig:
        if self.demo_field and self.demonstrator:
            raise ValueError(
                "env.class_env: set demo_field or demonstrator, not both (both make the warm start's "
                "demonstrations)"
            )
        return self
