"""Every entry point sets the process up before it imports MLX (`mlxio.runtime.setup()`).

MLX's CPU BLAS is bound when `mlx.core` is first imported, so `setup()` has a deadline:
each program (a recipe, benchmark, lab script or child process run with `python -m` or as a
file) calls it in `if __name__ == "__main__": setup()` above every import that could load MLX
- after `from __future__`, the standard library and `from mlxio.runtime import setup` only -
and pytest does in tests/conftest.py. Importing a module as a library runs nothing."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("recipes", "benchmarks", "dev", "mlxio", "tests/dist")
# run with `python -I -S -c <its source>` inside the sandbox: the untrusted code's process, which
# imports nothing of the project
NOT_MLX = {"mlxio/sandbox/child.py"}


def is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ('__name__ == "__main__"', "__name__ == '__main__'")


def entry_points() -> list[Path]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            if path.name == "__main__.py" or any(is_main_guard(n) for n in tree.body):
                found.append(path)
    return [p for p in found if str(p.relative_to(ROOT)) not in NOT_MLX]


ENTRY_POINTS = entry_points()


def imports_mlx_free(node: ast.stmt) -> bool:
    """An import that cannot load MLX: __future__, the standard library, mlxio.runtime."""
    if isinstance(node, ast.ImportFrom):
        names = [node.module or ""]
    else:
        names = [alias.name for alias in node.names]
    return all(n == "__future__" or n == "mlxio.runtime" or n.split(".")[0] in sys.stdlib_module_names
               for n in names)


def calls_setup(node: ast.stmt) -> bool:
    return (is_main_guard(node) and len(node.body) == 1 and isinstance(node.body[0], ast.Expr)
            and ast.unparse(node.body[0].value) == "setup()")


@pytest.mark.parametrize("path", ENTRY_POINTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_entry_point_sets_up_before_importing(path):
    body = ast.parse(path.read_text(), str(path)).body
    guard = next((i for i, n in enumerate(body) if calls_setup(n)), None)
    assert guard is not None, f"{path.name}: no `if __name__ == \"__main__\": setup()` at module level"
    assert any(isinstance(n, ast.ImportFrom) and n.module == "mlxio.runtime"
               and [a.name for a in n.names] == ["setup"] for n in body[:guard]), \
        f"{path.name}: `setup` is not mlxio.runtime's"
    early = [ast.unparse(n) for n in body[:guard]
             if isinstance(n, (ast.Import, ast.ImportFrom)) and not imports_mlx_free(n)]
    assert not early, f"{path.name}: imported before setup(): {early}"


def test_conftest_sets_up_first():
    body = ast.parse((ROOT / "tests" / "conftest.py").read_text()).body
    call = next(i for i, n in enumerate(body) if isinstance(n, ast.Expr) and ast.unparse(n.value) == "setup()")
    assert all(imports_mlx_free(n) or ast.unparse(n).startswith(("import pytest", "from hypothesis"))
               for n in body[:call] if isinstance(n, (ast.Import, ast.ImportFrom)))


def test_the_check_sees_the_entry_points():
    names = {str(p.relative_to(ROOT)) for p in ENTRY_POINTS}
    assert {"recipes/xtr_lora.py", "recipes/rlaif_qwen.py", "recipes/rlaif_worker.py", "mlxio/run/batch_probe.py",
            "mlxio/gpu/kernel_warm.py", "mlxio/gpu/cuda_ext/__main__.py", "benchmarks/encode.py", "dev/sweep.py",
            "tests/dist/collectives.py"} <= names
    assert not {"mlxio/runtime.py", "recipes/rlaif_config.py", "recipes/xtr_lora_config.py"} & names
