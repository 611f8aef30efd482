"""`ast.parse` that is safe to call from several threads at once.

CPython 3.11 keeps the AST constructor's recursion depth in per-interpreter state, so two
threads converting parse trees at the same time can corrupt it and one of them fails with
`SystemError: AST constructor recursion depth mismatch` (python/cpython#106905). The sandbox
and reward code parse candidate programs from thread pools; they parse through `parse`, which
holds one lock while the tree is built (parsing a program takes well under a millisecond).
numpy parses every `.npy` header with `ast.literal_eval`, so code that loads `.npy` files
from threads (the search index's readers) holds the same lock: `exclusive()`.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def exclusive() -> threading.Lock:
    """The lock every `ast` use of this process takes (a context manager): for code that
    parses through a library, e.g. `np.load` reading a header."""
    return _LOCK


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse(source, filename) under a process-wide lock; raises what ast.parse raises."""
    with _LOCK:
        return ast.parse(source, filename=filename)
