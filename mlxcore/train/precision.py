"""Mixed precision as tree operations: the frozen base in a compute dtype, trainable leaves in
float32.

bf16 mixed precision here means: the frozen base weights are stored and computed in bfloat16
(half the memory, half the bandwidth), the LoRA parameters and the optimizer state stay float32
(`lora.delta` casts A and B to the activations' dtype on the way in, so their gradients come
back float32), and MaxSim's per-token maxima are cast to float32 before their mean and the
loss (`mlxcore.retrieval.late_interaction.maxsim`), whose temperature magnifies rounding; the similarities
themselves are computed in bfloat16, as PyTorch autocast does.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from mlxcore.train.tree import Tree, combine, flatten, partition, unflatten

COMPUTE_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def cast_frozen(params: Tree, trainable: Callable, dtype_name: str) -> Tree:
    """Floating leaves that `trainable(path)` rejects cast to the compute dtype; the trainable
    leaves (LoRA, projection) keep their float32 master copy. Same tree structure."""
    if dtype_name not in COMPUTE_DTYPES:
        raise ValueError(f"compute dtype {dtype_name!r}: expected one of {sorted(COMPUTE_DTYPES)}")
    dtype = COMPUTE_DTYPES[dtype_name]
    return unflatten({p: (v.astype(dtype) if not trainable(p) and mx.issubdtype(v.dtype, mx.floating) else v)
                      for p, v in flatten(params).items()})


def restore_frozen(params: Tree, float_params: Tree, trainable: Callable) -> Tree:
    """The trained leaves of `params` over the float32 frozen leaves of `float_params` (undoes
    `cast_frozen` for evaluation and export)."""
    return combine(partition(float_params, lambda p, _: not trainable(p))[0], partition(params, trainable)[0])
