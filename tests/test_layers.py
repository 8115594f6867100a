"""The package layers (DESIGN.md section 3): ``samplers/`` imports only torch, itself and a
few standard-library modules;
``pipelines/`` and ``reward_models/`` never import ``genrl``, not even lazily inside a function;
and no module-level import cycle exists anywhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("genrl", "samplers", "pipelines", "reward_models")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imports(path: Path, module_level_only: bool) -> set[str]:
    """Absolute names imported by ``path``: ``from a.b import c`` counts as ``a.b.c`` when that
    is a module, else ``a.b``; imports under ``if TYPE_CHECKING:`` do not run and are skipped."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes: list[ast.AST] = []
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        nodes.append(node)
        if module_level_only:
            if isinstance(node, ast.If | ast.Try):
                stack.extend(ast.iter_child_nodes(node))
        else:
            stack.extend(ast.iter_child_nodes(node))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.add(full if full in MODULES else node.module)
    return names


@pytest.mark.parametrize("layer", ["samplers", "pipelines", "reward_models"])
def test_lower_layers_never_import_genrl(layer: str) -> None:
    offenders = {
        name: sorted(i for i in _imports(path, False) if i.split(".")[0] == "genrl")
        for name, path in MODULES.items()
        if name.split(".")[0] == layer
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"{layer} must not import genrl: {offenders}"


def test_samplers_import_only_torch_and_themselves() -> None:
    allowed_roots = {"torch", "samplers", "math", "dataclasses", "typing", "abc", "collections"}
    allowed_roots |= {"__future__", "functools", "itertools"}
    offenders = {
        name: sorted(i for i in _imports(path, False) if i.split(".")[0] not in allowed_roots)
        for name, path in MODULES.items()
        if name.split(".")[0] == "samplers"
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"samplers are pure tensor math: {offenders}"


def test_no_module_level_import_cycle() -> None:
    graph = {
        name: {i for i in _imports(path, True) if i in MODULES and i != name}
        for name, path in MODULES.items()
    }
    # A package's __init__ importing its own submodules is how packages are built.
    for name in graph:
        graph[name] = {i for i in graph[name] if not name.startswith(i + ".")}
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt, [*path, nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_the_cycle_finder_finds_cycles() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
