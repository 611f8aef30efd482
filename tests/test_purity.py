"""mlxcore stays pure: no module in it imports I/O."""

import ast
from pathlib import Path

import pytest

FORBIDDEN = {"mlxio", "recipes", "transformers", "safetensors", "pathlib", "json", "os",
             "requests", "urllib", "socket", "subprocess", "io", "shutil", "tokenizers", "torch"}
CORE = sorted((Path(__file__).parent.parent / "mlxcore").glob("*.py"))


@pytest.mark.parametrize("module", CORE, ids=lambda p: p.name)
def test_mlxcore_module_imports_no_io(module):
    imported = set()
    for node in ast.walk(ast.parse(module.read_text(), str(module))):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN, f"{module.name} imports {sorted(imported & FORBIDDEN)}"


def test_core_modules_found():
    assert len(CORE) >= 5
