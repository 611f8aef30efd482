"""A cached contrastive loss (GradCache: Gao, Zhang, Han and Callan 2021, "Scaling Deep
Contrastive Learning Batch Size under Memory Limited Setup"): one contrastive batch of k x m
pairs - every query scored against all k x m documents - in the memory of one m-pair chunk.

A contrastive loss does not split into a sum over chunks (each query's negatives are every
document of the batch), so gradient accumulation cannot give it a larger batch. It does split at
the embeddings: with E = [embed(chunk_1); ...; embed(chunk_k)],

    dL/dparams = sum_j  J_j^T  (dL/dE)[rows of chunk j],       J_j = d embed(chunk_j) / d params

so (1) embed every chunk with no graph kept (activations freed chunk by chunk), (2) the loss and
its gradient with respect to E only (a few MB: [k x m, T, D]), (3) for each chunk again, the
encoder's vector-Jacobian product with its rows of dL/dE, summed. Peak memory: one chunk's
activations + E and its gradient; cost: one extra forward per chunk (step times: dev/LOG.md).

`cached_value_and_grad(embed, loss_on)` -> `fn(train, frozen, batch, keys) -> (loss, aux,
grads)`, batch leaves [k, m, ...] as `mlxcore.train.step.accumulate` takes them; embed / loss_on
as `mlxcore.retrieval.objective.contrastive_parts` gives them (the loss of the concatenated batch is
`loss_on(embed(...), batch)`). Each chunk's arrays are evaluated before the next starts, so
this runs outside `mx.compile`; its three pieces are compiled when `jit`.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from mlxcore.train.tree import Tree, combine, map_leaves

# embed(params, chunk, key) -> tuple of [m, ...] arrays; loss_on(embeddings, batch) -> (loss, aux)
EmbedFn = Callable[[Tree, Tree, mx.array], tuple[mx.array, ...]]
LossOnFn = Callable[[tuple[mx.array, ...], Tree], tuple[mx.array, dict[str, mx.array]]]


def flat_batch(batch: Tree) -> Tree:
    """Leaves [k, m, ...] -> [k * m, ...]: the k chunks as one batch, chunk by chunk."""
    return map_leaves(lambda x: x.reshape(-1, *x.shape[2:]), batch)


def cached_value_and_grad(embed: EmbedFn, loss_on: LossOnFn, jit: bool = True):
    """fn(train, frozen, batch, keys) -> (loss, aux, grads w.r.t. `train`) of
    `loss_on(concat_j embed(combine(train, frozen), chunk_j, keys[j]), flat_batch(batch))`.

    batch: leaves [k, m, ...] (chunk j = leaf[j]); keys [k, 2]: chunk j's PRNG key, the same in
    both of its forward passes (LoRA dropout draws the same masks). Equal to the plain
    `mx.value_and_grad` of that loss up to float rounding (tests/test_grad_cache.py)."""

    def embed_of(train: Tree, frozen: Tree, chunk: Tree, key: mx.array):
        return embed(combine(train, frozen), chunk, key)

    def surrogate(train: Tree, frozen: Tree, chunk: Tree, key: mx.array, cotangents: tuple[mx.array, ...]):
        # d/dtrain of sum(E_j * dL/dE_j) = J_j^T dL/dE_j (the cotangents are constants here)
        out = embed_of(train, frozen, chunk, key)
        return sum((e * c).sum() for e, c in zip(out, cotangents, strict=True))

    def loss_of(embeddings: tuple[mx.array, ...], batch: Tree):
        return loss_on(embeddings, batch)

    embed_fn = embed_of
    loss_grad = mx.value_and_grad(loss_of)  # w.r.t. the embeddings (argument 0)
    chunk_grad = mx.grad(surrogate)
    if jit:
        embed_fn, loss_grad, chunk_grad = mx.compile(embed_fn), mx.compile(loss_grad), mx.compile(chunk_grad)

    def value_and_grad(train: Tree, frozen: Tree, batch: Tree, keys: mx.array):
        k = keys.shape[0]
        chunks = [map_leaves(lambda x, j=j: x[j], batch) for j in range(k)]
        parts = []
        for j in range(k):  # (1) no graph kept: each chunk's activations freed once evaluated
            out = tuple(mx.stop_gradient(e) for e in embed_fn(train, frozen, chunks[j], keys[j]))
            mx.eval(out)
            parts.append(out)
        embeddings = tuple(mx.concatenate([p[i] for p in parts]) for i in range(len(parts[0])))
        (loss, aux), cotangents = loss_grad(embeddings, flat_batch(batch))  # (2)
        mx.eval(loss, aux, cotangents)
        grads = None
        for j in range(k):  # (3) the encoder's backward, chunk by chunk
            rows = [c.reshape(k, -1, *c.shape[1:])[j] for c in cotangents]
            g = chunk_grad(train, frozen, chunks[j], keys[j], tuple(rows))
            grads = g if grads is None else map_leaves(mx.add, grads, g)
            mx.eval(grads)
        return loss, aux, grads

    return value_and_grad
