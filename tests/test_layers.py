"""The package layers (docs/architecture.md, section 1).

Every module of the six packages is parsed with ``ast``; an import is any ``import`` statement at
any depth (module level, inside a function, under ``if TYPE_CHECKING:``), a relative import, an
``importlib.import_module("...")`` call with a literal name, and a registry entry
``"module:Name"`` naming one of the project's modules (the registries import those on first
use). Over that graph:

- no module imports itself back through any chain of imports;
- no package does either: a module belongs to its folder, and a package's ``__init__`` (its
  face, which builds registries from the folder's modules) counts on its own;
- every import between layers is an arrow of ``LAYERS``;
- ``samplers/`` imports only torch, itself and a few standard-library modules (``importlib`` for
  its lazy face).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("genrl", "samplers", "loading", "tasks", "pipelines", "reward_models")

# Which layers each layer may import. A module's layer is its top-level package, except in
# genrl/, where it is the subpackage (``genrl.loop``) or the entry module (``genrl.api``).
LAYERS: dict[str, set[str]] = {
    "samplers": set(),
    "loading": set(),
    "tasks": {"loading"},
    "pipelines": {"samplers", "loading", "tasks"},
    "reward_models": {"samplers", "loading", "tasks"},
    "genrl.config": set(),
    "genrl.data": {"samplers"},
    "genrl.distributed": set(),
    # pipelines only for the conformance checks that mypy runs (never executed)
    "genrl.policies": {"genrl.config", "samplers", "pipelines"},
    "genrl.prompts": {"genrl.config", "genrl.data", "loading", "tasks"},
    "genrl.objectives": {"genrl.config", "genrl.data", "genrl.policies", "samplers"},
    "genrl.rollouts": {
        "genrl.config",
        "genrl.data",
        "genrl.policies",
        "genrl.objectives",
        "samplers",
    },
    "genrl.algorithms": {"genrl.config", "genrl.policies", "genrl.rollouts", "genrl.objectives"},
    "genrl.allocation": {"genrl.config", "genrl.data", "genrl.algorithms", "tasks"},
    "genrl.reporting": {
        "genrl.config",
        "genrl.data",
        "genrl.distributed",
        "genrl.prompts",
        "genrl.rollouts",
        "tasks",
    },
    "genrl.run": {
        "genrl.config",
        "genrl.data",
        "genrl.distributed",
        "genrl.policies",
        "genrl.prompts",
        "genrl.objectives",
        "genrl.rollouts",
        "genrl.algorithms",
        "genrl.allocation",
        "genrl.reporting",
        "loading",
        "pipelines",
        "reward_models",
    },
    "genrl.checkpoints": {"genrl.config", "genrl.data", "genrl.distributed", "genrl.run"},
    "genrl.loop": {
        "genrl.config",
        "genrl.data",
        "genrl.distributed",
        "genrl.policies",
        "genrl.prompts",
        "genrl.objectives",
        "genrl.rollouts",
        "genrl.allocation",
        "genrl.reporting",
        "genrl.run",
        "genrl.checkpoints",
        "genrl.planning",
        "tasks",
    },
    "genrl.recipes": {"genrl.config", "genrl.algorithms", "genrl.run", "tasks"},
    # builds real-size models from config files with diffusers / transformers directly
    "genrl.planning": {"genrl.config"},
}
ENTRIES = {"genrl", "genrl.api", "genrl.cli"}  # the face and the entry points may import any layer
REGISTRY_ENTRY = re.compile(r"^([A-Za-z_][\w.]*):[A-Za-z_]\w*$")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module ``name`` refers to (the longest known prefix), or None."""
    parts = name.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts = parts[:-1]
    return ".".join(parts) if parts else None


def imports(module: str) -> set[str]:
    """Project modules that ``module`` imports, by any of the means in this file's docstring;
    ``from a.b import c`` counts as ``a.b.c`` when that is a module, else ``a.b``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                names.add(full if full in MODULES else base)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant):
                names.add(str(node.args[0].value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = REGISTRY_ENTRY.match(node.value)
            if match and match.group(1) in MODULES:
                names.add(match.group(1))
    resolved = {_resolve(name) for name in names}
    return {name for name in resolved if name is not None and name != module}


GRAPH = {module: imports(module) for module in MODULES}


def layer(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "genrl" else parts[0]


def unit(module: str) -> str:
    """A module's folder; a package's ``__init__`` is a unit of its own."""
    if MODULES[module].name == "__init__.py":
        return f"{module}.__init__"
    return module.rpartition(".")[0]


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
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


def test_no_import_cycle_between_modules() -> None:
    cycle = _find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycle_between_packages() -> None:
    units: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        here = unit(module)
        units.setdefault(here, set()).update(unit(t) for t in targets if unit(t) != here)
    cycle = _find_cycle(units)
    assert cycle is None, "package cycle: " + " -> ".join(cycle or [])


def test_every_import_between_layers_is_allowed() -> None:
    offenders = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if layer(module) not in ENTRIES
        and layer(target) != layer(module)
        and layer(target) not in LAYERS[layer(module)]
    )
    assert not offenders, "imports the layer table forbids:\n" + "\n".join(offenders)


def test_every_layer_is_in_the_table() -> None:
    missing = {layer(m) for m in MODULES} - set(LAYERS) - ENTRIES
    assert not missing, f"layers missing from LAYERS (and docs/architecture.md): {missing}"
    assert all(allowed <= set(LAYERS) for allowed in LAYERS.values())


def test_genrl_holds_only_its_face_and_entry_modules() -> None:
    top = sorted(p.name for p in (ROOT / "genrl").glob("*.py"))
    assert top == ["__init__.py", "api.py"], top


@pytest.mark.parametrize("package", ["samplers", "loading", "tasks", "pipelines", "reward_models"])
def test_lower_layers_never_import_genrl(package: str) -> None:
    offenders = {m: sorted(t for t in GRAPH[m] if layer(t).startswith("genrl")) for m in MODULES}
    offenders = {m: t for m, t in offenders.items() if t and layer(m) == package}
    assert not offenders, f"{package} must not import genrl: {offenders}"


def test_samplers_import_only_torch_and_themselves() -> None:
    allowed_roots = {"torch", "samplers", "math", "dataclasses", "typing", "abc", "collections"}
    # importlib: the package face imports the samplers on first use, so that the catalog
    # (samplers/catalog.py) is read without torch.
    allowed_roots |= {"__future__", "functools", "itertools", "importlib"}
    offenders = {}
    for module, path in MODULES.items():
        if layer(module) != "samplers":
            continue
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
        bad = sorted(n for n in names if n.split(".")[0] not in allowed_roots)
        if bad:
            offenders[module] = bad
    assert not offenders, f"samplers are pure tensor math: {offenders}"


def test_the_checks_see_every_kind_of_import(tmp_path: Path) -> None:
    """The graph is built from function-level, type-only and registry imports too, and the cycle
    finder finds a cycle of three."""
    assert "genrl.run.config" in GRAPH["genrl.run.config_file"]  # inside a function
    assert "genrl.loop.trainer" in GRAPH["genrl"]  # under TYPE_CHECKING
    assert (
        "pipelines.diffusers.sd3" in GRAPH["pipelines.diffusers.flow_families"]
    )  # a registry string
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
