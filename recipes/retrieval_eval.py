"""Embed texts with a multi-vector encoder and rank candidates: semantic (MaxSim), BM25 and
hybrid (BM25 fused with semantic: min-max score interpolation with a weight chosen on dev
queries, or reciprocal-rank fusion). Shared by the xtr_lora recipe and code_search.

Texts are tokenised once, sorted by length and embedded in batches padded to a bucket, so a
handful of compiled shapes serve the whole corpus and padding costs little.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs
import mlx.core as mx
import numpy as np

from mlxcore import ranking, retrieval
from mlxcore.encoder import EncoderSpec, token_embeddings
from mlxio.data.token_cache import hf_tokenize, padded_length

RRF_K = 60.0  # reciprocal-rank fusion constant (Cormack et al. 2009)


@attrs.frozen
class Embedded:
    """Token embeddings of n texts in length-sorted blocks: (row indices [b], emb [b, T, D],
    mask [b, T]) per block; rows index the original text order."""

    blocks: list[tuple[np.ndarray, mx.array, mx.array]]
    n: int


def embed_texts(params: dict, spec: EncoderSpec, tokenizer, texts: Sequence[str], max_length: int,
                batch_size: int = 64, bucket: int = 16) -> Embedded:
    """Unit-norm token embeddings of `texts`, computed in length-sorted, bucket-padded batches."""
    token_ids = hf_tokenize(tokenizer)(list(texts), max_length)
    lengths = np.array([len(t) for t in token_ids])
    order = np.argsort(lengths, kind="stable")
    encode = mx.compile(lambda p, ids, mask: token_embeddings(p, ids, mask, spec))
    blocks = []
    for start in range(0, len(order), batch_size):
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


def bm25_matrix(queries: Sequence[str], docs: Sequence[str]) -> np.ndarray:
    """BM25 scores float [n_queries, n_docs] over code-aware terms (identifiers split)."""
    index = ranking.bm25_index([ranking.code_terms(d) for d in docs])
    return ranking.bm25_matrix(index, [ranking.code_terms(q) for q in queries])


def hybrid(semantic: np.ndarray, bm25: np.ndarray) -> np.ndarray:
    """Reciprocal-rank fusion (k=60) of semantic and BM25 rankings, [n_queries, n_docs]."""
    return ranking.reciprocal_rank_fusion([semantic, bm25], RRF_K)


ALPHAS = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)  # candidate weights of the semantic side
MIN_DEV_QUERIES = 50  # fewer dev queries than this: no weight is tuned, RRF is used


def interpolated(semantic: np.ndarray, bm25: np.ndarray, alpha: float) -> np.ndarray:
    """alpha x min-max(semantic) + (1 - alpha) x min-max(BM25), per query: [n_queries, n_docs]."""
    return ranking.interpolate(semantic, bm25, alpha)


def choose_alpha(semantic_dev: np.ndarray, bm25_dev: np.ndarray, dev_positives: np.ndarray) -> float | None:
    """The ALPHAS weight with the best MRR@10 on the dev queries (None: too few to choose)."""
    if len(dev_positives) < MIN_DEV_QUERIES:
        return None
    mrr = [ranking.ranking_metrics(interpolated(semantic_dev, bm25_dev, a), dev_positives)["mrr@10"] for a in ALPHAS]
    return ALPHAS[int(np.argmax(mrr))]


def evaluate_modes(semantic: np.ndarray, bm25: np.ndarray, positives: np.ndarray, alpha: float | None) -> dict:
    """{"semantic", "hybrid", "hybrid_fusion", "fusion": {variant: metrics}} on the test queries.

    hybrid = score interpolation at `alpha` (chosen on dev queries, never on these), or RRF
    (k=60) when alpha is None. "fusion" lists every variant for comparison. Metrics: P@1,
    MRR@10, Recall@10, nDCG@10.
    """
    fusion = {"rrf": ranking.ranking_metrics(hybrid(semantic, bm25), positives)}
    fusion |= {f"interp@{a:g}": ranking.ranking_metrics(interpolated(semantic, bm25, a), positives) for a in ALPHAS}
    name = "rrf" if alpha is None else f"interp@{alpha:g}"
    return {"semantic": ranking.ranking_metrics(semantic, positives), "hybrid": fusion[name],
            "hybrid_fusion": name, "fusion": fusion}


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
