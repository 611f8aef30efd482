"""Activations recomputed in the backward pass instead of kept: `recomputed(fn)`.

Autodiff keeps every array the backward pass reads. For a cheap function of large inputs
(SwiGLU's silu(g) * u: it keeps g, u, sigmoid(g) and silu(g), four [rows, T, ffn] arrays; a
LoRA term's float32 copy of its bf16 input) it is cheaper to keep only the inputs and compute
the rest again when the gradient arrives. `recomputed(fn)` does that: its backward pass is the
vjp of `fn` itself, on the same inputs, so values and gradients are those of `fn`, bit for bit.

Why not `mx.checkpoint`: it makes the recomputation depend on the forward pass's outputs
only, so MLX may schedule it as soon as those exist - in the forward pass - and keep its
results until the backward pass reads them: nothing is saved (CPU, the 0.5B shape's SwiGLU
under `mx.compile`: peak memory unchanged). Here the recomputation's inputs depend on the
output cotangents (`mx.depends`), so it runs only once the backward pass has reached it.

A custom vjp (`mx.custom_function`): `mx.export_function` cannot trace it, so graphs traced
for `mlxio.gpu.kernel_cache.traced_ops` are built without it.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx


def recomputed(fn: Callable[..., mx.array]) -> Callable[..., mx.array]:
    """`fn(*arrays) -> array` whose backward pass recomputes `fn`'s forward pass from its inputs
    (kept) once the output's cotangent exists, rather than keeping `fn`'s intermediates.
    Gradients flow to every argument; arrays `fn` closes over are constants."""

    @mx.custom_function
    def forward(*inputs):
        return fn(*inputs)

    @forward.vjp
    def backward(primals, cotangent, output):
        cotangents = list(cotangent) if isinstance(cotangent, (list, tuple)) else [cotangent]
        waiting = mx.depends(list(primals), cotangents)  # recompute only once the gradient arrives
        _, grads = mx.vjp(lambda *xs: fn(*xs), waiting, cotangents)
        return tuple(grads)

    return forward
