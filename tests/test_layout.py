"""The package's layers, read from its source with ``ast``: data flows one way and the face sits on top.

kernels -> engine -> (exporter, scorers, calm) -> (serve, distributed) -> cli. A module may import its own layer and
the layers below it at module level; the run time (engine) imports the build time (exporter) only inside the
function that exports a checkpoint; nothing outside ``fastnli.cli`` imports ``fastnli.cli``; and the module-level
imports have no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "fastnli"
LAYERS = {"kernels": 0, "engine": 1, "exporter": 2, "scorers": 2, "calm": 2, "serve": 3, "distributed": 3, "cli": 4}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


MODULES = _modules()


def _imports(path: Path, module_level_only: bool) -> set[str]:
    """The fastnli modules that ``path`` imports (a ``from X import name`` of a submodule counts as X.name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if module_level_only:
        nodes: list[ast.AST] = []
        for stmt in tree.body:
            if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
                continue  # seen by type checkers only
            nodes.extend(ast.walk(stmt) if isinstance(stmt, (ast.If, ast.Try, ast.With)) else [stmt])
    else:
        nodes = list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("fastnli"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fastnli") and not node.level:
            subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
            found.update(subs)
            if len(subs) < len(node.names):  # names defined in the module itself
                found.add(node.module)
    return found


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_the_layout_is_what_the_test_expects() -> None:
    assert {m.split(".")[1] for m in MODULES if m.count(".") >= 1 and (ROOT / m.split(".")[1]).is_dir()} - {
        "models"} == set(LAYERS)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.startswith("fastnli.cli")
                                          and m != "fastnli.__main__"))
def test_nothing_below_the_cli_imports_it(module: str) -> None:
    assert not {m for m in _imports(MODULES[module], False) if m == "fastnli.cli" or m.startswith("fastnli.cli.")}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _layer(m) is not None))
def test_module_level_imports_point_down(module: str) -> None:
    up = {m for m in _imports(MODULES[module], True) if (_layer(m) or 0) > (_layer(module) or 0)}
    assert not up, f"{module} imports a higher layer at module level: {sorted(up)}"


def test_the_run_time_never_imports_the_build_time_at_module_level() -> None:
    for module in (m for m in MODULES if m.startswith("fastnli.engine")):
        assert not {m for m in _imports(MODULES[module], True) if m.startswith("fastnli.exporter")}, module


def test_module_level_imports_have_no_cycle() -> None:
    graph = {m: {i for i in _imports(p, True) if i in MODULES and i != m} for m, p in MODULES.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(stack[stack.index(n):] + [n])}")
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_library_never_prints() -> None:
    """Output goes through ``logging`` (and opt-in rich progress); the CLI writes through its rich console."""
    printing = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                printing.append(f"{module}:{node.lineno}")
    assert not printing, f"builtin print() in the library: {printing}"
