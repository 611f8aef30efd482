"""Range declarations next to config fields (pure: attrs metadata only, checked in mlxio).

    lr: float = bounded(1e-4, gt=0)
    dropout: float = bounded(0.0, ge=0, lt=1)
    compute_dtype: str = bounded("float32", choices=("float32", "bfloat16", "float16"))

`mlxio.run.checks.check` reads `metadata["check"]` of every field (a tuple of numbers: each
item). Every numeric option of the recipes declares both ends of its range
(tests/mlxio/run/test_config_fuzz.py checks that); the defaults there (numbers finite and >= 0,
integers below 2**31) are a backstop. Strings and tuple items are non-empty where the tuple is,
with no NUL or lone surrogate in any string.
"""

from __future__ import annotations

from typing import Any

import attrs

# upper ends shared by many options
MAX_STEPS = 10_000_000  # optimizer steps and step cadences: ~4 months at one step a second
MAX_SEED = 2**31 - 1  # seeds: NumPy takes < 2**32, MLX counts in int32
MAX_NEW_TOKENS = 1 << 16  # tokens generated per completion: the KV cache grows with them


def bounded(default: Any, *, gt: float | None = None, ge: float | None = None, lt: float | None = None,
            le: float | None = None, choices: tuple | None = None, nonempty: bool | None = None,
            negative_ok: bool = False, validator: Any = None) -> Any:
    """An attrs field whose allowed values are declared in its metadata."""
    check = {k: v for k, v in (("gt", gt), ("ge", ge), ("lt", lt), ("le", le), ("choices", choices),
                               ("nonempty", nonempty)) if v is not None}
    if negative_ok:
        check["negative_ok"] = True
    return attrs.field(default=default, metadata={"check": check}, validator=validator)
