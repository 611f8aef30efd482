"""Embed texts with a multi-vector encoder (token or mean-pooled vectors) and score them by MaxSim.

Texts are tokenised once, sorted by length and embedded in batches padded to a bucket, so a
handful of compiled shapes serve the whole corpus and padding costs little. Ranking and fusion
of the scores are pure (`mlxcore.retrieval.ranking`); the search index's own streaming embedder is
`mlxio.search.embed`. Used by the xtr_lora recipe's evaluation and its data (pooled vectors).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import mlx.core as mx
import numpy as np

from mlxcore.retrieval import late_interaction
from mlxcore.retrieval.encoder import EncoderSpec, hidden_states, token_embeddings
from mlxio.data.token_cache import hf_tokenize, length_sorted_batches
from mlxio.gpu import kernel_cache


@attrs.frozen
class Embedded:
    """Token embeddings of n texts in length-sorted blocks: (row indices [b], emb [b, T, D],
    mask [b, T]) per block; rows index the original text order."""

    blocks: list[tuple[np.ndarray, mx.array, mx.array]]
    n: int


def _mean_pooled(params: dict, ids: mx.array, mask: mx.array, spec: EncoderSpec) -> mx.array:
    """sentence-transformers' Pooling(mean) + Normalize over the encoder's hidden states."""
    h = hidden_states(params, ids, mask, spec)
    m = mask.astype(h.dtype)[..., None]
    return late_interaction.l2_normalize((h * m).sum(1) / mx.maximum(m.sum(1), 1.0))


def embed_pooled(params: dict, spec: EncoderSpec, tokenizer, texts: Sequence[str], max_length: int,
                 batch_size: int = 64, bucket: int = 16, desc: str = "embedding") -> np.ndarray:
    """Single-vector embeddings [n, d_model] (unit norm) of `texts`: the mean of the hidden
    states over real tokens, as a sentence-transformers model with mean pooling computes them."""
    out = None
    for rows, emb, _ in embed_texts(params, spec, tokenizer, texts, max_length, batch_size, bucket,
                                    desc, encode_fn=_mean_pooled).blocks:
        out = np.zeros((len(texts), emb.shape[-1]), np.float32) if out is None else out
        out[rows] = np.array(emb)
    return out


def _maybe_compile(fn, compiled: bool | None):
    """`fn` under `mx.compile` when `kernel_cache.use_compile(compiled)` says so, else `fn`."""
    return mx.compile(fn) if kernel_cache.use_compile(compiled) else fn


def embed_texts(params: dict, spec: EncoderSpec, tokenizer, texts: Sequence[str], max_length: int,
                batch_size: int = 64, bucket: int = 16, desc: str = "embedding",
                encode_fn=None, compiled: bool | None = None) -> Embedded:
    """Unit-norm token embeddings of `texts`, computed in length-sorted, bucket-padded batches
    (progress shown as `desc`: a bar on a terminal, periodic log lines otherwise).
    compiled: `mx.compile` the forward; None (auto, `kernel_cache.use_compile`): everywhere but
    on a CUDA device, where each fused kernel costs NVRTC seconds on a fresh machine."""
    from mlxio.run.reporting import progress

    token_ids = hf_tokenize(tokenizer)(list(texts), max_length)
    encode_fn = encode_fn or token_embeddings
    encode = _maybe_compile(lambda p, ids, mask: encode_fn(p, ids, mask, spec), compiled)
    blocks = []
    batches = length_sorted_batches(token_ids, batch_size, bucket)
    # the last, partial batch is padded to batch_size rows (one token each, sliced off after), so
    # it runs a shape the full batches already compiled (on a GPU: no new kernels for it)
    full = batch_size if len(token_ids) > batch_size else len(token_ids)
    for rows, ids, mask in progress(batches, total=-(-len(token_ids) // batch_size), desc=desc, unit="batch",
                                    every_s=15.0):
        if len(rows) < full:
            extra = full - len(rows)
            ids = np.concatenate([ids, np.zeros((extra, ids.shape[1]), ids.dtype)])
            mask = np.concatenate([mask, np.eye(1, mask.shape[1], dtype=mask.dtype).repeat(extra, 0)])
        ids_mx, mask_mx = mx.array(ids), mx.array(mask)
        emb = encode(params, ids_mx, mask_mx)
        if len(rows) < ids.shape[0]:
            emb, mask_mx = emb[:len(rows)], mask_mx[:len(rows)]
        mx.eval(emb)
        blocks.append((rows, emb, mask_mx))
    return Embedded(blocks=blocks, n=len(texts))


def tokens_and_pooled(hidden: Embedded) -> tuple[Embedded, np.ndarray]:
    """From raw hidden states (`embed_texts(..., encode_fn=hidden_states)`) of an encoder without
    a projection: its unit token embeddings (what `token_embeddings` gives) and its mean-pooled
    unit vectors [n, d_model] (what `embed_pooled` gives), from one forward pass."""
    blocks, pooled = [], np.zeros((hidden.n, 0), np.float32)
    for rows, h, mask in hidden.blocks:
        m = mask.astype(h.dtype)[..., None]
        v = np.array(late_interaction.l2_normalize((h * m).sum(1) / mx.maximum(m.sum(1), 1.0)))
        if pooled.shape[1] != v.shape[-1]:
            pooled = np.zeros((hidden.n, v.shape[-1]), np.float32)
        pooled[rows] = v
        tokens = late_interaction.l2_normalize(h)
        mx.eval(tokens)
        blocks.append((rows, tokens, mask))
    return Embedded(blocks=blocks, n=hidden.n), pooled


def maxsim_matrix(queries: Embedded, docs: Embedded, compiled: bool | None = None,
                  desc: str = "MaxSim") -> np.ndarray:
    """MaxSim scores float32 [n_queries, n_docs] of every query against every document
    (`compiled` as in `embed_texts`; progress shown as `desc`)."""
    from mlxio.run.reporting import progress

    scores = np.zeros((queries.n, docs.n), np.float32)
    score = _maybe_compile(late_interaction.maxsim, compiled)
    for q_rows, q_emb, q_mask in progress(queries.blocks, desc=desc, unit="batch", every_s=15.0):
        for d_rows, d_emb, d_mask in docs.blocks:
            block = score(q_emb, q_mask, d_emb, d_mask)
            scores[np.ix_(q_rows, d_rows)] = np.array(block)
    return scores
