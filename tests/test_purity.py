"""Layering: mlxcore stays pure (no I/O imports), mlxio never reaches up into recipes."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
FORBIDDEN = {"mlxio", "recipes", "transformers", "safetensors", "pathlib", "json", "os",
             "requests", "urllib", "socket", "subprocess", "io", "shutil", "tokenizers", "torch"}
CORE = sorted((ROOT / "mlxcore").rglob("*.py"))  # subpackages too
IO = sorted((ROOT / "mlxio").rglob("*.py"))
# a recipe's module path as a whole string: what `python -m`, importlib or runpy would be given
# ("recipes.batch_probe"); prose that names a command (`python -m recipes.x` in a model card) is
# not an import
RECIPES_STRING = re.compile(r"\s*(-m\s+)?recipes(\.[A-Za-z_]\w*)+\s*")


def imported_modules(module: Path) -> set[str]:
    """Top-level package names `module` imports (absolute imports only)."""
    imported = set()
    for node in ast.walk(ast.parse(module.read_text(), str(module))):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    return imported


@pytest.mark.parametrize("module", CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_mlxcore_module_imports_no_io(module):
    imported = imported_modules(module)
    assert not imported & FORBIDDEN, f"{module.name} imports {sorted(imported & FORBIDDEN)}"


@pytest.mark.parametrize("module", IO, ids=lambda p: str(p.relative_to(ROOT)))
def test_mlxio_never_imports_recipes(module):
    assert "recipes" not in imported_modules(module)
    tree = ast.parse(module.read_text(), str(module))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
               and isinstance(node.value, str) and id(node) not in docstrings]
    by_name = [s for s in strings if RECIPES_STRING.fullmatch(s)]
    assert not by_name, f"{module.relative_to(ROOT)} names recipes in a string: {by_name}"


def test_modules_found():
    assert len(CORE) >= 5 and len(IO) >= 10


def test_recipes_string_pattern():
    assert RECIPES_STRING.fullmatch("recipes.batch_probe") and RECIPES_STRING.fullmatch("-m recipes.xtr_lora")
    assert not RECIPES_STRING.fullmatch("the recipes' configs") and not RECIPES_STRING.fullmatch("mlxio.run")
    assert not RECIPES_STRING.fullmatch("run `python -m recipes.code_search` to search")
