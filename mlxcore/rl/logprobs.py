"""Log-probabilities of chosen tokens from a causal LM's last hidden states, chunk by chunk, so
the [rows, tokens, vocab] logits never exist.

The plain computation (`mlxcore.rl.policy.token_logprobs`) takes logits [N, T, V]: for a 152k
vocabulary and 16 x 384 tokens that is 3.7 GB in float32, kept for the backward pass with its
softmax and gradient. Here the LM head is applied to `chunk` rows of hidden states at a time
([chunk, V] logits in the head's dtype, then the log-softmax's entry for the token, accumulated
in float32: `mx.fast.cross_entropy`) and only the rows that are asked for are scored (the
completion's targets, not the prompt's or padding).

The backward needs no logits either. log p_i depends on hidden row h_i alone, and its gradient
is J_i = head^T (onehot(t_i) - softmax(z_i)) (the entropy's likewise), an [H] vector; each
chunk computes J while its logits are at hand, and the output is logp + sum((h - sg(h)) * J)
(sg: stop_gradient; h - h is exactly 0), whose backward is `cotangent[:, None] * J` - the
fused-linear-cross-entropy idea of Liger-Kernel, applied to per-token log-probs whose
cotangent is not known in the forward pass. (A plain linear surrogate rather than
`mx.custom_function`, so `mx.export_function` traces it too: mlxio.gpu.kernel_cache.) So the head's two matmuls are each done once,
as in plain autodiff, and the extra memory is J itself ([rows, H], the size of the hidden
states). `mx.depends` chains the chunks, so one chunk's [chunk, V] buffers are freed before
the next is computed. Splitting the vocabulary as well (Cut Cross-Entropy's online logsumexp)
would bound memory at [chunk, V / k] at the cost of k times the kernel launches; with [chunk,
V] already small (512 x 152k float32 = 311 MB) it does not pay here.

The head is frozen: arrays it closes over get no gradient (LoRA never targets the LM head).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

Head = Callable[[mx.array], mx.array]  # hidden [..., H] -> logits [..., V]


def _chunk(head: Head, h: mx.array, t: mx.array, entropy: bool, jacobian: bool) -> list[mx.array]:
    """One chunk: [logp [c], (entropy [c]), (J_logp [c, H], (J_entropy [c, H]))]."""
    z = head(h)
    # -log p(t): MLX's fused cross-entropy reads the logits once and accumulates in float32 on a
    # GPU (Metal, CUDA); the CPU's fallback reduces in the logits' dtype, so it gets float32 ones
    on_gpu = mx.default_device().type == mx.DeviceType.gpu
    nll = mx.fast.cross_entropy(z if on_gpu else z.astype(mx.float32), t)
    out = [-nll]
    if not (entropy or jacobian):
        return out
    z32 = z.astype(mx.float32)  # fused into its consumers when the step is compiled
    lse = mx.take_along_axis(z32, t[:, None], axis=-1) + nll[:, None]
    p = mx.exp(z32 - lse)
    if entropy:
        surprise = lse - z32  # -log p >= 0: H = E_p[-log p], a sum of non-negative terms
        ent = (p * surprise).sum(axis=-1, keepdims=True)
        out.append(ent[:, 0])
    if jacobian:
        onehot = mx.arange(z.shape[-1])[None, :] == t[:, None]
        cots = [(onehot - p).astype(z.dtype)]  # d logp / d z
        if entropy:
            cots.append((p * (surprise - ent)).astype(z.dtype))  # d H / d z = -p (z - E_p[z])
        # the head's VJP for every cotangent in one matmul (its forward is never evaluated)
        rows = h.shape[0]
        _, (jac,) = mx.vjp(head, [mx.concatenate([h] * len(cots))], [mx.concatenate(cots)])
        out.extend(jac[i * rows:(i + 1) * rows] for i in range(len(cots)))
    return out


def _chained(head: Head, hidden: mx.array, targets: mx.array, chunk: int, entropy: bool,
             jacobian: bool) -> list[mx.array]:
    """`_chunk` over row chunks, each after the previous one (mx.depends), concatenated."""
    parts, prev = [], None
    for start in range(0, hidden.shape[0], chunk):
        h = hidden[start:start + chunk]
        if prev is not None:
            h = mx.depends(h, prev)
        prev = _chunk(head, h, targets[start:start + chunk], entropy, jacobian)
        parts.append(prev)
    return [mx.concatenate(column) if len(parts) > 1 else column[0] for column in zip(*parts, strict=True)]


def head_logprobs(head: Head, hidden: mx.array, targets: mx.array, *, chunk: int = 512,
                  entropy: bool = False, differentiable: bool = True) -> tuple[mx.array, mx.array | None]:
    """log softmax(head(hidden))[targets] per row, and optionally the softmax's entropy.

    hidden [M, H] (any float dtype; the head's logits are cast to float32 before the
    log-softmax, as in `mlxcore.rl.policy.token_logprobs`); targets [M] integer in [0, V).
    Returns (logp [M] float32, entropy [M] float32 or None). `chunk` rows at a time: at most
    [chunk, V] logits (and their float32 softmax) exist at once. differentiable: gradients
    with respect to `hidden` (each chunk also computes its rows' [H] gradient vectors, see the
    module doc); False for log-probs that no gradient will flow through (one matmul, not two).
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if hidden.ndim != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be [M, H] and targets [M], got {hidden.shape} and {targets.shape}")
    targets = mx.stop_gradient(targets.astype(mx.int32))
    if not differentiable:
        out = _chained(head, mx.stop_gradient(hidden), targets, chunk, entropy, jacobian=False)
        return out[0], (out[1] if entropy else None)
    out = _chained(head, mx.stop_gradient(hidden), targets, chunk, entropy, jacobian=True)
    # value: exactly the computed one (h - h == 0); gradient with respect to hidden: J
    delta = hidden.astype(mx.float32) - mx.stop_gradient(hidden).astype(mx.float32)

    def linked(value, jac):
        return value + (delta * jac.astype(mx.float32)).sum(axis=-1)

    return linked(out[0], out[1 + entropy]), (linked(out[1], out[3]) if entropy else None)


def gathered_logprobs(head: Head, hidden: mx.array, targets: mx.array, mask: mx.array, positions: mx.array, *,
                      chunk: int = 512, entropy: bool = False, differentiable: bool = True
                      ) -> tuple[mx.array, mx.array | None]:
    """`head_logprobs` where `mask` is set, laid out as [N, S] (0 elsewhere).

    hidden [N, S, H] (e.g. the states of tokens[:, :-1]); targets [N, S] (tokens[:, 1:]); mask
    [N, S] (non-zero: score it); positions [P] int: the flat indices n * S + s of the mask's
    non-zeros in order, then padding entries >= N * S (so P can be rounded up to a few sizes:
    `mlxcore.rl.packing.target_positions`). Returns (logp [N, S], entropy [N, S] or None) float32;
    gradients reach `hidden` at the scored positions only. Only axis gathers (and their
    scatter-add gradients) move rows: the kernels the plain computation already uses.
    """
    n, s = targets.shape
    if hidden.shape[:2] != (n, s) or mask.shape != (n, s):
        raise ValueError(f"hidden {hidden.shape} and mask {mask.shape} do not match targets {targets.shape}")
    size, p = n * s, positions.shape[0]
    rows = mx.stop_gradient(mx.minimum(positions.astype(mx.int32), size - 1))  # padding reads a real row
    flat_h = mx.take_along_axis(hidden.reshape(size, hidden.shape[-1]), rows[:, None], axis=0)
    flat_t = mx.stop_gradient(targets.reshape(size).astype(mx.int32))[rows]
    scored = head_logprobs(head, flat_h, flat_t, chunk=chunk, entropy=entropy, differentiable=differentiable)
    # where each of the N * S entries comes from: its rank among the mask's non-zeros, or P (a 0)
    flat_mask = mx.stop_gradient(mask.reshape(size) != 0)
    source = mx.where(flat_mask, mx.cumsum(flat_mask.astype(mx.int32)) - 1, p)

    def place(x):
        return mx.take_along_axis(mx.concatenate([x, mx.zeros((1,), x.dtype)]), source, axis=0).reshape(n, s)

    return place(scored[0]), (place(scored[1]) if entropy else None)
