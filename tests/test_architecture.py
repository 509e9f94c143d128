"""The house's floors: packages import only downwards in the process order, and nothing forms a circle.

Every ``import`` of an ``asyncrl`` module in ``src/`` is read from the syntax tree — at module level,
inside functions, and under ``TYPE_CHECKING`` — and checked against the floors below (the same table
as ``docs/architecture.md#floors``). A package may import its own floor (no circle) and the floors
beneath it, never one above. Only the control package touches the state store's keys.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "asyncrl"

FLOORS: list[set[str]] = [
    {
        "asyncrl",
        "errors",
        "records",
        "credentials",
        "durable",
        "algo",
        "staleness",
        "learning_signal",
        "jsontext",
    },  # 0: records, shared helpers (bounded JSON of untrusted text), pure maths, the staleness rules,
    # the learning-signal rules
    {"config"},  # 1
    # 2: environments, the model, metric writing, role start-up, core lending between the role processes
    {"envs", "policy", "telemetry", "bootstrap", "lending"},
    {"transport", "weights", "control", "engine", "cost"},  # 3: the boundaries and the shared run state
    {"rollout", "gateway", "credit"},  # 4: the rollout worker (and its gateway), credit assignment
    {"trainer"},  # 5: the trainer role (what runs in its process)
    {"launch"},  # 6: places role processes
    {"orchestrator"},  # 7: prepares, launches, supervises
    # 8: entry points and the offline jobs they run (train, warm start, replay, credit show / ablate,
    # report, runs list / compare, cost report)
    {"service", "cli", "jobs"},
]
FLOOR = {pkg: i for i, pkgs in enumerate(FLOORS) for pkg in pkgs}


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    """Every asyncrl module ``module`` imports, wherever the import statement is."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).startswith("asyncrl")
        ):
            names = [str(node.args[0].value)]  # an import by name is still an import
        for name in names:
            target = _resolve(name) if name.startswith("asyncrl") else None
            if target and target != module:
                found.add(target)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "asyncrl"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_package_has_a_floor() -> None:
    assert {_package(m) for m in MODULES} <= set(FLOOR), {_package(m) for m in MODULES} - set(FLOOR)


def test_no_import_runs_up_the_floors() -> None:
    upward = [
        f"{a} -> {b}"
        for a, targets in sorted(GRAPH.items())
        for b in sorted(targets)
        if FLOOR[_package(a)] < FLOOR[_package(b)]
    ]
    assert upward == []


def test_no_import_circle_between_modules_or_packages() -> None:
    assert _cycles(GRAPH) == []
    packages: dict[str, set[str]] = {}
    for a, targets in GRAPH.items():
        packages.setdefault(_package(a), set()).update(
            _package(b) for b in targets if _package(b) != _package(a)
        )
    assert _cycles(packages) == []


def test_the_checks_can_fail() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("def f():\n    from asyncrl.orchestrator.run import train\n")
    assert any(isinstance(n, ast.ImportFrom) for n in ast.walk(tree))  # a function-level import is seen
    assert "asyncrl.jobs.train" in _imports("asyncrl.service", MODULES["asyncrl.service"])


def test_no_environment_kind_imports_another() -> None:
    """What kinds share (task sources, tools, demonstrations) lives in ``envs/tasks.py``, ``envs/toolenv.py``
    and ``envs/demos.py``: no kind's module (an ``ADAPTERS`` entry's) imports another kind's."""
    from asyncrl.envs.registry import ADAPTERS

    kinds = {a.env.__module__ for a in ADAPTERS.values()}
    assert len(kinds) == len(ADAPTERS)
    assert sorted((m, t) for m in kinds for t in GRAPH[m] & kinds) == []


def test_only_the_control_package_uses_the_state_store() -> None:
    """Roles share state through :class:`asyncrl.control.RunState`, never through store keys."""
    users = sorted(
        a
        for a, targets in GRAPH.items()
        if any(t.startswith("asyncrl.control.store") for t in targets) and not a.startswith("asyncrl.control")
    )
    assert users == []


# -- the staleness rules live only in asyncrl/staleness.py ----------------------------------------
MODES = {"sync", "one_step_off", "async"}


def _rule5_derivations(path: Path, root: Path = SRC) -> list[str]:
    """Places that re-derive rule 5 (what a mode means): a comparison of something's ``mode`` with a
    staleness mode (``mode == "async"``, ``mode in ("sync", ...)``), or a mapping keyed by one
    (``{"sync": 0, "one_step_off": 1}``). Reading the mode to print it is fine."""
    rel = str(path.relative_to(root))
    found = []

    def is_mode(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "mode") or (
            isinstance(node, ast.Name) and node.id == "mode"
        )

    def names_a_mode(node: ast.expr) -> bool:
        elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return any(isinstance(e, ast.Constant) and e.value in MODES for e in elts)

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(is_mode(o) for o in operands) and any(names_a_mode(o) for o in operands):
                found.append(f"{rel}:{node.lineno}")
        elif isinstance(node, ast.Dict) and any(
            isinstance(k, ast.Constant) and k.value in MODES - {"async"} for k in node.keys
        ):
            found.append(f"{rel}:{node.lineno}")
    return found


def test_rule_5_is_derived_only_in_the_staleness_module() -> None:
    """The config, the report, the gateway and the roles ask ``StalenessPolicy`` what a mode means."""
    found = [
        f
        for path in sorted(SRC.rglob("*.py"))
        if path != SRC / "staleness.py"
        for f in _rule5_derivations(path)
    ]
    assert found == []


def test_the_rule_5_scan_can_fail(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "lag = {'sync': 0, 'one_step_off': 1}.get(cfg.control.mode, 3)\n"
        "limit = 2 if cfg.control.mode == 'async' else None\n"
        "fixed = mode in ('sync', 'one_step_off')\n"
        "title = f'asyncrl {cfg.control.mode}'\n"
    )
    assert sorted(_rule5_derivations(probe, root=tmp_path)) == ["probe.py:1", "probe.py:2", "probe.py:3"]


# -- defaults live only in the config package ---------------------------------------------------------------
ALLOWED_REPEATS = {
    # log-probs at temperature 1 are the untempered distribution: the neutral element, not the sampling setting
    ("policy/scoring.py", "token_logprobs", "temperature"),
    ("policy/scoring.py", "token_logprobs_and_entropy", "temperature"),
    # the wire record's schema: a record without these fields decodes as untempered, un-truncated sampling
    ("records.py", "SamplingParams", "temperature"),
    ("records.py", "SamplingParams", "top_p"),
    # an empty directives document (no orchestrator has spoken yet) starts no held-out probes
    ("control/directives.py", "Directives", "heldout_rate"),
    # a role report's figure before anything was measured (0 s of evaluation), not a setting
    ("telemetry/reports.py", "EvalFigures", "seconds"),
}


def _config_defaults() -> dict[str, list[tuple[object, str]]]:
    """{field name: [(default, dotted path), ...]} over every config section and every kind of a variant."""
    from pydantic import BaseModel

    from asyncrl import config as C

    out: dict[str, list[tuple[object, str]]] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, f in model.model_fields.items():
            kinds = C.variants(f)
            if kinds:
                for cls in kinds.values():
                    walk(cls, f"{prefix}{name}.")
                continue
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
                walk(f.annotation, f"{prefix}{name}.")
            elif f.default_factory is None and isinstance(f.default, (bool, int, float, str)):
                out.setdefault(name, []).append((f.default, f"{prefix}{name}"))

    walk(C.RunConfig, "")
    return out


def _repeats(
    path: Path, defaults: dict[str, list[tuple[object, str]]], root: Path = SRC
) -> list[tuple[str, str, str, str]]:
    """(file, function or class, parameter or field, config path) for each literal default that equals the
    default of a config field of the same name — in a signature or a dataclass-style class body."""
    found = []
    rel = str(path.relative_to(root))

    def same(value: object, default: object) -> bool:
        return (type(value) is bool) == (
            type(default) is bool
        ) and value == default  # True == 1, but not here

    def check(owner: str, name: str, node: ast.expr | None) -> None:
        try:
            value = ast.literal_eval(node) if node is not None else None
        except ValueError:
            return
        for default, where in defaults.get(name, []):
            if value is not None and same(value, default):
                found.append((rel, owner, name, where))

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            pos = a.posonlyargs + a.args
            for arg, d in zip(pos[len(pos) - len(a.defaults) :], a.defaults, strict=True):
                check(node.name, arg.arg, d)
            for arg, kd in zip(a.kwonlyargs, a.kw_defaults, strict=True):
                check(node.name, arg.arg, kd)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    check(node.name, item.target.id, item.value)
    return found


def _is_config(path: Path) -> bool:
    """The config package, and ``algo/config.py`` (the loss section, kept beside the pure maths)."""
    rel = path.relative_to(SRC)
    return rel.parts[0] == "config" or rel.as_posix() == "algo/config.py"


def test_no_config_default_is_written_again_outside_config() -> None:
    defaults = _config_defaults()
    repeats = [
        r
        for path in sorted(SRC.rglob("*.py"))
        if not _is_config(path)
        for r in _repeats(path, defaults)
        if r[:3] not in ALLOWED_REPEATS
    ]
    assert repeats == []


def test_the_default_scan_can_fail(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "class Q:\n    capacity: int = 1024\n\n\ndef f(lease_seconds: float = 60.0) -> None: ...\n"
    )
    found = _repeats(probe, _config_defaults(), root=tmp_path)
    assert {(owner, name) for _, owner, name, _ in found} == {("Q", "capacity"), ("f", "lease_seconds")}


# -- the control plane reads typed reports, not metric names ---------------------------------------
METRICS_DOC = SRC.parent.parent / "docs" / "metrics.md"


def _metric_namespaces() -> set[str]:
    """Every namespace of a documented metric (``docs/metrics.md``), but the learner's: the learner
    composes its own figures (``loss/*``, ``policy/*``, ... convention 14) and no decision reads them."""
    from asyncrl.telemetry.reports import LEARNER_NAMESPACES

    return set(re.findall(r"`([a-z_]+)/[a-z0-9_{}*]+", METRICS_DOC.read_text())) - set(LEARNER_NAMESPACES)


def _metric_name_reads(path: Path, namespaces: set[str], root: Path = SRC) -> list[str]:
    """Places that read a metric by its name: a ``"pkg/name"`` literal (or an f-string that starts with
    ``"pkg/"``) of a metric namespace used as a subscript, a ``.get``/helper argument or in a
    comparison. Writing one (a dict key, an assignment target, an event's name) is fine."""
    rel = str(path.relative_to(root))
    name = re.compile(rf"^({'|'.join(sorted(namespaces))})/[a-z0-9_]*")

    def is_name(node: ast.expr) -> bool:
        if isinstance(node, ast.JoinedStr) and node.values:
            node = node.values[0]
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(name.match(node.value))

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        read: list[ast.expr] = []
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            read = [node.slice]
        elif isinstance(node, ast.Call):
            func = node.func
            callee = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            read = [] if callee == "event" else list(node.args)  # an event's name is written, not read
        elif isinstance(node, ast.Compare):
            read = [node.left, *node.comparators]
        if any(is_name(n) for n in read):
            found.append(f"{rel}:{node.lineno}")
    return found


def test_metric_names_are_read_only_in_telemetry() -> None:
    """The orchestrator, its rules, the summary and the cost ledger read the attributes of decoded
    reports (:mod:`asyncrl.telemetry.reports`); only ``telemetry/`` turns rows and names into reports."""
    namespaces = _metric_namespaces()
    assert {"rollout", "trainer", "queue", "guard", "eval", "reward", "staleness"} <= namespaces
    found = [
        f
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).parts[0] != "telemetry"
        for f in _metric_name_reads(path, namespaces)
    ]
    assert found == []


def test_the_metric_name_scan_can_fail(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "depth = row['queue/ready']\n"
        "reward = row.get('reward/mean')\n"
        "episodes = live.total('rollout/episodes')\n"
        "seen = 'guard/calls' in row\n"
        "group = r.get('event') == 'rollout/group'\n"
        "figure = row[f'rollout/{key}']\n"
        "out = {'queue/depth': 1.0, f'rollout/{k}': 2.0}\n"  # writes: fine
        "out['trainer/step'] = 3.0\n"
        "writer.event('rollout/group', {})\n"
        "loss = metrics['loss/policy']\n"  # the learner's own figures: not the control plane's
    )
    found = _metric_name_reads(probe, _metric_namespaces(), root=tmp_path)
    assert found == [f"probe.py:{n}" for n in (1, 2, 3, 4, 5, 6)], found


# -- ... and no knob hides under another name: the scan by value -----------------------------------
NEUTRAL = {0, 1, -1}
"""Identity elements and "none"/"one"/"all": a default of 0, 1 or -1 sets nothing a user would tune."""
KNOB_KEYWORDS = {"maxlen", "timeout", "health_check_interval"}
"""Call keywords that size or time something (and every keyword ending in ``_s``): ``deque(maxlen=5)``."""

_PURE = "numerical guard of a pure function (epsilon against 0/0, overflow clamp), not a setting"
_UNIT = "a unit, a format version or an exit code: a definition, not a setting"
_COMMAND = "an option of a command (its --help shows it; the parser passes it), not a run setting"
_CHECK = "a threshold of `asyncrl env check`, the contract test of an environment, not a run setting"
_ENV = "part of a built-in environment's definition (its tasks, tools, reward shaping; docs/environments.md)"
_WIRE = "the wire record's schema: a record without the field decodes with this value"
_IMPL = "an implementation bound (chunk, poll, probe, retry or set-up sizes): speed or memory, no behaviour to set"
_DRAW = "how a chart or report is drawn or summarised"

ALLOWED_LITERALS: dict[tuple[str, str, str], str] = {
    **dict.fromkeys(
        [
            ("algo/advantages.py", "group_advantages", "eps"),
            ("algo/tree.py", "tree_advantages", "eps"),
            ("algo/kl.py", "<module>", "LOG_RATIO_CLAMP"),
        ],
        _PURE,
    ),
    **dict.fromkeys(
        [
            ("cli/parser.py", "<module>", "EXIT_USER_ERROR"),
            ("cost/ledger.py", "<module>", "GB"),
            ("cost/ledger.py", "<module>", "MONTH_S"),
            ("policy/memory.py", "<module>", "GIB"),
            ("records.py", "<module>", "SCHEMA_VERSION"),
            ("credit/samples.py", "<module>", "SAMPLES_SCHEMA"),
            ("transport/embedded.py", "<module>", "SCHEMA_VERSION"),
            ("jobs/warm_start.py", "<module>", "TEMPLATE_VERSION"),
            ("launch/ray_launcher.py", "<module>", "_KILLED"),
            ("service.py", "<module>", "EXIT_ORPHANED"),
        ],
        _UNIT,
    ),
    **dict.fromkeys(
        [
            ("jobs/credit_ablate.py", "ablate", "trajectories"),
            ("jobs/credit_ablate.py", "ablate", "k"),
            ("jobs/credit_inspect.py", "render_terminal", "n"),
            ("jobs/credit_inspect.py", "credit_fragment", "n"),
            ("policy/hub.py", "model_info", "tokens"),
            ("service.py", "run_role", "wait_s"),
        ],
        _COMMAND,
    ),
    **dict.fromkeys(
        [
            ("envs/check.py", "acheck_environment", name)
            for name in ("episodes", "max_steps", "timeout_s", "slow_s", "stall_s", "overlap_samples")
        ]
        + [("envs/check.py", "<module>", "_TICK")],
        _CHECK,
    ),
    **dict.fromkeys(
        [
            *(
                ("envs/kb_lookup.py", "generate", f"num_{x}")
                for x in ("people", "cities", "countries", "companies")
            ),
            *(("envs/toolenv.py", "<module>", x) for x in ("MAX_EXPR_CHARS", "MAX_ABS_VALUE")),
            ("envs/calculator.py", "<module>", "LIMIT"),
            *(
                ("envs/base.py", "<module>", f"REWARD_{x}")
                for x in ("WELL_FORMED", "USES_RESULT", "MALFORMED", "TOOL_ERROR")
            ),
            ("envs/base.py", "HashSplitTaskSource", "heldout_permille"),
            ("envs/base.py", "HashSplitTaskSource", "max_attempts"),
            ("envs/toolenv.py", "<module>", "OBSERVATION_CHARS"),
            ("envs/sandbox.py", "summary", "max_chars"),
            ("envs/toolenv.py", "<module>", "MAX_ARGS_CHARS"),
        ],
        _ENV,
    ),
    ("records.py", "SamplingParams", "max_new_tokens"): _WIRE,
    **dict.fromkeys(
        [
            ("control/buckets.py", "buckets_of_source", "probes"),
            ("control/buckets.py", "sample_in_bucket", "attempts"),
            ("control/store/redis_backend.py", "<module>", "_OP_TTL_S"),
            ("credentials.py", "connect", "timeout_s"),
            ("credentials.py", "check_redis", "timeout_s"),
            ("credentials.py", "call:connect", "timeout_s"),
            ("credentials.py", "call:connect", "health_check_interval"),
            ("credentials.py", "<module>", "REDIS_RETRIES"),
            ("credentials.py", "<module>", "REDIS_BACKOFF_BASE_S"),
            ("credentials.py", "<module>", "REDIS_BACKOFF_CAP_S"),
            ("durable.py", "<module>", "_CHUNK"),
            ("engine/hf.py", "<module>", "STATIC_CACHE_SLACK"),
            ("envs/sandbox.py", "call:run", "timeout"),
            ("envs/sandbox.py", "call:wait_for", "timeout"),
            ("launch/ray_launcher.py", "call:wait", "timeout"),
            ("launch/ray_launcher.py", "<module>", "_LOCAL_MIN_CPUS"),
            ("envs/demos.py", "<module>", "TOOL_NOTE_TASKS"),
            ("jobs/train.py", "<module>", "CONTEXT_PROBE_TASKS"),
            ("policy/canary.py", "<module>", "SAMPLE"),
            ("policy/canary.py", "<module>", "ROW"),
            ("policy/packing.py", "<module>", "TREE_MAX_COST"),
            ("telemetry/experiment.py", "call:run", "timeout"),
            ("trainer/distributed.py", "<module>", "_BEAT_FRACTION"),
            ("trainer/intake.py", "pull", "timeout"),
            ("transport/base.py", "<module>", "_POLL_MIN_S"),
            ("transport/base.py", "<module>", "_POLL_MAX_S"),
            ("transport/embedded.py", "<module>", "_ACK_CHUNK"),
            ("transport/redis_backend.py", "<module>", "_BLOCK_SLICE_S"),
            ("transport/redis_backend.py", "<module>", "_ACK_CHUNK"),
            ("transport/redis_backend.py", "<module>", "_STATS_SCAN_MAX"),
            ("weights/local.py", "<module>", "_MAX_RESTARTS"),
            ("jsontext.py", "<module>", "MAX_DEPTH"),  # a parser's safety bound: far above any real body
        ],
        _IMPL,
    ),
    **dict.fromkeys(
        [
            ("algo/gap.py", "<module>", "GAP_SEQUENCE_NATS"),
            ("jobs/cost_report.py", "<module>", "EARLY_FRACTION"),
            ("orchestrator/curriculum.py", "<module>", "NAMES_SHOWN"),
            ("telemetry/svg.py", "nice_ticks", "n"),
            ("telemetry/svg.py", "histogram", "bins"),
            ("telemetry/svg.py", "<module>", "MAX_POINTS"),
            ("telemetry/trainer.py", "<module>", "SUCCESS_WINDOW"),
            ("telemetry/report_metrics.py", "<module>", "CONSTANT_REPLY_SHARE"),  # when a note is written
        ],
        _DRAW,
    ),
}
"""Numeric literals outside the config that are not knobs, each with the reason (the scan below)."""


def _number(node: ast.expr) -> float | None:
    """The value of a numeric literal or of arithmetic on literals (``512 * 2**20``); None otherwise."""
    if not all(
        isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop))
        for n in ast.walk(node)
    ):
        return None
    try:
        value = eval(
            compile(ast.Expression(node), "<literal>", "eval"), {"__builtins__": {}}
        )  # literals only
    except Exception:
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _literal_knobs(path: Path, root: Path = SRC) -> set[tuple[str, str, str]]:
    """(file, owner, name) of every numeric literal that sets something outside the config, whatever its
    name: a parameter's default, a dataclass-style field, a module constant (``UPPER_CASE``), or a
    sizing/timing call keyword (``deque(maxlen=5)``, ``timeout=30.0``); 0, 1 and -1 excepted."""
    rel = str(path.relative_to(root))
    tree = ast.parse(path.read_text())
    found: set[tuple[str, str, str]] = set()

    def check(owner: str, name: str, node: ast.expr | None) -> None:
        value = _number(node) if node is not None else None
        if value is not None and value not in NEUTRAL:
            found.add((rel, owner, name))

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            pos = a.posonlyargs + a.args
            for arg, d in zip(pos[len(pos) - len(a.defaults) :], a.defaults, strict=True):
                check(node.name, arg.arg, d)
            for arg, kd in zip(a.kwonlyargs, a.kw_defaults, strict=True):
                check(node.name, arg.arg, kd)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    check(node.name, item.target.id, item.value)
        elif isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "?")
            for kw in node.keywords:
                if kw.arg is not None and (kw.arg in KNOB_KEYWORDS or kw.arg.endswith("_s")):
                    check(f"call:{callee}", kw.arg, kw.value)
    for item in tree.body:
        target = item.targets[0] if isinstance(item, ast.Assign) and len(item.targets) == 1 else None
        target = item.target if isinstance(item, ast.AnnAssign) else target
        if isinstance(target, ast.Name) and target.id.lstrip("_").isupper():
            check("<module>", target.id, getattr(item, "value", None))
    return found


def test_no_knob_is_a_literal_outside_config() -> None:
    """A number that sets behaviour lives in the config (with its doc and bounds), whatever it is called;
    every other literal is allow-listed with its reason — and an entry that no longer matches goes."""
    found = {k for path in sorted(SRC.rglob("*.py")) if not _is_config(path) for k in _literal_knobs(path)}
    assert sorted(found - set(ALLOWED_LITERALS)) == []
    assert sorted(set(ALLOWED_LITERALS) - found) == []


def test_the_value_scan_can_fail(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from collections import deque\n"
        "LIMIT = 8 * 1024\n"
        "def save(path, keep: int = 2, *, compact_fraction: float = 0.25, n: int = 1) -> None: ...\n"
        "class Cache:\n    max_entries: int = 100_000\n    off: int = 0\n"
        "ages = deque(maxlen=5)\n"
        "conn = connect(timeout=30.0, socket_timeout_s=10.0, retries=3)\n"
    )
    assert _literal_knobs(probe, root=tmp_path) == {
        ("probe.py", "<module>", "LIMIT"),
        ("probe.py", "save", "keep"),
        ("probe.py", "save", "compact_fraction"),
        ("probe.py", "Cache", "max_entries"),
        ("probe.py", "call:deque", "maxlen"),
        ("probe.py", "call:connect", "timeout"),
        ("probe.py", "call:connect", "socket_timeout_s"),
    }


def _group_keys(tree: ast.AST) -> Iterator[ast.expr]:
    """The expressions of ``tree`` that key something: a subscript, the key of ``get`` / ``setdefault`` /
    ``pop``, a dict (or dict comprehension) key, a ``key=`` function (``sorted``, ``groupby``), the left of
    an ``or`` (``t.group_id or t.id``) and what a function returns as it is (a key-maker)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            yield node.slice
        elif isinstance(node, ast.Call):
            if (
                isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "setdefault", "pop")
                and node.args
            ):
                yield node.args[0]
            yield from (k.value for k in node.keywords if k.arg == "key")
        elif isinstance(node, ast.DictComp):
            yield node.key
        elif isinstance(node, ast.Dict):
            yield from (k for k in node.keys if k is not None)
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            yield node.values[0]
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Attribute):
            yield node.value


def _key_makers(trees: Iterable[ast.AST]) -> set[str]:
    """Functions (anywhere, ``records.py`` included) that return a sample's group id, as ``group_key``
    did: ``return t.group_id`` or ``return t.group_id or t.id``."""
    out = set()
    for tree in trees:
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            for ret in (n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None):
                v = ret.value.values[0] if isinstance(ret.value, ast.BoolOp) else ret.value
                if _is_attr(v, "group_id"):
                    out.add(fn.name)
    return out


def _regroupings(files: dict[str, str]) -> list[str]:
    """``file:line`` of each place outside ``records.py`` that keys by a sample's group (an expression of
    :func:`_group_keys` that reads a ``.group_id`` or calls a :func:`_key_makers` function) or regroups
    with ``records.groups_of``."""
    trees = {name: ast.parse(text) for name, text in files.items()}
    makers = _key_makers(trees.values()) | {"groups_of"}

    def reads_group(expr: ast.AST) -> bool:
        return any(
            _is_attr(n, "group_id") or (isinstance(n, ast.Call) and _names(n.func, makers))
            for n in ast.walk(expr)
        )

    out = []
    for name, tree in trees.items():
        if name == "records.py":
            continue
        keys = [k for k in _group_keys(tree) if reads_group(k)]
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _names(n.func, {"groups_of"})]
        out += sorted({f"{name}:{n.lineno}" for n in keys + calls})
    return out


def _is_attr(node: ast.AST, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr


def _names(func: ast.expr, names: set[str]) -> bool:
    return (isinstance(func, ast.Name) and func.id in names) or (
        isinstance(func, ast.Attribute) and func.attr in names
    )


def test_groups_are_never_rebuilt_from_their_members() -> None:
    """A group flows whole (``records.Group``) from the worker to the learner and into the credit sample
    files (``credit.samples.CreditGroup``): outside ``records.py`` (``groups_of``, for tests that build
    samples by hand) nothing keys, sorts or groups samples by their ``group_id``."""
    files = {str(p.relative_to(SRC)): p.read_text() for p in SRC.rglob("*.py")}
    assert _regroupings(files) == []
    # the rule can fail: each way a group has been (or could be) rebuilt from its members
    probes = {
        "a.py": "key = traj.group_id or traj.id",
        "b.py": "def group_key(t):\n    return t.group_id",
        "c.py": "groups.setdefault(smp.trajectory.group_id, []).append(smp)",
        "d.py": "by_group[t.group_id].append(t)",
        "e.py": "heads = {t.group_id: t for t in ts}",
        "f.py": "runs = itertools.groupby(ts, key=lambda t: t.group_id)",
        "g.py": "first = seen.get(t.group_id)",
        "h.py": "groups = records.groups_of(samples)",
        "i.py": "from asyncrl.records import group_key\ngroups.setdefault(group_key(smp.trajectory), [])",
        "records.py": "def group_key(traj):\n    return traj.group_id or traj.id",
        # reading or passing a group id on is no regrouping
        "ok.py": "s = Session(group_id=session.group_id)\nif t.group_id != self.id:\n    raise E(t.group_id)",
    }
    assert _regroupings(probes) == [f"{c}.py:{1 + (c in 'bi')}" for c in "abcdefghi"]


def test_every_end_to_end_file_runs_serially() -> None:
    """``make unit`` runs the test files outside ``conftest.SERIAL`` on two workers at once: a file that
    starts roles (every ``*_e2e.py``) must be in it, and every name in it must be a test file."""
    from conftest import SERIAL

    tests = SRC.parent.parent / "tests"
    names = {p.name for p in tests.glob("test_*.py")}
    assert {n for n in names if n.endswith("_e2e.py")} <= SERIAL
    assert names >= SERIAL, SERIAL - names


# -- a role is built from its own settings ------------------------------------------------------------------
FOREIGN_SECTIONS = {"rollout": {"orchestrator"}, "trainer": {"orchestrator", "rollout"}}
"""What each role's package (and its side of the directives, ``control/worker.py``) may not read: another
role's config section; what it needs from one comes in its settings (``config.run.RolloutSettings``,
``TrainerSettings``), derived once."""


def _foreign_reads(files: dict[str, str]) -> list[str]:
    found = []
    for rel, text in files.items():
        role = "rollout" if rel == "control/worker.py" else rel.partition("/")[0]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and node.attr in FOREIGN_SECTIONS.get(role, set()):
                found.append(f"{rel}:{node.lineno}")
    return found


def test_a_role_reads_no_other_roles_config_section() -> None:
    files = {str(p.relative_to(SRC)): p.read_text() for p in SRC.rglob("*.py")}
    assert _foreign_reads(files) == []
    probes = {
        "rollout/a.py": "bc = self.cfg.orchestrator.breaker",
        "control/worker.py": "on = cfg.orchestrator.curriculum.enabled",
        "trainer/b.py": "steer = cfg.orchestrator.curriculum.steer_buffer",
        "trainer/c.py": "g = run.rollout.group_size",
        "trainer/ok.py": "s = cfg.trainer_settings().steer_buffer\nfrom asyncrl.orchestrator import x",
        "orchestrator/ok.py": "g = cfg.rollout.group_size",
    }
    assert _foreign_reads(probes) == [
        "rollout/a.py:1",
        "control/worker.py:1",
        "trainer/b.py:1",
        "trainer/c.py:1",
    ]
