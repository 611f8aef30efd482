"""The >= 1,000,000-function synthetic corpus over the default codec (pq64), built from the
index `python -m benchmarks.search_scale --corpus stdlib` leaves in its --work folder (the
real stdlib functions, embedded with MiniLM, compressed): the search-at-scale benchmark's second record.

    python -m benchmarks.search_scale_synth --work W --phase build  [--synthetic 1000000]
    python -m benchmarks.search_scale_synth --work W --phase search     # pinned to 2 cores
    python -m benchmarks.search_scale_synth --work W --phase edit
    python -m benchmarks.search_scale_synth --record DIR --out benchmarks/results/h100/search_scale.json

Corpus: the base index's real functions (slots kept, so the stdlib run's query positives are
the same slots), then near-duplicates in batches of SYNTH_BATCH, each batch from its own seeded
RNG (so batches are built in parallel and in any order, and the stream is reproducible): a
near-duplicate of a random real function has its compressed tokens with 15% of the token
positions replaced by other real tokens (centroid id + PQ code) and one PQ byte of 5% of the
tokens altered, and its text with up to 3 identifiers renamed (WORD_name; BM25 term counts
follow). Its VECTORS are therefore synthetic - its decompressed codes -, as in the 1-bit record.

build: the renaming and record compression run in --workers processes; the parent writes one
segment (`index.Writer`, as a build does) and scores every query exactly against every
function as it goes: brute-force MaxSim of the stdlib run's query vectors over every
function's decompressed vectors, on MLX's default device (the GPU where there is one; checked
against NumPy on a sample). search: in a child pinned to --query-cores cores (one BLAS thread):
per query MiniLM float32 encoding on the CPU + Index.search, the default settings first, then
GRID within a time budget. edit: one 20-function "file" replaced by 20 real functions through
build.apply_units (the code_search index path), embedded on the default device; a second edit;
a deletion.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import hashlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.search_scale import (
    _dir_bytes,
    _files_bytes,
    _mrr,
    _paired_se,
    _pct,
    _rss_gb,
)
from mlxio.search import store
from mlxio.search.index import (
    Index,
)
from mlxio.search.writer import Writer, segment_name, write_generation

ROOT = Path(__file__).resolve().parent.parent
SYNTH_BATCH, UNIT_DOCS, SEED = 4096, 20, 1
SWAP, NOISY, RENAMES = 0.15, 0.05, 3
_IDENT = re.compile(r"\b[a-z_][a-z0-9_]{2,}\b")  # identifiers that may be renamed, unless in _KEEP
_KEEP = frozenset("def return self none true false and not for while with class import from lambda "
                  "yield async await pass raise try except finally else elif print len range".split())
GRID = ((8, 256), (4, 128), (16, 512), (2, 256))  # after the default (nprobe, candidates), while the budget lasts


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def batch_bounds(n_real: int, functions: int) -> list[tuple[int, int]]:
    """[first, end) function numbers of each batch: batch 0 the real functions, then SYNTH_BATCH each."""
    out = [(0, n_real)]
    while out[-1][1] < functions:
        out.append((out[-1][1], min(out[-1][1] + SYNTH_BATCH, functions)))
    return out


def batch_tokens(seg, b: int, first: int, end: int, sources: bool = False):
    """(bases [n]: the real function each copies, starts [n], cids, codes) of batch `b`;
    `sources`: also (source: the real token each token copies, noisy: tokens whose code was altered)."""
    if b == 0:
        bases = np.arange(end - first)
        positions, starts = seg.tokens(bases)
        out = bases, starts, np.asarray(seg.cids[positions]), np.asarray(seg.residuals[positions])
        return (*out, positions, np.zeros(0, np.int64)) if sources else out
    rng = np.random.default_rng([SEED, b])
    bases = rng.integers(0, seg.n, end - first)
    positions, starts = seg.tokens(bases)
    cids = np.asarray(seg.cids[positions]).copy()
    codes = np.asarray(seg.residuals[positions]).copy()
    swap = np.flatnonzero(rng.random(len(positions)) < SWAP)
    donor = rng.integers(0, seg.n_tokens, len(swap))
    cids[swap], codes[swap] = seg.cids[donor], seg.residuals[donor]
    noisy = np.flatnonzero(rng.random(len(positions)) < NOISY)
    codes[noisy, rng.integers(0, codes.shape[1], len(noisy))] ^= rng.integers(1, 256, len(noisy)).astype(np.uint8)
    if not sources:
        return bases, starts, cids, codes
    source = positions.copy()
    source[swap] = donor
    return bases, starts, cids, codes, source, noisy


# ----------------------------------------------------------------------------- build workers

_W: dict = {}  # per worker process: the base index's records and their identifiers / terms


def _terms_of(codes: list[str]) -> list[Counter]:
    from mlxcore.retrieval.ranking import doc_terms

    return [Counter(doc_terms(c)) for c in codes]


def _worker_init(base_dir: str, terms: list[Counter], words: list[str], word_terms: dict) -> None:
    base = Index(base_dir)
    seg = base.segments[0]
    records = [base.record(i) for i in range(seg.n)]
    idents = [Counter(m for m in _IDENT.findall(r["code"]) if m not in _KEEP) for r in records]
    _W.update(base=base, seg=seg, records=records, idents=idents, terms=terms, words=words, word_terms=word_terms)


def _worker_batch(job: tuple[int, int, int]):
    """Batch `b`: (b, tokens, [(id, record JSON line, term counts) per function])."""
    b, first, end = job
    seg, records = _W["seg"], _W["records"]
    bases, starts, cids, codes = batch_tokens(seg, b, first, end)
    rng = np.random.default_rng([SEED, b, 1])  # texts: their own stream
    words, out = _W["words"], []
    for j, k in enumerate(bases.tolist()):
        r = records[k]
        if b == 0:
            out.append((r["id"], seg.record_json(k), _W["terms"][k]))
            continue
        names = list(_W["idents"][k])
        counts = Counter(_W["terms"][k])
        text = r["code"]
        if names:
            chosen = [names[i] for i in rng.choice(len(names), min(RENAMES, len(names)), replace=False)]
            mapping = {n: words[int(rng.integers(len(words)))] for n in chosen}
            text = re.sub(r"\b(" + "|".join(map(re.escape, chosen)) + r")\b",
                          lambda m, mapping=mapping: f"{mapping[m.group(1)]}_{m.group(1)}", text)
            for name, word in mapping.items():  # WORD_name splits into WORD's terms + name's terms
                for term, tf in _W["word_terms"][word].items():
                    counts[term] += tf * _W["idents"][k][name]
        rid = f"synthetic/{first + j}/{r['id']}"
        rec = {"id": rid, "code": text, "path": r.get("path"), "line": r.get("line"), "name": r.get("name")}
        out.append((rid, json.dumps(rec, separators=(",", ":")).encode(), counts))
    return b, (bases, starts, cids, codes), out


# ----------------------------------------------------------------------------- exact scoring


class ExactScorer:
    """MaxSim of every query against decompressed documents, in MLX on its default device:
    tokens decoded in the codec's rotated basis (PQCodec.decode_rotated), scored against the
    rotated queries ([tokens, query tokens] for up to `group` documents at a time), the max over
    each document's tokens by a gather of its rows (documents of like length together, padded
    by repeating their last token) and the mean over each query's tokens."""

    def __init__(self, codec, q: np.ndarray, q_off: np.ndarray, group: int = 1024, pad_docs: int = 256):
        import mlx.core as mx

        self.mx, self.codec, self.group, self.pad_docs = mx, codec, group, pad_docs
        n_q = len(q_off) - 1
        avg = np.zeros((len(q), n_q), np.float32)
        for i in range(n_q):
            avg[q_off[i]:q_off[i + 1], i] = 1.0 / (q_off[i + 1] - q_off[i])
        self.q_rot = mx.array(codec.rotate(q))
        self.avg = mx.array(avg)
        self.flat = mx.array(codec._flat)
        self.rot_centroids = mx.array(codec._rot_centroids)
        self.sub = mx.array((np.arange(codec.subspaces) * 256).astype(np.int32))
        self.q_np, self.q_off = codec.rotate(q), q_off

    def __call__(self, starts: np.ndarray, cids: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """float32 [documents, queries] for documents at `starts` of the token arrays."""
        mx = self.mx
        n_docs = len(starts)
        ends = np.r_[starts[1:], len(cids)]
        out = np.empty((n_docs, len(self.q_off) - 1), np.float32)
        for g0 in range(0, n_docs, self.group):
            g1 = min(g0 + self.group, n_docs)
            a, b = int(starts[g0]), int(ends[g1 - 1])
            idx = mx.array(codes[a:b]).astype(mx.int32) + self.sub
            v = self.flat[idx].reshape(b - a, -1) + self.rot_centroids[mx.array(cids[a:b]).astype(mx.int32)]
            v = v / mx.maximum(mx.sqrt((v * v).sum(axis=1, keepdims=True)), 1e-12)
            sims = v @ self.q_rot.T  # [tokens, query tokens]
            first, lengths = starts[g0:g1] - a, ends[g0:g1] - starts[g0:g1]
            order = np.argsort(lengths, kind="stable")
            parts = []
            for c0 in range(0, len(order), self.pad_docs):
                docs = order[c0:c0 + self.pad_docs]
                width = int(lengths[docs].max())
                pos = first[docs][:, None] + np.minimum(np.arange(width)[None, :], lengths[docs][:, None] - 1)
                parts.append(sims[mx.array(pos.astype(np.int32))].max(axis=1) @ self.avg)  # [docs, queries]
            out[g0 + order] = np.array(mx.concatenate(parts))
        return out

    def check(self, starts, cids, codes, scores, docs: int = 64) -> float:
        """Largest |scores - NumPy decode + matmul| over the first `docs` documents."""
        n = min(docs, len(starts))
        end = starts[n] if n < len(starts) else len(cids)
        v = self.codec.decode_rotated(cids[:end], codes[:end])
        sims = v @ self.q_np.T
        best = np.maximum.reduceat(sims, starts[:n], axis=0)
        ref = np.add.reduceat(best, self.q_off[:-1], axis=1) / np.diff(self.q_off)[None, :]
        return float(np.abs(ref - scores[:n]).max())


# ----------------------------------------------------------------------------- exact scores on the CPU

_E: dict = {}  # per exact-scoring worker: the real tokens' similarities and the query group


def _exact_batch(job: tuple[int, int, int]) -> tuple[int, np.ndarray]:
    """Batch `b`'s MaxSim [queries of the group, functions]: every token that copies a real token
    takes that token's row of S = decode(real tokens) @ Q.T; altered tokens are decoded."""
    b, first, end = job
    seg, codec, sims, q, q_off = _E["seg"], _E["codec"], _E["sims"], _E["q"], _E["q_off"]
    _, starts, cids, codes, source, noisy = batch_tokens(seg, b, first, end, sources=True)
    buf = _E.get("buf")
    if buf is None or len(buf) < len(source):  # reused: a fresh [tokens, query tokens] array per batch page-faults
        buf = _E["buf"] = np.empty((int(len(source) * 1.25), sims.shape[1]), np.float32)
    tok = np.take(sims, source, axis=0, out=buf[:len(source)])  # [tokens, query tokens]
    if len(noisy):
        tok[noisy] = codec.decode_rotated(cids[noisy], codes[noisy]) @ q.T
    best = np.maximum.reduceat(tok, starts, axis=0)  # [functions, query tokens]
    return b, (np.add.reduceat(best, q_off[:-1], axis=1) / np.diff(q_off)[None, :]).T


def phase_exact(work: Path, functions: int, workers: int, n_queries: int, max_gb: float,
                max_minutes: float | None = None) -> dict:
    """Brute-force MaxSim of the first `n_queries` queries over every function of the synthetic
    corpus (regenerated batch by batch: the vectors are the decompressed codes), on the CPU in
    `workers` forked processes, in groups of queries whose real-token similarities S fit
    `max_gb`. Checked against decode + matmul, and the regenerated codes against the index's.
    `max_minutes`: no new group starts after that; the result (written after every group to
    work/synth_exact.json) holds the queries done."""
    base, index = Index(work / "index"), Index(work / "synthetic")
    seg, codec = base.segments[0], base.codec
    _, q, q_off, positives = _queries(work)
    q_off = q_off[:n_queries + 1]
    q = codec.rotate(q[:q_off[-1]])
    per_token = seg.n_tokens * 4
    groups, g0 = [], 0
    while g0 < n_queries:  # queries per group: S [real tokens, group's query tokens] <= max_gb
        g1 = g0 + 1
        while g1 < n_queries and (q_off[g1 + 1] - q_off[g0]) * per_token <= max_gb * 2**30:
            g1 += 1
        groups.append((g0, g1))
        g0 = g1
    bounds = batch_bounds(seg.n, functions)
    jobs = [(b, lo, hi) for b, (lo, hi) in enumerate(bounds)]
    scores = np.zeros((n_queries, functions), np.float32)
    t0 = time.perf_counter()
    err, done = None, 0

    def result() -> dict:
        ranks, family = _ranks(index, scores[:done], positives[:done])
        return {"queries": done, "queries_wanted": n_queries, "query_groups": len(groups), "workers": workers,
                "exact_s": time.perf_counter() - t0, "mrr_exact": _mrr(ranks), "mrr_exact_family": _mrr(family),
                "exact_check_max_abs_err": err, "exact_device": "cpu (NumPy)", "exact_ranks": ranks.tolist(),
                "exact_family_ranks": family.tolist(), "peak_ram_gb": _rss_gb()}

    for g0, g1 in groups:
        if max_minutes is not None and time.perf_counter() - t0 > max_minutes * 60:
            say(f"exact: time cap reached after {done} queries")
            break
        qg = q[q_off[g0]:q_off[g1]]
        off = q_off[g0:g1 + 1] - q_off[g0]
        sims = np.empty((seg.n_tokens, len(qg)), np.float32)
        for lo in range(0, seg.n_tokens, 65536):
            hi = min(lo + 65536, seg.n_tokens)
            sims[lo:hi] = codec.decode_rotated(seg.cids[lo:hi], seg.residuals[lo:hi]) @ qg.T
        _E.update(seg=seg, codec=codec, sims=sims, q=qg, q_off=off)
        if err is None:  # check one synthetic batch against decode + matmul, and the index's codes
            _, got = _exact_batch(jobs[1])
            _, starts, cids, codes = batch_tokens(seg, *jobs[1])
            n = min(32, len(starts))
            end = starts[n] if n < len(starts) else len(cids)
            direct = np.maximum.reduceat(codec.decode_rotated(cids[:end], codes[:end]) @ qg.T, starts[:n], axis=0)
            ref = (np.add.reduceat(direct, off[:-1], axis=1) / np.diff(off)[None, :]).T
            err = float(np.abs(ref - got[:, :n]).max())
            stored = index.codes(jobs[1][1])
            if err > 1e-4 or not (np.array_equal(stored[0], cids[:starts[1]]) and np.array_equal(stored[1], codes[:starts[1]])):
                raise SystemExit(f"exact scores differ from decode @ Q by {err}, or the codes from the index's")
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            for b, part in pool.imap_unordered(_exact_batch, jobs, chunksize=1):
                scores[g0:g1, bounds[b][0]:bounds[b][1]] = part
        del sims
        _E.clear()
        done = g1
        (work / "synth_exact.json").write_text(json.dumps(result()) + "\n")
        say(f"exact: queries {g0}-{g1} of {n_queries} done, {time.perf_counter() - t0:.0f} s, peak RSS {_rss_gb():.2f} GB")
    return result()


# ----------------------------------------------------------------------------- phases


def _queries(work: Path):
    saved = np.load(work / "queries_dev.npz")
    return json.loads((work / "queries.json").read_text()), saved["tokens"], saved["offsets"], saved["positives"]


def phase_build(work: Path, functions: int, workers: int, exact_scores: bool = True) -> dict:
    base_dir = work / "index"
    base = Index(base_dir)
    if len(base.segments) != 1 or base.segments[0].deleted is not None:
        raise SystemExit(f"{base_dir}: expected one segment without tombstones (a fresh stdlib build)")
    seg, n_real = base.segments[0], base.segments[0].n
    queries, q, q_off, positives = _queries(work)
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("fork")
    records = [base.record(i) for i in range(n_real)]
    words = sorted({w for r in records[:2000] for w in _IDENT.findall(r["code"]) if len(w) < 12 and "_" not in w})
    step = max(1, -(-n_real // (workers * 4)))
    with ctx.Pool(workers) as pool:  # before any MLX work in this process: forked children stay NumPy-only
        terms = [c for part in pool.map(_terms_of, [[r["code"] for r in records[i:i + step]]
                                                     for i in range(0, n_real, step)]) for c in part]
    word_terms = dict(zip(words, _terms_of(words), strict=True))
    del records
    say(f"base: {n_real} real functions, {seg.n_tokens} tokens; term counts in {time.perf_counter() - t0:.0f} s")
    bounds = batch_bounds(n_real, functions)
    out_dir = work / "synthetic"
    if out_dir.exists():
        import shutil
        shutil.rmtree(out_dir)
    exact = np.zeros((len(q_off) - 1, functions), np.float32)
    timers = {"exact": 0.0, "write": 0.0, "wait": 0.0}
    check_err = None
    tmp, final = store.new_generation(out_dir)
    writer = Writer(tmp / segment_name(1), base.codec)
    unit_first: list[str] = []
    pool = ctx.Pool(workers, _worker_init, (str(base_dir), terms, words, word_terms))
    scorer = ExactScorer(base.codec, q, q_off)  # MLX from here on (the pool is forked already)
    try:
        jobs = [(b, lo, hi) for b, (lo, hi) in enumerate(bounds)]
        t_wait = time.perf_counter()
        for b, (bases, starts, cids, codes), docs in pool.imap(_worker_batch, jobs, chunksize=1):
            timers["wait"] += time.perf_counter() - t_wait
            first = bounds[b][0]
            t = time.perf_counter()
            ends = np.r_[starts[1:], len(cids)]
            for j, (rid, line, counts) in enumerate(docs):
                if (first + j) % UNIT_DOCS == 0:
                    unit_first.append(rid)
                writer.add({"id": rid}, cids[starts[j]:ends[j]], codes[starts[j]:ends[j]], record_json=line,
                           term_counts=counts)
            timers["write"] += time.perf_counter() - t
            t = time.perf_counter()
            if exact_scores:  # (off: timing runs only)
                scores = scorer(starts, cids, codes)
                exact[:, first:first + len(bases)] = scores.T
                if b == 1:
                    check_err = scorer.check(starts, cids, codes, scores)
                    if check_err > 1e-2:  # full float32 (MLX_ENABLE_TF32=0): ~1e-6
                        raise SystemExit(f"exact scores on the device differ from NumPy by {check_err}")
            timers["exact"] += time.perf_counter() - t
            if b % 25 == 0 or b == len(bounds) - 1:
                say(f"synthetic: {bounds[b][1]}/{functions} functions, {time.perf_counter() - t0:.0f} s "
                    f"(exact {timers['exact']:.0f} s, writer {timers['write']:.0f} s, waiting for workers "
                    f"{timers['wait']:.0f} s), peak RSS {_rss_gb():.2f} GB")
            t_wait = time.perf_counter()
    finally:
        pool.terminate()
    t_add = time.perf_counter() - t0
    units = {}
    for u, lo in enumerate(range(0, writer.n_docs, UNIT_DOCS)):
        count = min(UNIT_DOCS, writer.n_docs - lo)
        digest = hashlib.sha256(f"{u}:{lo}:{count}:{unit_first[u]}".encode()).hexdigest()
        units[f"block/{u:06d}"] = [digest, None, None, segment_name(1), lo, count]
    meta = {k: base.manifest[k] for k in ("model", "max_doc_len", "max_query_len")}
    write_generation(tmp, final, base.codec, [writer.finish()], {"kind": "records", "units": units},
                     {**meta, "units_kind": "records", "source": "synthetic",
                      "fusion": base.manifest.get("fusion", {"alpha": None, "source": "none"}), "search": {}})
    build_s = time.perf_counter() - t0
    say(f"synthetic index written: {functions} functions in {build_s:.0f} s")
    index = Index(out_dir)
    ranks, family = _ranks(index, exact, positives)
    gen = store.current(out_dir)
    return {"functions": functions, "real_functions": n_real, "batches": len(bounds), "workers": workers,
            "tokens": int(index.n_tokens), "units": len(units), "segments": len(index.segments),
            "bytes": _dir_bytes(gen), "files": _files_bytes(gen), "codec": index.codec.name,
            "centroids": len(index.codec.centroids), "build_s": build_s - timers["exact"], "add_s": t_add,
            "exact_s": timers["exact"], "writer_s": timers["write"], "wait_workers_s": timers["wait"],
            "exact_check_max_abs_err": check_err, "queries": len(q_off) - 1,
            "mrr_exact": _mrr(ranks), "mrr_exact_family": _mrr(family), "peak_ram_gb": _rss_gb(),
            "exact_device": _device(), "mlx_enable_tf32": os.environ.get("MLX_ENABLE_TF32", "default (1)")}


def _device() -> str:
    import mlx.core as mx

    return str(mx.default_device())


def _is_family(rid: str, want: str) -> bool:
    return rid == want or (rid.startswith("synthetic/") and rid.split("/", 2)[2] == want)


def _ranks(index: Index, scores: np.ndarray, positives: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rank (1..10, 11 = not in the top 10) of the positive and of its first family member."""
    ranks, family = [], []
    for i, row in enumerate(scores):
        cut = np.partition(row, len(row) - 10)[len(row) - 10] if len(row) > 10 else -np.inf
        near = np.flatnonzero(row >= cut)
        found = near[np.lexsort((near, -row[near]))][:10].tolist()  # ties: lower id first, as the index
        pos = int(positives[i])
        ranks.append(found.index(pos) + 1 if pos in found else 11)
        want = index.record(pos)["id"]
        fam = [_is_family(index.record(d)["id"], want) for d in found]
        family.append(fam.index(True) + 1 if any(fam) else 11)
    return np.array(ranks, np.float64), np.array(family, np.float64)


def phase_search(work: Path, model: str | None, budget_s: float, n_queries: int | None = None) -> dict:
    """In this (pinned) process: per query, MiniLM float32 encoding on the CPU + search of the
    synthetic index with the saved query vectors, at the index's defaults, then GRID."""
    import mlx.core as mx

    from mlxio import blas
    from mlxio.search.embed import Embedder
    from mlxio.weights.encoders import default_encoder_path, load_encoder

    mx.set_default_device(mx.cpu)
    started = time.perf_counter()
    index = Index(work / "synthetic")
    queries, q, q_off, positives = _queries(work)
    if n_queries is not None:
        queries, q_off, positives = queries[:n_queries], q_off[:n_queries + 1], positives[:n_queries]
    emb = Embedder(load_encoder(Path(model) if model else default_encoder_path(), dtype=mx.float32), 32, batch_size=1)
    for i, text in enumerate(queries[:20]):  # warm-up: compiled shapes, page cache
        emb.embed([text])
        index.search(text, q[q_off[i]:q_off[i + 1]], "semantic")
    encode_ms = []
    for text in queries:
        t = time.perf_counter()
        emb.embed([text])
        encode_ms.append((time.perf_counter() - t) * 1e3)
    wants = [index.record(int(p))["id"] for p in positives]
    grid = []
    settings = [(index.nprobe, index.candidates)] + [g for g in GRID if g != (index.nprobe, index.candidates)]
    for nprobe, candidates in settings:
        if grid and time.perf_counter() - started > budget_s:
            grid.append({"nprobe": nprobe, "candidates": candidates, "skipped": f"budget {budget_s:.0f} s spent"})
            continue
        ms, ranks, family = [], [], []
        cpu = time.process_time()
        for i, text in enumerate(queries):
            vec = q[q_off[i]:q_off[i + 1]]
            t = time.perf_counter()
            found = [d for d, _ in index.search(text, vec, "semantic", top_k=10, nprobe=nprobe, candidates=candidates)]
            ms.append((time.perf_counter() - t) * 1e3)
            pos = int(positives[i])
            ranks.append(found.index(pos) + 1 if pos in found else 11)
            fam = [_is_family(index.record(d)["id"], wants[i]) for d in found]
            family.append(fam.index(True) + 1 if any(fam) else 11)
        cpu_ms = (time.process_time() - cpu) * 1e3 / len(queries)
        grid.append({"nprobe": nprobe, "candidates": candidates, "mrr_index": _mrr(np.array(ranks, np.float64)),
                     "mrr_index_family": _mrr(np.array(family, np.float64)), "search_ms": ms,
                     "ranks": ranks, "family_ranks": family,
                     "search_cpu_ms_mean": cpu_ms, "peak_ram_gb": _rss_gb()})
        say(f"synthetic search {nprobe}/{candidates}: mrr {grid[-1]['mrr_index']:.4f} family "
            f"{grid[-1]['mrr_index_family']:.4f}, p50 {np.median(ms):.0f} ms, {time.perf_counter() - started:.0f} s")
    hybrid_ms = []
    for i, text in enumerate(queries[:50]):
        t = time.perf_counter()
        index.search(text, q[q_off[i]:q_off[i + 1]], "hybrid", top_k=10)
        hybrid_ms.append((time.perf_counter() - t) * 1e3)
    return {"encode_ms": encode_ms, "grid": grid, "hybrid_search_ms": hybrid_ms, "queries": len(queries),
            "cores": sorted(os.sched_getaffinity(0)), "blas": blas.status, "peak_ram_gb": _rss_gb(),
            "nprobe": index.nprobe, "candidates": index.candidates, "wall_s": time.perf_counter() - started}


def phase_edit(work: Path, model: str | None, corpus_file: Path | None) -> dict:
    """Edit one file of the synthetic index (see the module docstring); embedding on MLX's
    default device (the GPU where there is one), the rest on the CPU."""
    import mlx.core as mx

    from benchmarks.search_scale import load_corpus_file
    from mlxio.search import build
    from mlxio.search.embed import Embedder, assign_on_device, encode_on_device
    from mlxio.weights.encoders import default_encoder_path, load_encoder

    gpu = mx.default_device() == mx.gpu
    t = time.perf_counter()
    embedder = Embedder(load_encoder(Path(model) if model else default_encoder_path(),
                                     dtype=mx.float16 if gpu else mx.float32), 256, batch_size=32,
                        compiled=not gpu, pad_last=gpu)
    embedder.embed(["def warm(up):\n    return up"])
    model_load_s = time.perf_counter() - t
    embed_s = [0.0]

    def embed(texts, progress=None):
        t = time.perf_counter()
        out = embedder.embed(texts, progress=progress)
        embed_s[0] += time.perf_counter() - t
        return out

    if corpus_file is not None:
        docs = load_corpus_file(corpus_file)[0]
    else:
        from benchmarks.search_scale_embed import stdlib_corpus
        docs = stdlib_corpus(work)[0]
    idx_dir = work / "synthetic"
    out = {"model_load_s": model_load_s, "device": str(mx.default_device()), "edits": []}
    for step, action in enumerate(("edit", "edit", "delete")):
        embed_s[0] = 0.0
        t = time.perf_counter()
        old = Index(idx_dir)
        units = old.units()["units"]
        load_s = time.perf_counter() - t
        keys = sorted(units)
        target = keys[len(keys) // 2 + step]
        new = [{"id": f"edit{step}/{d['id']}", "code": d["code"], "path": d.get("path"), "line": d.get("line"),
                "name": d.get("name")} for d in docs[-UNIT_DOCS * (step + 1):][:UNIT_DOCS]]
        unit_list = []
        for key in keys:
            if key == target and action == "delete":
                continue
            if key == target:
                unit_list.append(build.Unit(key=key, digest=hashlib.sha256(f"{step}".encode()).hexdigest(),
                                            load=lambda new=new: new))
            else:
                unit_list.append(build.Unit(key=key, digest=units[key][0], load=list))
        report = build.apply_units("records", unit_list, idx_dir, embed, {k: old.manifest[k] for k in (
            "model", "max_doc_len", "max_query_len", "dim")}, old=old, source="synthetic", codec=old.codec.name,
            started=t, assign=assign_on_device if gpu else None, encode=encode_on_device if gpu else None)
        del old
        total = time.perf_counter() - t
        after = Index(idx_dir)
        out["edits"].append({"action": action, "functions": 0 if action == "delete" else len(new),
                             "seconds": total, "embed_s": embed_s[0], "index_load_s": load_s,
                             "index_s": total - embed_s[0], "segments": len(after.segments),
                             "merged": report.merged, "documents": after.n_docs,
                             "new_segment_bytes": _dir_bytes(after.gen / after.segments[-1].name)})
        say(f"{action}: {total:.2f} s ({embed_s[0]:.2f} s embedding), {len(after.segments)} segments")
        del after
    out["peak_ram_gb"] = _rss_gb()
    return out


# ----------------------------------------------------------------------------- the record


def record(src: Path, machine: str, command: str | None = None) -> list[dict]:
    """Issue 20's entries from the files a run left in `src` (stdlib_entry.json from
    `search_scale --corpus stdlib`, synth_build.json, synth_search.json, synth_edit.json)."""
    entries = []
    stdlib = json.loads((src / "stdlib_entry.json").read_text()) if (src / "stdlib_entry.json").exists() else None
    if stdlib is not None:
        entries.append(stdlib)
    if not (src / "synth_build.json").exists():
        return entries
    yb = json.loads((src / "synth_build.json").read_text())
    ys = json.loads((src / "synth_search.json").read_text()) if (src / "synth_search.json").exists() else None
    yd = json.loads((src / "synth_edit.json").read_text()) if (src / "synth_edit.json").exists() else None
    if (src / "synth_exact.json").exists():  # the exact scores of a separate (CPU) pass
        ye = json.loads((src / "synth_exact.json").read_text())
        yb |= {k: ye[k] for k in ("mrr_exact", "mrr_exact_family", "exact_s", "exact_device", "queries",
                                  "exact_check_max_abs_err", "exact_ranks", "exact_family_ranks")}
    entry = {"corpus": f"synthetic near-duplicates of the stdlib ({yb['functions']:,} functions, synthetic vectors)",
             "functions": yb["functions"], "real_functions": yb["real_functions"], "tokens": yb["tokens"],
             "units": yb["units"], "segments": yb["segments"], "machine": machine, "codec": yb["codec"],
             "centroids": yb["centroids"], "bytes_per_function": yb["bytes"] / yb["functions"],
             "build_s": yb["build_s"], "build_peak_ram_gb": yb["peak_ram_gb"], "build_workers": yb["workers"],
             "mrr_exact": yb["mrr_exact"], "mrr_exact_family": yb["mrr_exact_family"],
             "exact_bruteforce_s": yb["exact_s"], "exact_device": yb["exact_device"],
             "exact_check_max_abs_err": yb["exact_check_max_abs_err"], "mlx_enable_tf32": yb.get("mlx_enable_tf32"),
             "queries": yb["queries"],
             "files_bytes": yb["files"]}
    if ys is not None:
        n_e = len(yb.get("exact_ranks") or []) or yb["queries"]
        if n_e < ys["queries"]:  # exact scores for the first n_e queries only: the index on the same ones
            if "ranks" not in ys["grid"][0]:
                raise SystemExit("synth_search.json has no per-query ranks: re-run --phase search")
            for g in ys["grid"]:
                if "ranks" in g:
                    g |= {"mrr_index_all_queries": g["mrr_index"], "mrr_index_family_all_queries": g["mrr_index_family"],
                          "ranks": g["ranks"][:n_e], "family_ranks": g["family_ranks"][:n_e],
                          "mrr_index": _mrr(np.array(g["ranks"][:n_e], np.float64)),
                          "mrr_index_family": _mrr(np.array(g["family_ranks"][:n_e], np.float64))}
        main = ys["grid"][0]
        enc = np.array(ys["encode_ms"])
        total = enc + np.array(main["search_ms"])
        entry |= {"peak_ram_gb": main["peak_ram_gb"], "p50_ms": float(np.median(total)), "p95_ms": _pct(total, 95),
                  "p50_search_ms": float(np.median(main["search_ms"])), "p95_search_ms": _pct(main["search_ms"], 95),
                  "p50_query_encode_ms": float(np.median(enc)), "search_cpu_ms_mean": main["search_cpu_ms_mean"],
                  "latency_queries": ys["queries"], "mrr_queries": n_e,
                  "p50_hybrid_search_ms": float(np.median(ys["hybrid_search_ms"])),
                  "mrr_index": main["mrr_index"], "mrr_drop": yb["mrr_exact"] - main["mrr_index"],
                  "mrr_index_family": main["mrr_index_family"],
                  "mrr_drop_family": yb["mrr_exact_family"] - main["mrr_index_family"],
                  "mrr_drop_se": _paired_se(yb.get("exact_ranks"), main.get("ranks")),
                  "mrr_drop_family_se": _paired_se(yb.get("exact_family_ranks"), main.get("family_ranks")),
                  "nprobe": main["nprobe"], "candidates": main["candidates"],
                  "latency_cores": ys["cores"], "latency_blas": ys["blas"],
                  "grid": [{k: v for k, v in g.items() if k not in ("search_ms", "ranks", "family_ranks")} | (
                      {} if "skipped" in g else {"p50_search_ms": float(np.median(g["search_ms"])),
                                                 "p95_search_ms": _pct(g["search_ms"], 95),
                                                 "mrr_drop": yb["mrr_exact"] - g["mrr_index"],
                                                 "mrr_drop_family": yb["mrr_exact_family"] - g["mrr_index_family"]})
                      for g in ys["grid"]]}
    if yd is not None:
        first = yd["edits"][0]
        entry |= {"edit_one_file_s": first["seconds"], "edit_one_file_embed_s": first["embed_s"],
                  "edit_one_file_index_s": first["index_s"], "edit_functions": first["functions"],
                  "edit_model_load_s": yd["model_load_s"], "edit_device": yd["device"], "edits": yd["edits"],
                  "edit_peak_ram_gb": yd["peak_ram_gb"]}
    entry |= {
        "note": "VECTORS ARE SYNTHETIC: the base is the stdlib entry's pq64 index (every real function, "
                "embedded by MiniLM); each near-duplicate copies a random real function's compressed tokens "
                f"with {SWAP:.0%} of token positions swapped for other real tokens and one PQ byte of "
                f"{NOISY:.0%} of tokens altered, and its text with up to {RENAMES} identifiers renamed; "
                "build_s: the whole synthetic build from codes (renaming and record compression in "
                "build_workers processes, one segment written by index.Writer, inverted lists, BM25, commit; "
                "no embedding) excluding the exact scoring; mrr_exact: brute-force MaxSim of the stdlib "
                "run's query vectors over every function's decompressed vectors (the synthetic vectors ARE "
                "decompressed codes, so mrr_drop measures candidate generation alone; the stdlib entry "
                "measures compression + candidates against the float vectors), on exact_device; mrr_* "
                "counts only the original function, *_family the original or any near-duplicate of it; "
                "latency: one query at a time in a child pinned with os.sched_setaffinity to latency_cores "
                "(one BLAS thread per library): MiniLM float32 query encoding on the CPU + Index.search; "
                "peak_ram_gb: that child's max RSS (memory-mapped pages it touched included); edit_one_file_s: "
                "one 20-function synthetic file replaced by 20 real stdlib functions through "
                "build.apply_units (index load, units diff, MiniLM embedding on edit_device, compression, a new "
                "segment, tombstones, hashing, atomic commit); edits: that, a second edit and a deletion",
        "command": command or "bash .gpu/search/run.sh (python -m benchmarks.search_scale_synth --work W --phase build "
                   f"--synthetic {yb['functions']}; --phase search (pinned); --phase edit) after "
                   "python -m benchmarks.search_scale --corpus stdlib --work W; then "
                   "python -m benchmarks.search_scale_synth --record DIR",
    }
    entries.append(entry)
    return entries


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=Path("/tmp/search_scale_stdlib"))
    ap.add_argument("--phase", choices=("build", "exact", "search", "edit"))
    ap.add_argument("--queries", type=int, default=None, help="exact / search: the first N queries (default all)")
    ap.add_argument("--max-minutes", type=float, default=None, help="exact: start no query group after this")
    ap.add_argument("--exact-gb", type=float, default=2.0, help="exact: GB of real-token similarities per query group")
    ap.add_argument("--synthetic", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--no-exact", action="store_true", help="build: skip the exact scores (timing runs)")
    ap.add_argument("--model", default=None, help="encoder directory (default: the embedded MiniLM)")
    ap.add_argument("--corpus-file", type=Path, default=None, help="edit: the stdlib corpus file of the stdlib run")
    ap.add_argument("--query-cores", type=int, default=2)
    ap.add_argument("--blas-threads", type=int, default=1)
    ap.add_argument("--search-budget", type=float, default=240.0, help="search: seconds before GRID stops")
    ap.add_argument("--pinned", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--record", type=Path, default=None, help="folder of a run's JSON files: write the entries")
    ap.add_argument("--machine", default="h100")
    ap.add_argument("--command", default=None, help="--record: the command line to record")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.record is not None:
        entries = record(args.record, args.machine, args.command)
        out = args.out or ROOT / "benchmarks" / "results" / args.machine / "search_scale.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(entries, indent=1) + "\n")
        print(json.dumps([{k: v for k, v in e.items() if k not in ("grid", "files_bytes", "sweep", "files", "edits")}
                          for e in entries], indent=1))
        return
    if args.phase == "build":
        result = phase_build(args.work, args.synthetic, args.workers, not args.no_exact)
    elif args.phase == "exact":
        result = phase_exact(args.work, args.synthetic, args.workers, args.queries or len(_queries(args.work)[0]),
                             args.exact_gb, args.max_minutes)
    elif args.phase == "edit":
        result = phase_edit(args.work, args.model, args.corpus_file)
    elif args.pinned:
        result = phase_search(args.work, args.model, args.search_budget, args.queries)
    else:  # re-run pinned to the first --query-cores cores with --blas-threads BLAS threads
        cores = sorted(os.sched_getaffinity(0))[:args.query_cores]
        threads = str(args.blas_threads or len(cores))
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads,
               "MKL_NUM_THREADS": threads, "PYTHONPATH": os.pathsep.join(filter(None, (
                   str(ROOT), os.environ.get("PYTHONPATH"))))}
        subprocess.run([sys.executable, "-m", "benchmarks.search_scale_synth", *(argv or sys.argv[1:]), "--pinned"],
                       check=True, cwd=ROOT, env=env, preexec_fn=lambda: os.sched_setaffinity(0, cores))
        return
    path = args.work / f"synth_{args.phase}.json"
    path.write_text(json.dumps(result) + "\n")
    say(f"wrote {path}")


if __name__ == "__main__":
    main()
