"""The house's floors: packages import only downwards in the process order, and nothing forms a circle.

Every ``import`` of an ``asyncrl`` module in ``src/`` is read from the syntax tree — at module level,
inside functions, and under ``TYPE_CHECKING`` — and checked against the floors below (the same table
as ``docs/architecture.md#floors``). A package may import its own floor (no circle) and the floors
beneath it, never one above. Only the control package touches the state store's keys.
"""

from __future__ import annotations

import ast
import re
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
    },  # 0: records, shared helpers, pure maths, the staleness rules
    {"config"},  # 1
    {"envs", "policy", "telemetry", "bootstrap"},  # 2: environments, the model, metric writing
    {"transport", "weights", "control", "engine", "cost"},  # 3: the boundaries and the shared run state
    {"rollout", "gateway", "credit"},  # 4: the rollout worker (and its gateway), credit assignment
    {"trainer"},  # 5
    {"launch"},  # 6: places role processes
    {"orchestrator"},  # 7: prepares, launches, supervises
    {"service", "cli"},  # 8: entry points
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
    assert "asyncrl.orchestrator.run" in _imports("asyncrl.service", MODULES["asyncrl.service"])


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
        "lag = {'sync': 0, 'one_step_off': 1}.get(cfg.orchestrator.mode, 3)\n"
        "limit = 2 if cfg.orchestrator.mode == 'async' else None\n"
        "fixed = mode in ('sync', 'one_step_off')\n"
        "title = f'asyncrl {cfg.orchestrator.mode}'\n"
    )
    assert sorted(_rule5_derivations(probe, root=tmp_path)) == ["probe.py:1", "probe.py:2", "probe.py:3"]


# -- defaults live only in config.py ---------------------------------------------------------------
ALLOWED_REPEATS = {
    # log-probs at temperature 1 are the untempered distribution: the neutral element, not the sampling setting
    ("policy/model.py", "token_logprobs", "temperature"),
    ("policy/model.py", "token_logprobs_and_entropy", "temperature"),
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


def test_no_config_default_is_written_again_outside_config() -> None:
    defaults = _config_defaults()
    repeats = [
        r
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "config.py"
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
