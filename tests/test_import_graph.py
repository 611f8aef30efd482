"""The import graph of the project's packages: layered and acyclic.

Layers, lowest first: mlxcore (pure functions) < mlxio (I/O) < recipes (one file per job) <
benchmarks (peer comparisons) < dev (studies). A module imports only from its own layer or
below (the product never reaches into the lab; tests/test_purity.py also keeps mlxcore free of
I/O libraries). And no import cycle between modules, counting every import statement, those
inside functions too (a deferred import still couples the two modules), except those under
`if TYPE_CHECKING:` (annotations only: never executed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("mlxcore", "mlxio", "recipes", "benchmarks", "dev")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))}


def resolve(name: str) -> str | None:
    """The project module that `import name` loads last (a submodule, else its package)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` / `if typing.TYPE_CHECKING:`."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return ids


def imports_of(module: str, runtime: bool = False) -> set[str]:
    """Project modules `module` imports (absolute and relative, at any depth of the file;
    `runtime`: not those only under `if TYPE_CHECKING:`)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    skip = type_checking_only(tree) if runtime else set()
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            names = [f"{base}.{alias.name}" if resolve(f"{base}.{alias.name}") == f"{base}.{alias.name}"
                     else base for alias in node.names]
        found |= {m for m in map(resolve, names) if m and m != module}
    return found


GRAPH = {m: imports_of(m) for m in MODULES}
RUNTIME = {m: imports_of(m, runtime=True) for m in MODULES}


def layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_from_a_higher_layer(module):
    upward = sorted(m for m in GRAPH[module] if layer(m) > layer(module))
    assert not upward, f"{module} ({LAYERS[layer(module)]}) imports from a higher layer: {upward}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert cycles(RUNTIME) == []


def test_the_checks_see_what_they_should():
    assert len(MODULES) > 100 and "mlxio.run.reporting" in GRAPH["recipes.xtr_lora"]
    assert "mlxcore.train.tree" in GRAPH["mlxio.run.loop"]  # `from mlxcore.train.tree import Tree`
    typed = ast.parse("if TYPE_CHECKING:\n    import a\nimport b\n")
    assert len(type_checking_only(typed)) == 2  # `import a` and its alias, not `import b`
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
