"""``env``: the environment, its task source, simulated latency, faults, guard and sandbox (:mod:`asyncrl.envs`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Discriminator, Field, Tag, model_validator

from asyncrl.config.base import Section, kind_of
from asyncrl.config.ecosystem import ECOSYSTEM_KINDS, GemConfig, OpenEnvConfig, VerifiersConfig
from asyncrl.config.env_class import ClassEnvConfig


class _LatencyBase(Section):
    """Simulated tool latency added to every environment step."""

    kind: str = "none"
    """Distribution of the added delay: ``none``, ``constant``, ``lognormal`` or ``pareto``."""


class NoLatencyConfig(_LatencyBase):
    """No simulated latency."""

    kind: Literal["none"] = "none"


class _DelayBase(_LatencyBase):
    seconds: float = Field(0.0, ge=0, le=600)
    """Constant delay, or the median (lognormal) / scale x_m (pareto) of the delay."""
    max_seconds: float = Field(60.0, gt=0, le=3600)
    """Cap on any single delay."""


class ConstantLatencyConfig(_DelayBase):
    """The same delay before every step."""

    kind: Literal["constant"] = "constant"


class LognormalLatencyConfig(_DelayBase):
    """Lognormal delays (median ``seconds``, shape ``sigma``)."""

    kind: Literal["lognormal"] = "lognormal"
    sigma: float = Field(1.0, gt=0, le=10)
    """Lognormal shape (std of the log-delay)."""


class ParetoLatencyConfig(_DelayBase):
    """Pareto delays (scale ``seconds``, tail index ``alpha``)."""

    kind: Literal["pareto"] = "pareto"
    alpha: float = Field(1.5, gt=0.1, le=100)
    """Pareto tail index; smaller means heavier tail (1 < alpha < 2: infinite variance)."""


LatencyConfig: TypeAlias = Annotated[
    Annotated[NoLatencyConfig, Tag("none")]
    | Annotated[ConstantLatencyConfig, Tag("constant")]
    | Annotated[LognormalLatencyConfig, Tag("lognormal")]
    | Annotated[ParetoLatencyConfig, Tag("pareto")],
    Discriminator(kind_of("none")),
]
"""``env.latency``: one model per ``kind``."""


class FaultConfig(Section):
    """Injected environment faults, for testing robustness."""

    exception_rate: float = Field(0.0, ge=0, le=1)
    """Probability that a step raises an exception."""
    hang_rate: float = Field(0.0, ge=0, le=1)
    """Probability that a step hangs (until the guard's timeout)."""
    malformed_rate: float = Field(0.0, ge=0, le=1)
    """Probability that a step returns a malformed observation."""
    task_types: list[str] = Field(default_factory=list)
    """Inject faults only into episodes of these task types or ``type:difficulty`` buckets (empty: all)."""
    active_from: float = Field(0.0, ge=0)
    """Unix time before which no fault is injected (0: from the start)."""
    active_until: float = Field(0.0, ge=0)
    """Unix time from which no fault is injected (0: never stops)."""
    switch_file: str | None = None
    """Inject faults only while this file exists (a chaos switch for tests and drills)."""


class GuardConfig(Section):
    """Isolation of environment faults: timeouts, retries and the fallback observation."""

    step_timeout_s: float = Field(10.0, gt=0, le=3600)
    """Wall-clock limit of one environment call."""
    retries: int = Field(1, ge=0, le=10)
    """Extra attempts after a failed call."""
    fault_reward: float = Field(-0.1, ge=-10, le=0)
    """Process reward given to a turn whose environment call failed on every attempt."""
    fault_observation: str = "[tool error]"
    """Observation text returned after the last failed attempt."""
    max_observation_chars: int = Field(8192, ge=1, le=100_000_000)
    """An observation (or reset prompt) longer than this is a ``malformed`` attempt (retried, then the
    fault observation): it bounds what one tool result can add to the context."""


class SandboxConfig(Section):
    """Sandbox limits of the ``python`` environment, each enforced per run of model-written code.

    See docs/environments.md#the-python-sandbox; ``asyncrl.envs.SandboxLimits`` is this model."""

    cpu_seconds: int = Field(2, ge=1, le=3600)
    """CPU time (RLIMIT_CPU); the process gets SIGXCPU, one second later SIGKILL."""
    wall_seconds: float = Field(5.0, gt=0, le=3600)
    """Wall-clock limit enforced by the host (kills the run's processes). Keep it below
    ``env.guard.step_timeout_s``."""
    memory_bytes: int = Field(512 * 2**20, ge=2**20, le=2**40)
    """Address-space limit (RLIMIT_AS) of each process."""
    max_processes: int = Field(16, ge=1, le=4096)
    """Processes/threads of the run's uid (RLIMIT_NPROC)."""
    file_size_bytes: int = Field(8 * 2**20, ge=0, le=2**40)
    """Largest file the code may write (RLIMIT_FSIZE)."""
    disk_bytes: int = Field(16 * 2**20, ge=4096, le=2**40)
    """Size of the private tmpfs work dir."""
    max_open_files: int = Field(64, ge=4, le=65536)
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    max_output_bytes: int = Field(16384, ge=1, le=2**30)
    """stdout and stderr are each capped at this; writing more kills the run."""
    max_code_chars: int = Field(20000, ge=1, le=10_000_000)
    """Longer code is refused without running (``error: code longer than ...``)."""
    require_isolation: bool = True
    """Refuse to run (error result) when network or filesystem isolation is unavailable."""
    uid_base: int = Field(2_000_000, ge=1000, le=2**31 - 1)
    """First uid of the pool of dedicated uids (root mode). The pool must not overlap real users."""
    uid_count: int = Field(1000, ge=1, le=1_000_000)
    """Number of uids in the pool: concurrent runs at most (each locks one)."""
    python: str | None = None
    """Interpreter for the code; unset: this process's base interpreter."""


class _AnswerEnvBase(Section):
    """What the answer environments (``reasoning_gym``, ``dataset``) share: tools and the reward."""

    tools: list[Literal["calc", "python"]] = Field(default_factory=list)
    """Tools the model may call (empty: answer only). ``calc``: the calculator's integer
    arithmetic; ``python``: code run in asyncrl's sandbox (``env.sandbox``). Calls earn the
    built-ins' process rewards."""
    reward: Literal["binary", "score"] = "binary"
    """Outcome reward: ``binary`` (1 for a full score, else 0) or ``score`` (the scorer's value in
    [0, 1]). Success is a full score either way."""
    hygiene_tasks: int = Field(8, ge=1, le=1000)
    """Tasks (per dataset) on which the scorer is tried with deliberately wrong answers when the
    environment is built; a scorer that credits one in full is refused."""
    demonstrator: str | None = None
    """The warm start's demonstrations from your code: ``package.module:function`` or
    ``path/to/file.py:function``, called as ``function(example, rng) -> list[str]`` with the task's
    example (``dataset``: its row, every column; ``reasoning_gym``: the entry, ``question``,
    ``answer``, ``metadata``) and a ``random.Random``; it returns the model turns in asyncrl's text
    protocol, tool calls included (``["<tool>calc(2+3)</tool>", "<answer>5</answer>"]``). Unset: the
    reference answer alone (``dataset``: its worked solution when ``solution_field`` is set)."""


class ReasoningGymDatasetConfig(Section):
    """One reasoning-gym dataset of a ``reasoning_gym`` environment."""

    name: str = Field(min_length=1)
    """The dataset's registered name, e.g. ``basic_arithmetic`` (``reasoning_gym.factory.DATASETS``)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Its config fields (``seed`` excluded: ``env.seed`` sets it). They win over the curriculum's:
    a field set here is not moved by the difficulty."""
    weight: float = Field(1.0, gt=0, le=1e6)
    """Relative share of training tasks drawn from this dataset."""


class ReasoningGymConfig(_AnswerEnvBase):
    """``env.kind: reasoning_gym``: reasoning-gym datasets as one environment (docs/environments.md)."""

    datasets: list[ReasoningGymDatasetConfig] = Field(min_length=1, max_length=200)
    """The datasets and their weights."""
    curriculum: bool = True
    """Map asyncrl difficulties onto each dataset's curriculum levels (difficulty ``d`` = level ``d``
    of every curriculum attribute, capped at its last); off, or for a dataset without a curriculum,
    difficulty 0 only."""


class DatasetConfig(_AnswerEnvBase):
    """``env.kind: dataset``: question/answer rows from a file (docs/environments.md)."""

    path: str = Field(min_length=1)
    """A ``.jsonl``, ``.csv`` or ``.parquet`` file, or a directory written by ``datasets``'
    ``save_to_disk`` (no hub downloads). Parquet and saved datasets need ``asyncrl[datasets]``."""
    prompt_field: str = "question"
    """Column holding the prompt."""
    answer_field: str = "answer"
    """Column holding the reference answer."""
    system_field: str | None = None
    """Column holding a per-row system prompt (placed before the prompt), if any."""
    difficulty_field: str | None = None
    """Integer column holding each row's difficulty (unset: every row is difficulty 0)."""
    scorer: str = "exact"
    """``exact`` (case/whitespace-insensitive), ``numeric`` (within ``tolerance``), ``math``
    (expression equivalence by math-verify, ``asyncrl[math]``) or ``package.module:function``
    taking ``(answer, reference)`` and returning a score in [0, 1]."""
    tolerance: float = Field(1e-6, ge=0, le=1e9)
    """``numeric``: absolute or relative tolerance."""
    split_field: str | None = None
    """Column naming each row's split; rows whose value is ``heldout_value`` are held out. Unset:
    the held-out split is chosen by a hash of the prompt (disjoint by content)."""
    heldout_value: str = "test"
    """The ``split_field`` value of held-out rows."""
    solution_field: str | None = None
    """Column holding a worked solution: the warm start demonstrates it as the model's turn, the
    solution's text as reasoning followed by ``<answer>`` and the row's answer. A final line
    ``#### N`` (GSM8K's) is left out of the reasoning. Not with ``demonstrator``."""

    @model_validator(mode="after")
    def _one_demonstration(self) -> DatasetConfig:
        if self.solution_field and self.demonstrator:
            raise ValueError(
                "env.dataset: set solution_field or demonstrator, not both (both make the warm start's "
                "demonstrations)"
            )
        return self


ANSWER_KINDS = ("reasoning_gym", "dataset")
"""Kinds whose difficulty range defaults to every level the environment has (and ``class``)."""

_SECTION_HINTS = {
    "reasoning_gym": ", e.g. env.reasoning_gym: {datasets: [{name: basic_arithmetic}]}",
    "dataset": ", e.g. env.dataset: {path: rows.jsonl}",
    **{kind: f" (docs/environments.md#{kind})" for kind in ECOSYSTEM_KINDS},
    "class": ", e.g. env.class_env: {factory: 'my_envs:CounterEnv', rows: rows.jsonl}",
}
"""What the error of an ``env.kind`` without its section adds: an example or the page."""


class MixMemberConfig(Section):
    """One environment of an ``env.kind: mix`` run (docs/environments.md#mix)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    """The environment's name in buckets, metrics and reports (letters, digits, ``_``, ``-``); unique."""
    weight: float = Field(1.0, gt=0, le=1e6)
    """Relative share of training tasks drawn from this environment."""
    env: EnvConfig
    """Its full environment config (any kind but ``mix`` and ``agent``): its own tasks, held-out split,
    difficulty range, latency, faults, guard and sandbox."""
    system_prompt: str | None = None
    """Text that leads the prompt of every episode of this environment (as a ``dataset`` row's
    ``system_field`` does), training and held-out alike. The model's system message stays
    ``model.system_prompt`` (or the generated one), which every member shares."""
    sft_share: float | None = Field(None, ge=0, le=1e6)
    """Relative share of the warm start's demonstrations drawn from this environment. Unset: its
    ``weight``. ``0``: none (an environment without demonstrations can still be a member of a run
    that warm-starts)."""


class EnvConfig(Section):
    """The environment the agent acts in, and its task source."""

    kind: Literal[
        "calculator",
        "kb_lookup",
        "python",
        "strings",
        "reasoning_gym",
        "dataset",
        "class",
        "gem",
        "openenv",
        "verifiers",
        "plugin",
        "agent",
        "mix",
    ] = "calculator"
    """Built-in environment (``reasoning_gym``, ``dataset``, ``gem``, ``openenv``, ``verifiers`` are set up
    in the section of that name), ``class`` for a TRL-style environment class (section ``class_env``),
    ``plugin`` for a user class named by ``path``, ``agent`` for a user agent program ``async def
    run(task, client) -> reward | None`` named by ``path``, whose OpenAI calls go through the worker's
    gateway (docs/agents.md), or ``mix`` for several environments in one run (the ``mix`` list)."""
    path: str | None = None
    """kind: plugin, agent — import path ``package.module:ClassName`` of a user environment (plugin),
    or ``package.module:function`` of an agent program (agent)."""
    agent_tasks: str = "calculator"
    """kind: agent — the built-in environment kind (or plugin ``module:Class``) whose task source,
    held-out split and warm-start demonstrations the agent's episodes use."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments passed to the environment's constructor."""
    max_turns: int = Field(6, ge=1, le=256)
    """Model turns per episode before it ends as ``truncated``."""
    min_difficulty: int = Field(2, ge=0, le=100)
    """Lowest task difficulty drawn (calculator: number of steps). ``reasoning_gym`` and
    ``dataset`` default to 0 (every level they have)."""
    max_difficulty: int = Field(3, ge=0, le=100)
    """Highest task difficulty drawn (``reasoning_gym``, ``dataset``: defaults to 100, every level)."""
    heldout_size: int = Field(64, ge=1, le=100000)
    """Number of held-out evaluation tasks (disjoint from training tasks)."""
    seed: int = Field(1234, ge=0)
    """Seed of the task generator (and knowledge base)."""
    latency: LatencyConfig = Field(default_factory=NoLatencyConfig)
    faults: FaultConfig = Field(default_factory=FaultConfig)
    guard: GuardConfig = Field(default_factory=GuardConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    reasoning_gym: ReasoningGymConfig | None = None
    """kind: reasoning_gym — the datasets, tools and reward (docs/environments.md#reasoning_gym)."""
    dataset: DatasetConfig | None = None
    """kind: dataset — the file, its fields, the scorer, tools and reward (docs/environments.md#dataset)."""
    gem: GemConfig | None = None
    """kind: gem — a GEM or TextArena game (docs/environments.md#gem)."""
    openenv: OpenEnvConfig | None = None
    """kind: openenv — an OpenEnv Environment class in process (docs/environments.md#openenv)."""
    verifiers: VerifiersConfig | None = None
    """kind: verifiers — a verifiers v0 environment in process (docs/environments.md#verifiers)."""
    mix: list[MixMemberConfig] | None = None
    """kind: mix — several environments in one run, each with a name, a weight and its own env config
    (docs/environments.md#mix)."""
    class_env: ClassEnvConfig | None = None
    """kind: class — a TRL-style environment class, its reward and its rows (docs/environments.md#class)."""

    @model_validator(mode="before")
    @classmethod
    def _answer_kind_range(cls, data: Any) -> Any:
        """``reasoning_gym`` and ``dataset`` take every difficulty they have unless a range is set."""
        if isinstance(data, dict) and data.get("kind") in (*ANSWER_KINDS, "class"):
            data = {"min_difficulty": 0, "max_difficulty": 100, **data}
        return data

    @model_validator(mode="after")
    def _check(self) -> EnvConfig:
        sections = {
            "reasoning_gym": self.reasoning_gym,
            "dataset": self.dataset,
            "gem": self.gem,
            "openenv": self.openenv,
            "verifiers": self.verifiers,
            "class": self.class_env,
        }
        for kind, section in sections.items():
            name = "class_env" if kind == "class" else kind
            if self.kind == kind and section is None:
                raise ValueError(f"env.kind {kind!r} needs the env.{name} section{_SECTION_HINTS[kind]}")
            if self.kind != kind and section is not None:
                raise ValueError(f"env.{name} is set but env.kind is {self.kind!r}: set env.kind: {kind}")
        _check_mix(self.kind, self.mix)
        if self.kind == "plugin" and not self.path:
            raise ValueError("env.kind 'plugin' needs env.path, e.g. 'my_pkg.my_env:MyEnv'")
        if self.kind == "agent" and not self.path:
            raise ValueError("env.kind 'agent' needs env.path, e.g. 'my_agents.calculator:run'")
        if self.min_difficulty > self.max_difficulty:
            raise ValueError(
                f"min_difficulty ({self.min_difficulty}) must not exceed max_difficulty ({self.max_difficulty})"
            )
        return self


def _check_mix(kind: str, mix: list[MixMemberConfig] | None) -> None:
    """``env.mix``: set exactly with ``kind: mix``; names unique; no nested mix, no agent member."""
    example = (
        "env.mix: [{name: arith, weight: 2, env: {kind: calculator}}, {name: kb, env: {kind: kb_lookup}}]"
    )
    if kind == "mix" and not mix:
        raise ValueError(f"env.kind 'mix' needs the env.mix list, e.g. {example}")
    if kind != "mix" and mix is not None:
        raise ValueError(f"env.mix is set but env.kind is {kind!r}: set env.kind: mix")
    seen: set[str] = set()
    for i, m in enumerate(mix or []):
        if m.name in seen:
            raise ValueError(
                f"env.mix[{i}]: the name {m.name!r} is used twice; every member needs its own name"
            )
        seen.add(m.name)
        if m.env.kind == "mix":
            raise ValueError(
                f"env.mix[{i}] ({m.name}) is itself a mix: nested mixes are not supported; "
                "list its members in the outer env.mix"
            )
        if m.env.kind == "agent":
            raise ValueError(
                f"env.mix[{i}] ({m.name}) has kind 'agent': an agent program runs the whole run's episodes "
                "and cannot be one member of a mix"
            )


MixMemberConfig.model_rebuild()
