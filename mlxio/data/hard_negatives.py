"""Hard negatives for retriever training: per training query, other training code that a
retriever ranks high but that is not the answer.

Two miners, each over the training pairs' own code: BM25 (lexical overlap of the query with the
code) and a model (`mine_maxsim`: the candidates of its mean-pooled vectors re-ranked by its own
MaxSim, the score the retriever trains). A candidate is never the query's positive, nor a
near-duplicate of it (same normalised code, or code-term Jaccard similarity >= `near_dup`), nor
code whose own docstring query is the same sentence (two functions documented alike are not
negatives of each other).

False negatives (code that answers the query as well as its positive: the reason one BM25
negative per pair lowered quality here) are guarded against as sentence-transformers'
`mine_hard_negatives` and NV-Retriever's "TopK-PercPos" do (`guard`): each miner's top
`rank_max` candidates are scored by a model's MaxSim - the model being trained, or a guide such
as a first run's fine-tuned export (GISTEmbed's guide) - and a candidate scoring above
(1 - relative margin) x its positive's score, or within the absolute margin of it, is dropped;
the first `rank_min` survivors are skipped (the rank window); up to k are kept per miner.

Negatives a JSONL line gives (`"negatives"`) come first; the miners fill the rest, alternating;
a query with fewer than `k` mined candidates is topped up with seeded random training code
(plain extra negatives), so every pair has exactly `k` and the batches have one shape.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence

import attrs
import numpy as np

from mlxcore.retrieval import ranking
from mlxio.data.pairs import Pair

_COMMENT = re.compile(r"#[^\n]*")


def normalised_code(code: str) -> str:
    """Code with comments and all whitespace removed (vendored copies that differ only in
    layout or comments compare equal)."""
    return "".join(_COMMENT.sub("", code).split())


def code_hash(code: str) -> str:
    return hashlib.sha1(normalised_code(code).encode()).hexdigest()


def normalised_query(query: str) -> str:
    """Lower-case, whitespace collapsed, trailing punctuation dropped: "Return the X." ==
    "return  the x"."""
    return " ".join(query.lower().split()).rstrip(".!?:; ")


def _jaccard(a: frozenset, b: frozenset) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / max(len(a | b), 1)


@attrs.frozen(kw_only=True)
class Excluder:
    """Decides whether candidate j may be a negative of query i (pairs indexed alike)."""

    hashes: tuple[str, ...]
    queries: tuple[str, ...]
    terms: tuple[frozenset, ...]
    near_dup: float

    @classmethod
    def of(cls, pairs: Sequence[Pair], near_dup: float = 0.8) -> Excluder:
        return cls(hashes=tuple(code_hash(p.code) for p in pairs),
                   queries=tuple(normalised_query(p.query) for p in pairs),
                   terms=tuple(frozenset(ranking.code_terms(p.code)) for p in pairs), near_dup=near_dup)

    def allowed(self, i: int, j: int) -> bool:
        return (i != j and self.hashes[i] != self.hashes[j] and self.queries[i] != self.queries[j]
                and _jaccard(self.terms[i], self.terms[j]) < self.near_dup)


def _pick(order: np.ndarray, i: int, k: int, excluder: Excluder) -> list[int]:
    out = []
    for j in order:
        if excluder.allowed(i, int(j)):
            out.append(int(j))
            if len(out) == k:
                break
    return out


def _top(scores: np.ndarray, pool: int) -> np.ndarray:
    pool = min(pool, len(scores))
    part = np.argpartition(-scores, pool - 1)[:pool]
    return part[np.argsort(-scores[part], kind="stable")]


def mine_bm25(pairs: Sequence[Pair], k: int, excluder: Excluder, pool: int = 32) -> list[list[int]]:
    """Per pair i, up to `k` indices j of other pairs whose code BM25 ranks highest for
    pair i's query (allowed by `excluder`), best first."""
    index = ranking.bm25_index([ranking.doc_terms(p.code) for p in pairs])
    out = []
    for i, p in enumerate(pairs):
        scores = ranking.bm25_scores(index, ranking.query_terms(p.query))
        out.append(_pick(_top(scores, pool), i, k, excluder))
    return out


@attrs.frozen
class Tokens:
    """Token embeddings of n texts, padded: vectors float16 [n, T, D] (unit rows; zeros past a
    text's length) and lengths int [n] >= 1."""

    vectors: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, embedded) -> Tokens:
        """From `mlxio.search.embeddings.Embedded` (length-sorted blocks) in text order."""
        width = max((int(np.asarray(mask).shape[1]) for _, _, mask in embedded.blocks), default=1)
        dim = next((int(emb.shape[-1]) for _, emb, _ in embedded.blocks), 1)
        vectors = np.zeros((embedded.n, width, dim), np.float16)
        lengths = np.ones(embedded.n, np.int64)
        for rows, emb, mask in embedded.blocks:
            m = np.asarray(mask, bool)
            e = np.asarray(emb, np.float32) * m[..., None]
            vectors[np.asarray(rows), :e.shape[1]] = e
            lengths[np.asarray(rows)] = np.maximum(m.sum(1), 1)
        return cls(vectors, lengths)

    def pooled(self) -> np.ndarray:
        """Unit mean-pooled vectors float32 [n, D] (padding is zeros, so the sum is the real tokens')."""
        v = self.vectors.astype(np.float32).sum(1) / self.lengths[:, None]
        return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def maxsim(queries: Tokens, i: int, docs: Tokens, cands: Sequence[int]) -> np.ndarray:
    """MaxSim float32 [len(cands)] of query i against documents `cands`: for each real query
    token the best cosine over the document's real tokens, averaged (`mlxcore.retrieval.late_interaction.maxsim`).
    The reference of `maxsim_many`, one query at a time in NumPy."""
    cands = np.asarray(cands, np.int64)
    if len(cands) == 0:
        return np.zeros(0, np.float32)
    q = queries.vectors[i, :queries.lengths[i]].astype(np.float32)  # [Tq, D]
    width = int(docs.lengths[cands].max())
    d = docs.vectors[cands, :width].astype(np.float32)  # [c, T, D]
    sims = (d.reshape(-1, d.shape[-1]) @ q.T).reshape(len(cands), width, len(q))
    sims[np.arange(width)[None, :] >= docs.lengths[cands][:, None]] = -np.inf
    return sims.max(axis=1).mean(axis=1)


def maxsim_many(queries: Tokens, docs: Tokens, cands: Sequence[Sequence[int]], block_elements: int = 2**26,
                each: Callable[[range], Iterable[int]] = iter, batched: bool | None = None) -> list[np.ndarray]:
    """`maxsim(queries, i, docs, cands[i])` for every query i (float32 [len(cands[i])] each), in
    blocks of queries. Batched (default where MLX's default device is a GPU, where query by query
    is slow): a block gathers its
    candidates' tokens as float32 [B, P, T, D] on the device, B x P x T x D <= `block_elements`
    (256 MB), one product per block; rows padded to the block's longest list, trimmed to its
    longest document. Otherwise `maxsim` per query (on CPU cores NumPy's per-query products ran
    faster than MLX's batched ones). `each` wraps the loop over blocks (a progress display)."""
    import mlx.core as mx

    n = len(cands)
    out = [np.zeros(0, np.float32)] * n
    if n == 0:
        return out
    if not (mx.default_device() == mx.gpu if batched is None else batched):
        step = 64
        for lo in each(range(0, n, step)):
            for i in range(lo, min(lo + step, n)):
                out[i] = maxsim(queries, i, docs, cands[i]).astype(np.float32)
        return out
    doc_vectors, doc_lengths = mx.array(docs.vectors), docs.lengths
    q_width = int(queries.lengths.max())
    q_vectors = mx.array(queries.vectors[:, :q_width])
    per_query = max(max(len(c) for c in cands), 1) * int(doc_lengths.max()) * docs.vectors.shape[-1]
    step = max(1, block_elements // per_query)
    for lo in each(range(0, n, step)):
        rows = range(lo, min(lo + step, n))
        width = max(len(cands[i]) for i in rows)
        if width == 0:
            continue
        idx = np.zeros((len(rows), width), np.int64)
        for b, i in enumerate(rows):
            idx[b, :len(cands[i])] = cands[i]
        t_doc = int(doc_lengths[idx].max())
        d = mx.take(doc_vectors, mx.array(idx.reshape(-1)), axis=0)[:, :t_doc].astype(mx.float32)
        q = q_vectors[lo:lo + len(rows)].astype(mx.float32)  # [B, Tq, D]
        sims = (d.reshape(len(rows), width * t_doc, -1) @ q.transpose(0, 2, 1)).reshape(len(rows), width, t_doc, -1)
        real_doc = mx.array(np.arange(t_doc)[None, None, :] < doc_lengths[idx][..., None])  # [B, P, T]
        best = mx.where(real_doc[..., None], sims, -mx.inf).max(axis=2)  # [B, P, Tq]
        q_len = queries.lengths[lo:lo + len(rows)]
        real_q = mx.array(np.arange(q_width)[None, :] < q_len[:, None])[:, None, :]  # [B, 1, Tq]
        scores = np.array(mx.where(real_q, best, 0.0).sum(axis=-1) / mx.array(q_len[:, None].astype(np.float32)))
        for b, i in enumerate(rows):
            out[i] = scores[b, :len(cands[i])].astype(np.float32)
    return out


def mine_maxsim(queries: Tokens, docs: Tokens, rank_max: int, pool_factor: int = 4,
                each: Callable[[range], Iterable[int]] = iter) -> list[np.ndarray]:
    """Per query i (pairs indexed alike: doc i is its positive), the `rank_max` other documents
    with the highest MaxSim, best first, among the `pool_factor * rank_max` nearest by
    mean-pooled cosine (MaxSim over every document would cost n^2 x Tq x Td); the MaxSim of
    every pool by `maxsim_many` (`each` wraps its loop over blocks)."""
    qv, dv = queries.pooled(), docs.pooled()
    n, pool = len(qv), min(pool_factor * rank_max, len(dv) - 1)
    pools = []
    for lo in range(0, n, 1024):  # cosines [1024, n] at a time
        cosine = qv[lo:lo + 1024] @ dv.T
        for b, row in enumerate(cosine):
            row[lo + b] = -np.inf
            pools.append(_top(row, pool) if pool > 0 else np.zeros(0, np.int64))
    scores = maxsim_many(queries, docs, pools, each=each)
    return [p[np.argsort(-s, kind="stable")][:rank_max] for p, s in zip(pools, scores, strict=True)]


def guard(ranked: Sequence[Sequence[Sequence[int]]], k: int, excluder: Excluder, scores, *,
          rank_min: int = 0, relative_margin: float = 0.0,
          absolute_margin: float = 0.0) -> tuple[list[list[list[int]]], dict]:
    """Each miner's ranked candidates (`ranked[m][i]`, best first) with likely false negatives
    removed: `scores(lists)` -> per query i the guide's scores float [len(lists[i])] of its
    positive and candidates (lists[i] = [i, *candidates]; `maxsim_many` for all queries at once);
    candidate j goes when excluded (`excluder`) or when s_j > (1 - relative_margin) * s_i or
    s_j > s_i - absolute_margin; the first `rank_min` survivors are skipped and up to k kept.
    Returns (kept[m][i], counts of what was dropped)."""
    counts = {"candidates": 0, "excluded": 0, "false_negative_margin": 0, "rank_window": 0}
    kept: list[list[list[int]]] = [[] for _ in ranked]
    lists = [[i, *dict.fromkeys(int(j) for miner in ranked for j in miner[i])]
             for i in range(len(ranked[0]) if ranked else 0)]
    scored = scores(lists)
    for i in range(len(lists)):
        s = dict(zip(lists[i], np.asarray(scored[i], np.float64).tolist(), strict=True))
        ceiling = min((1.0 - relative_margin) * s[i], s[i] - absolute_margin)
        for m, miner in enumerate(ranked):
            survivors = []
            for j in (int(j) for j in miner[i]):
                counts["candidates"] += 1
                if not excluder.allowed(i, j):
                    counts["excluded"] += 1
                elif s[j] > ceiling:
                    counts["false_negative_margin"] += 1
                else:
                    survivors.append(j)
            counts["rank_window"] += min(rank_min, len(survivors))
            kept[m].append(survivors[rank_min:rank_min + k])
    return kept, counts


def attach(pairs: Sequence[Pair], k: int, mined: Sequence[Sequence[Sequence[int]]], seed: int,
           excluder: Excluder | None = None) -> tuple[list[Pair], dict]:
    """Pairs with exactly `k` negatives each: the pair's own (JSONL) negatives first, then the
    miners' picks alternating (`mined[m][i]`: miner m's indices for pair i), then seeded
    random allowed code. Returns (pairs, counts by origin)."""
    rng = np.random.default_rng(seed)
    counts = {"given": 0, "mined": 0, "random": 0}
    out = []
    n = len(pairs)
    for i, p in enumerate(pairs):
        negs = list(dict.fromkeys(p.negatives))[:k]
        counts["given"] += len(negs)
        picks = [j for group in zip(*(m[i] for m in mined), strict=False) for j in group] if mined else []
        for miner in mined:  # leftovers of longer lists after the zip
            picks += list(miner[i])
        for j in dict.fromkeys(picks):
            if len(negs) >= k:
                break
            if pairs[j].code not in negs:
                negs.append(pairs[j].code)
                counts["mined"] += 1
        tries = 0
        while len(negs) < k and n > 1 and tries < 100:
            j = int(rng.integers(n))
            tries += 1
            if (excluder is None and j != i or excluder is not None and excluder.allowed(i, j)) \
                    and pairs[j].code not in negs:
                negs.append(pairs[j].code)
                counts["random"] += 1
        while len(negs) < k:  # a corpus too small to have k others: repeat (still negatives)
            negs.append(negs[-1] if negs else pairs[(i + 1) % n].code)
            counts["random"] += 1
        out.append(attrs.evolve(p, negatives=tuple(negs)))
    return out, counts
