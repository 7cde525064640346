"""The package's shape: no import loops between flowrl's modules, a small root, no oversized module.

Every module of ``flowrl/`` is read with :mod:`ast` (nothing is imported), and every import
counts: at module level, inside functions and under ``TYPE_CHECKING``. A name imported from a
package (``from flowrl.actors import WorkerSet``) counts as an import of the module the package
takes it from, as its ``__init__`` declares (a ``TYPE_CHECKING`` import or a
``deferred_attributes`` table), since that is the module the name's code lives in. The layers
themselves are checked by import-linter (``lint-imports``, contracts in ``setup.cfg``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "flowrl"
MAX_ROOT_MODULES = 8
MAX_MODULE_LINES = 500
# The modules DESIGN.md lets grow past MAX_MODULE_LINES, each for its reason: one on-disk protocol whose
# invariants read together, a key table, one public fault-injection env, two cohesive classes.
LONG_MODULES = {
    "storage/checkpoints.py",
    "config/rllib.py",
    "envs/testing.py",
    "actors/worker_set.py",
    "data/replay_buffer.py",
}


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under ``root`` (a package's name for its ``__init__``)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(tree: ast.Module, name: str, is_package: bool) -> Iterator[tuple[str, str | None]]:
    """``(module, imported name or None)`` for every import statement anywhere in the module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")
                parts = parts if is_package else parts[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                yield base, alias.name


def _reexports(tree: ast.Module) -> dict[str, str]:
    """Name -> module for what a package's ``__init__`` takes from its modules."""
    table: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                table[alias.asname or alias.name] = node.module
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "deferred_attributes":
            for arg in node.args:
                if isinstance(arg, ast.Dict):
                    for key, value in zip(arg.keys, arg.values):
                        if isinstance(key, ast.Constant) and isinstance(value, (ast.List, ast.Tuple)):
                            for element in value.elts:
                                if isinstance(element, ast.Constant):
                                    table[element.value] = key.value
    return table


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the flowrl modules it imports."""
    modules = module_names(root)
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in modules.items()}
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    reexports = {name: _reexports(trees[name]) for name in packages}

    def target(module: str, imported: str | None, seen: frozenset[str] = frozenset()) -> str | None:
        if imported is not None and f"{module}.{imported}" in modules:
            return f"{module}.{imported}"
        if imported is not None and module in packages and module not in seen:
            source = reexports[module].get(imported)
            if source is not None and source != module:
                return target(source, imported, seen | {module}) or source
        while module and module not in modules:
            module = module.rpartition(".")[0]
        return module or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, tree in trees.items():
        for module, imported in _imports(tree, name, name in packages):
            if module == "flowrl" or module.startswith("flowrl."):
                found = target(module, imported)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_through_others() -> None:
    loops = cycles(import_graph())
    assert loops == [], "import loops (each a group of modules that import each other):\n" + "\n".join(
        " <-> ".join(loop) for loop in loops
    )


def test_the_root_holds_at_most_eight_modules() -> None:
    root_modules = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root_modules) <= MAX_ROOT_MODULES, root_modules


def test_no_module_is_longer_than_500_lines_but_those_design_lists() -> None:
    lengths = {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    too_long = {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES and name not in LONG_MODULES}
    assert too_long == {}, f"modules over {MAX_MODULE_LINES} lines: split them along their seams"


def test_a_loop_is_found_through_a_function_level_and_a_type_checking_import(tmp_path: Path) -> None:
    package = tmp_path / "flowrl"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from flowrl.sub.b import B\n"
    )
    (package / "sub" / "a.py").write_text("def f():\n    from flowrl.sub import B\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from flowrl.sub.a import f\nB = 1\n"
    )
    (package / "c.py").write_text("from . import d\n")
    (package / "d.py").write_text("X = 1\n")
    graph = import_graph(package)
    assert graph["flowrl.sub.a"] == {"flowrl.sub.b"}  # through the package's re-export, to where B lives
    assert graph["flowrl.c"] == {"flowrl.d"}
    assert cycles(graph) == [["flowrl.sub.a", "flowrl.sub.b"]]
