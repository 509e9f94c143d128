"""The house's floors: packages import only downwards in the process order, and nothing forms a circle.

Every ``import`` of an ``asyncrl`` module in ``src/`` is read from the syntax tree — at module level,
inside functions, and under ``TYPE_CHECKING`` — and checked against the floors below (the same table
as ``docs/architecture.md#floors``). A package may import its own floor (no circle) and the floors
beneath it, never one above. Only the control package touches the state store's keys.
"""

from __future__ import annotations

import ast
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
    },  # 0: records, shared helpers, pure maths
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
