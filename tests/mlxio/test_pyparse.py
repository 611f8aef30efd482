"""mlxio.pyparse: ast.parse from many threads at once never trips CPython 3.11's AST recursion
counter (python/cpython#106905: `SystemError: AST constructor recursion depth mismatch`, seen
in test_sandbox when two sandbox threads parsed programs at the same time)."""

import ast
from concurrent.futures import ThreadPoolExecutor

import pytest

from mlxio import pyparse


def test_parses_like_ast_from_many_threads():
    nested = "def f(x):\n" + "".join(f"{'    ' * (i + 1)}if x > {i}:\n" for i in range(20)) + "    " * 21 + "return x\n"
    sources = [nested, "check(add)\n", "x = [[[[1]]]]\n"] * 200
    with ThreadPoolExecutor(8) as pool:
        trees = list(pool.map(pyparse.parse, sources))
    assert [ast.dump(t) for t in trees] == [ast.dump(ast.parse(s)) for s in sources]
    with pytest.raises(SyntaxError):
        pyparse.parse("def (:\n")
