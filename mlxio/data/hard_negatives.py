"""Hard negatives for retriever training: per training query, other training code that a
retriever ranks high but that is not the answer.

Two miners, each over the training pairs' own code: BM25 (lexical overlap of the query with the
code) and the current model (cosine of mean-pooled token embeddings). A candidate is never the
query's positive, nor a near-duplicate of it (same normalised code, or code-term Jaccard
similarity >= `near_dup`), nor code whose own docstring query is the same sentence (two
functions documented alike are not negatives of each other). Negatives a JSONL line gives
(`"negatives"`) come first; the miners fill the rest, alternating; a query with fewer than `k`
mined candidates is topped up with seeded random training code (plain extra negatives), so
every pair has exactly `k` and the batches have one shape.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from mlxcore import ranking
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


def mine_dense(query_vecs: np.ndarray, code_vecs: np.ndarray, k: int, excluder: Excluder,
               pool: int = 32, block: int = 1024) -> list[list[int]]:
    """Per query i (unit vectors [n, D], codes [n, D], pairs indexed alike), up to `k`
    allowed code indices with the highest cosine, best first."""
    out = []
    for start in range(0, len(query_vecs), block):
        sims = query_vecs[start:start + block] @ code_vecs.T
        for r, row in enumerate(sims):
            out.append(_pick(_top(row, pool), start + r, k, excluder))
    return out


def pooled_vectors(embed: Callable[[list[str], int], object], texts: Sequence[str], max_length: int) -> np.ndarray:
    """Unit mean-pooled vectors float32 [n, D] of `texts` from `embed(texts, max_length)` ->
    `mlxio.search.embeddings.Embedded` (per-token unit embeddings in blocks)."""
    embedded = embed(list(texts), max_length)
    out = None
    for rows, emb, mask in embedded.blocks:
        e, m = np.asarray(emb, np.float32), np.asarray(mask, np.float32)[..., None]
        v = (e * m).sum(1) / np.maximum(m.sum(1), 1.0)
        if out is None:
            out = np.zeros((embedded.n, v.shape[-1]), np.float32)
        out[np.asarray(rows)] = v
    if out is None:
        return np.zeros((0, 0), np.float32)
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


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
