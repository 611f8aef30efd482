"""`ast.parse` that is safe to call from several threads at once.

CPython 3.11 keeps the AST constructor's recursion depth in per-interpreter state, so two
threads converting parse trees at the same time can corrupt it and one of them fails with
`SystemError: AST constructor recursion depth mismatch` (python/cpython#106905). The sandbox
and reward code parse candidate programs from thread pools; they parse through `parse`, which
holds one lock while the tree is built (parsing a program takes well under a millisecond).
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse(source, filename) under a process-wide lock; raises what ast.parse raises."""
    with _LOCK:
        return ast.parse(source, filename=filename)
