"""House-keeping counts for src/asyncrl (issue #29's before/after figures), as JSON.

- ``any_params``: function parameters annotated ``Any`` (``*args``/``**kwargs`` included);
- ``function_level_own_imports``: ``import asyncrl...`` / ``from asyncrl... import`` /
  relative imports inside a function body (deferred imports of torch, transformers, vllm or ray
  are not counted: those defer heavy libraries on purpose);
  ``..._not_deferring_heavy`` counts those whose module does not itself (transitively, through
  top-level imports) import one of those libraries: the ones that should move to the top;
- ``functions_over_80_lines``: functions whose ``def`` to last line spans more than 80 lines;
- ``metric_name_reads_outside_telemetry``: subscripts or ``.get(...)`` calls whose key is a string
  literal shaped ``"namespace/name"`` outside ``telemetry/`` (reads of metric names);
- ``modules_over_800_lines`` / ``classes_over_400_lines``: the size limits of CONVENTIONS;
- ``any_uses``: every use of ``Any`` in code (annotations included, imports not);
- ``dict_str_any``: every ``dict[str, Any]`` (``Dict``/``Mapping``/``MutableMapping`` too);
- ``getattr_hasattr``: calls of ``getattr`` / ``hasattr``;
- ``src_lines``: lines of every module (a number, no findings);
- ``duplicate_pairs``: the pairs the ``duplicates`` command (the tool library's, when on PATH)
  reports for the tree; ``null`` where the command is not there.

Usage: ``python bench/house_counts.py [--root src/asyncrl] [--list]``.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

METRIC_KEY = re.compile(r"^[a-z_]+/[a-z0-9_./]+$")
HEAVY = {"torch", "transformers", "vllm", "ray", "peft", "safetensors"}


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, node: ast.ImportFrom | ast.Import, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if is_pkg else 0)
        base = ".".join(parts[:keep] + ([node.module] if node.module else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def heavy_modules(root: Path) -> set[str]:
    """Own modules whose top-level imports (transitively) load a heavy library."""
    edges: dict[str, set[str]] = {}
    heavy: set[str] = set()
    for path in root.rglob("*.py"):
        module = _module_name(root, path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets: set[str] = set()
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _resolve(module, node, path.name == "__init__.py"):
                    if name.split(".")[0] in HEAVY:
                        heavy.add(module)
                    parts = name.split(".")  # importing a.b.c runs a/__init__ and a/b/__init__ too
                    targets.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        edges[module] = targets
        if path.name == "__init__.py" and _lazy(
            tree
        ):  # PEP 562: ``from pkg import name`` loads name's module
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node not in tree.body:
                    for alias in node.names:
                        edges[f"{module}.{alias.asname or alias.name}"] = set(
                            _resolve(module, node, True)[:1]
                        )
    changed = True
    while changed:
        changed = False
        for module, targets in edges.items():
            if module not in heavy and any(t in heavy for t in targets):
                heavy.add(module)
                changed = True
    return heavy


def _lazy(tree: ast.Module) -> bool:
    """Whether a package's ``__init__`` loads names on first use (a module-level ``__getattr__``)."""
    return any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body)


def _own_import(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "asyncrl"
    return any(alias.name.split(".")[0] == "asyncrl" for alias in node.names)


def _is_any(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, ast.Name):
        return annotation.id == "Any"
    if isinstance(annotation, ast.Attribute):
        return annotation.attr == "Any"
    if isinstance(annotation, ast.Constant):
        return annotation.value == "Any"
    return False


def _metric_key(node: ast.AST) -> str | None:
    key: ast.AST | None = None
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        key = node.slice
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
    ):
        key = node.args[0]
    if isinstance(key, ast.Constant) and isinstance(key.value, str) and METRIC_KEY.match(key.value):
        return key.value
    return None


def count(root: Path) -> dict[str, list[str]]:
    """Each count's findings as ``path:line what`` strings."""
    found: dict[str, list[str]] = {
        "any_params": [],
        "function_level_own_imports": [],
        "function_level_own_imports_not_deferring_heavy": [],
        "functions_over_80_lines": [],
        "metric_name_reads_outside_telemetry": [],
        "modules_over_800_lines": [],
        "classes_over_400_lines": [],
        "any_uses": [],
        "dict_str_any": [],
        "getattr_hasattr": [],
    }
    heavy = heavy_modules(root)
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        module = _module_name(root, path)
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        if (lines := len(text.splitlines())) > 800:
            found["modules_over_800_lines"].append(f"{rel} ({lines} lines)")
        in_telemetry = "/telemetry/" in f"/{path.relative_to(root).as_posix()}"
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                _function_counts(node, rel, found)
                _deferred_imports(node, rel, module, path.name == "__init__.py", heavy, found)
            elif not in_telemetry and (key := _metric_key(node)) is not None:
                found["metric_name_reads_outside_telemetry"].append(f"{rel}:{node.lineno} {key}")
            _typing_counts(node, rel, found)
    return found


DICT_ANY = {f"{d}[str, Any]" for d in ("dict", "Dict", "Mapping", "MutableMapping")}


def _typing_counts(node: ast.AST, rel: str, found: dict[str, list[str]]) -> None:
    if isinstance(node, ast.ClassDef):
        span = (node.end_lineno or node.lineno) - node.lineno + 1
        if span > 400:
            found["classes_over_400_lines"].append(f"{rel}:{node.lineno} {node.name} ({span} lines)")
    elif (isinstance(node, ast.Name) and node.id == "Any") or (
        isinstance(node, ast.Attribute) and node.attr == "Any"
    ):
        found["any_uses"].append(f"{rel}:{node.lineno}")
    elif isinstance(node, ast.Subscript) and ast.unparse(node).replace("typing.", "") in DICT_ANY:
        found["dict_str_any"].append(f"{rel}:{node.lineno}")
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        # string annotations ("dict[str, Any]") are not parsed: count them by their text
        hits = sum(node.value.replace("typing.", "").count(d) for d in DICT_ANY)
        found["dict_str_any"].extend([f"{rel}:{node.lineno} (in a string)"] * hits)
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
    ):
        found["getattr_hasattr"].append(f"{rel}:{node.lineno} {node.func.id}")


def src_lines(root: Path) -> int:
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in root.rglob("*.py"))


def duplicate_pairs(root: Path) -> int | None:
    """The pair count of the ``duplicates`` command over ``root``; None where it is absent."""
    tool = shutil.which("duplicates")
    if tool is None:
        return None
    out = subprocess.run(
        [tool, "--repo", str(root), "--seconds", "120"], capture_output=True, text=True, check=False
    ).stdout
    first = out.splitlines()[0] if out else ""
    if first.startswith("no duplicates"):
        return 0
    match = re.match(r"(\d+) pairs? ", first)
    return int(match.group(1)) if match else None


def _function_counts(
    node: ast.FunctionDef | ast.AsyncFunctionDef, rel: str, found: dict[str, list[str]]
) -> None:
    args = node.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    for arg in every:
        if arg is not None and _is_any(arg.annotation):
            found["any_params"].append(f"{rel}:{node.lineno} {node.name}({arg.arg})")
    span = (node.end_lineno or node.lineno) - node.lineno + 1
    if span > 80:
        found["functions_over_80_lines"].append(f"{rel}:{node.lineno} {node.name} ({span} lines)")


def _deferred_imports(
    node: ast.FunctionDef | ast.AsyncFunctionDef,
    rel: str,
    module: str,
    is_pkg: bool,
    heavy: set[str],
    found: dict[str, list[str]],
) -> None:
    for inner in _own_body(node):
        if isinstance(inner, (ast.Import, ast.ImportFrom)) and _own_import(inner):
            where = f"{rel}:{inner.lineno} in {node.name}"
            found["function_level_own_imports"].append(where)
            names = _resolve(module, inner, is_pkg)
            if not any(
                ".".join(n.split(".")[:i]) in heavy for n in names for i in range(1, n.count(".") + 2)
            ):
                found["function_level_own_imports_not_deferring_heavy"].append(where)


def _own_body(node: ast.AST) -> list[ast.AST]:
    """The nodes of a function's body, not descending into nested functions (counted alone)."""
    out: list[ast.AST] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        out.append(child)
        out.extend(_own_body(child))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).parents[1] / "src" / "asyncrl"))
    parser.add_argument("--list", action="store_true", help="print every finding, not only counts")
    args = parser.parse_args()
    found = count(Path(args.root))
    out: dict[str, object] = {name: len(items) for name, items in found.items()}
    out["src_lines"] = src_lines(Path(args.root))
    out["duplicate_pairs"] = duplicate_pairs(Path(args.root))
    if args.list:
        out["findings"] = found
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
