"""Embed texts with a multi-vector encoder, score them by MaxSim, and store the embeddings.

Texts are tokenised once, sorted by length and embedded in batches padded to a bucket, so a
handful of compiled shapes serve the whole corpus and padding costs little. Ranking and fusion
of the scores are pure (`mlxcore.ranking`); this module owns the tokenizer and the files.
Used by the xtr_lora recipe (evaluation) and code_search (index and query).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs
import mlx.core as mx
import numpy as np

from mlxcore import retrieval
from mlxcore.encoder import EncoderSpec, hidden_states, token_embeddings
from mlxio.data.token_cache import hf_tokenize, padded_length


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
    return retrieval.l2_normalize((h * m).sum(1) / mx.maximum(m.sum(1), 1.0))


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


def embed_texts(params: dict, spec: EncoderSpec, tokenizer, texts: Sequence[str], max_length: int,
                batch_size: int = 64, bucket: int = 16, desc: str = "embedding",
                encode_fn=None) -> Embedded:
    """Unit-norm token embeddings of `texts`, computed in length-sorted, bucket-padded batches
    (progress shown as `desc`: a bar on a terminal, periodic log lines otherwise)."""
    from mlxio.run.reporting import progress

    token_ids = hf_tokenize(tokenizer)(list(texts), max_length)
    lengths = np.array([len(t) for t in token_ids])
    order = np.argsort(lengths, kind="stable")
    encode_fn = encode_fn or token_embeddings
    encode = mx.compile(lambda p, ids, mask: encode_fn(p, ids, mask, spec))
    blocks = []
    for start in progress(range(0, len(order), batch_size), desc=desc, unit="batch", every_s=15.0):
        rows = order[start:start + batch_size]
        width = padded_length(int(lengths[rows].max()), bucket)
        ids = np.zeros((len(rows), width), np.int32)
        mask = np.zeros((len(rows), width), np.bool_)
        for i, row in enumerate(rows):
            ids[i, :lengths[row]] = token_ids[row]
            mask[i, :lengths[row]] = True
        ids_mx, mask_mx = mx.array(ids), mx.array(mask)
        emb = encode(params, ids_mx, mask_mx)
        mx.eval(emb)
        blocks.append((rows, emb, mask_mx))
    return Embedded(blocks=blocks, n=len(texts))


def maxsim_matrix(queries: Embedded, docs: Embedded) -> np.ndarray:
    """MaxSim scores float32 [n_queries, n_docs] of every query against every document."""
    scores = np.zeros((queries.n, docs.n), np.float32)
    score = mx.compile(retrieval.maxsim)
    for q_rows, q_emb, q_mask in queries.blocks:
        for d_rows, d_emb, d_mask in docs.blocks:
            block = score(q_emb, q_mask, d_emb, d_mask)
            scores[np.ix_(q_rows, d_rows)] = np.array(block)
    return scores


def save_embedded(directory: Path, embedded: Embedded) -> None:
    """Store real-token embeddings only: float16 tokens [n_tokens, D] + int64 offsets [n + 1]."""
    rows, parts = [], []
    for block_rows, emb, mask in embedded.blocks:
        emb, mask = np.array(emb.astype(mx.float16)), np.array(mask)
        for i, row in enumerate(block_rows):
            rows.append(row)
            parts.append(emb[i][mask[i]])
    ordered = [parts[i] for i in np.argsort(rows)]
    offsets = np.zeros(embedded.n + 1, np.int64)
    offsets[1:] = np.cumsum([len(p) for p in ordered])
    directory.mkdir(parents=True, exist_ok=True)
    np.save(directory / "tokens.npy", np.concatenate(ordered) if ordered else np.zeros((0, 1), np.float16))
    np.save(directory / "offsets.npy", offsets)


def load_embedded(directory: Path, batch_size: int = 256, bucket: int = 16) -> Embedded:
    """Inverse of `save_embedded`: length-sorted, bucket-padded float32 blocks (memory-mapped read)."""
    tokens = np.load(directory / "tokens.npy", mmap_mode="r")
    offsets = np.load(directory / "offsets.npy")
    lengths = np.diff(offsets)
    order = np.argsort(lengths, kind="stable")
    blocks = []
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        width = padded_length(int(lengths[rows].max()), bucket)
        emb = np.zeros((len(rows), width, tokens.shape[1]), np.float32)
        mask = np.zeros((len(rows), width), np.bool_)
        for i, row in enumerate(rows):
            emb[i, :lengths[row]] = tokens[offsets[row]:offsets[row + 1]]
            mask[i, :lengths[row]] = True
        blocks.append((rows, mx.array(emb), mx.array(mask)))
    return Embedded(blocks=blocks, n=len(lengths))
