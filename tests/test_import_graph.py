"""The import graph of the project's packages: layered and acyclic.

Layers, lowest first: mlxcore (pure functions) < mlxio (I/O) < recipes (one file per job) <
benchmarks (peer comparisons) < dev (studies). A module imports only from its own layer or
below (the product never reaches into the lab; tests/test_purity.py also keeps mlxcore free of
I/O libraries). And no import cycle between modules, counting every import statement, those
inside functions too (a deferred import still couples the two modules), except those under
`if TYPE_CHECKING:` (annotations only: never executed). And what benchmarks and dev studies take
from recipes/ is a recipe's public surface (docs/architecture.md): its entry (`main`, `run`; the
worker's `make_worker`, the server its `main` serves), its config module's `Config` and `PRESETS`,
and `recipes.presets`; nothing else (mlxio and mlxcore import nothing of recipes at all: the
layer check above)."""

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


ENTRY_NAMES = {"main", "run"}  # a recipe's entry, called in process
WORKER_ENTRY = {"recipes.rlaif_worker": {"make_worker"}}  # the worker server its `main` serves
CONFIG_NAMES = {"Config", "PRESETS"}  # a config module's (LEGACY_KEYS is Config's), PRESETS: the presets as Configs


def recipe_uses(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of everything `source` takes from recipes/: each name imported from a
    recipes module, each attribute read off a recipes module it imported (`rq.run`), and a recipes
    module used bare (passed around, `getattr`-ed), reported as the module itself."""
    tree = ast.parse(source)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    bound, uses = {}, []  # bound: a name in the file -> the recipes module it holds
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "recipes":
                    bound[alias.asname or "recipes"] = alias.name if alias.asname else "recipes"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "recipes":
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                if name in MODULES:
                    bound[alias.asname or alias.name] = name
                else:
                    uses.append((node.lineno, name))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id in bound):
            continue
        held, at = bound[node.id], node
        while isinstance(parent := parents.get(id(at)), ast.Attribute) and parent.value is at:
            held, at = f"{held}.{parent.attr}", parent
            if held not in MODULES:
                break
        uses.append((node.lineno, held))
    return sorted(uses)


def on_the_surface(name: str) -> bool:
    """Whether a benchmark or dev study may use `name` (`recipes.<module>.<name>`, or a module)."""
    if name == "recipes.presets" or name.startswith("recipes.presets."):
        return True
    module, _, attr = name.rpartition(".")
    if name in MODULES or module not in MODULES:  # a module used bare, or a name from no recipes module
        return False
    if module.endswith("_config"):
        return attr in CONFIG_NAMES
    return attr in ENTRY_NAMES | WORKER_ENTRY.get(module, set())


def test_benchmarks_and_dev_take_only_a_recipes_public_surface():
    found = [f"{path.relative_to(ROOT)}:{line}: {name}" for layer in ("benchmarks", "dev")
             for path in sorted((ROOT / layer).rglob("*.py"))
             for line, name in recipe_uses(path.read_text()) if not on_the_surface(name)]
    assert not found, "benchmarks/dev use recipes/ beyond an entry, Config, PRESETS or recipes.presets:\n" \
        + "\n".join(found)


def test_the_checks_see_what_they_should():
    assert len(MODULES) > 100 and "mlxio.run.reporting" in GRAPH["recipes.xtr_lora"]
    assert "mlxcore.train.tree" in GRAPH["mlxio.run.loop"]  # `from mlxcore.train.tree import Tree`
    typed = ast.parse("if TYPE_CHECKING:\n    import a\nimport b\n")
    assert len(type_checking_only(typed)) == 2  # `import a` and its alias, not `import b`
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = ("from recipes import rlaif_qwen as rq, presets\nimport recipes.xtr_lora\n"
              "from recipes.rlaif_config import PRESETS, loss_fn\nrq.run(PRESETS['smoke'])\nrq.load_problems()\n"
              "recipes.xtr_lora.main([])\ngetattr(rq, 'x')\npresets.load('x', None)\n")
    uses = recipe_uses(source)
    assert uses == [(3, "recipes.rlaif_config.PRESETS"), (3, "recipes.rlaif_config.loss_fn"),
                    (4, "recipes.rlaif_qwen.run"), (5, "recipes.rlaif_qwen.load_problems"),
                    (6, "recipes.xtr_lora.main"), (7, "recipes.rlaif_qwen"), (8, "recipes.presets.load")]
    assert [name for _, name in uses if not on_the_surface(name)] == [
        "recipes.rlaif_config.loss_fn", "recipes.rlaif_qwen.load_problems", "recipes.rlaif_qwen"]
