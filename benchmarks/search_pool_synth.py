"""Token pooling on a 100,000-function synthetic index: its bytes and semantic MRR@10 at pool
factors 1, 2 and 3, from the real functions of `benchmarks.search_languages`.

    python -m benchmarks.search_pool_synth [--work runs/bench_languages] [--functions 100000]
        [--pool_factors 1,2,3] [--languages python,go,...] [--cache_dir runs/cache]

Real functions: every language's held-out candidates of search_languages (their document vectors
from its --work folder: run it first, or they are embedded here), and its queries (the doc
comments' first sentences, each with its one known positive). Per factor:
1. the real functions' token vectors are pooled (`mlxio.search.pooling`), a pq codec is trained
   on them as `code_search index` trains one (its centroid count set by the synthetic index's
   token count), and they are compressed and written as an index (`real`);
2. the synthetic index is built from it as `search_scale_synth --phase build` builds its
   million (no exact scores): the real functions, then near-duplicates up to --functions, each
   copying a random real function's compressed tokens with 15% of the positions swapped for
   other real tokens and one PQ byte of 5% altered, and its text with up to 3 identifiers
   renamed. A near-duplicate of a pooled function stands for a pooled near-duplicate: pooling
   is not run again on synthetic vectors (compressing 10^7 new tokens would take hours here);
3. every query searches both indexes (semantic, top 10, the index's default settings).
Reported per factor: tokens, centroids, bytes by part (`store.bytes_by_part`), MRR@10 of the
positive, and of its family (the positive or any near-duplicate of it: the near-duplicates
compete with it), with the paired change from factor 1. Writes
benchmarks/results/<machine>/search_pool_synth.json (--out to override).
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import search_languages as sl
from benchmarks.common import write_result
from mlxio.data import package_sources

SEED = 0


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def real_functions(args, encoder) -> dict:
    """The languages' real functions and queries: {"ids", "texts", "vectors" (float16 [n_i, D]
    each), "queries", "query_vectors" (float32), "positives" (index into ids), "languages"}."""
    from mlxio.search.embed import Embedder

    out = {k: [] for k in ("ids", "texts", "vectors", "queries", "query_vectors", "positives", "languages")}
    for language in args.languages:
        _, _, task = sl.language_task(language, args)
        candidates = list(task.candidates)
        vectors = sl.embedded(Path(args.work) / language, encoder, candidates, args.max_doc_len)
        first = len(out["ids"])
        out["ids"] += [f"{language}/{j}" for j in range(len(candidates))]
        out["texts"] += candidates
        out["vectors"] += vectors
        out["queries"] += list(task.queries)
        out["query_vectors"] += [v.astype(np.float32) for v in
                                 Embedder(encoder, args.max_query_len, 32).embed(list(task.queries))]
        out["positives"] += [first + p for p in task.positives]
        out["languages"].append({"language": language, "functions": len(candidates), "queries": len(task.queries)})
        say(f"{language}: {len(candidates)} functions, {len(task.queries)} queries")
    return out


def write_real_index(index_dir: Path, real: dict, vectors: list[np.ndarray], functions: int, meta: dict) -> dict:
    """The real functions' (pooled) vectors compressed as `code_search index` would for an index
    of `functions` functions of their mean length (`build`'s sample sizes and centroid count),
    written as one segment; returns the codec's settings."""
    from mlxcore.retrieval import codec as codec_mod
    from mlxio.search import build, store
    from mlxio.search.writer import Writer, segment_name, write_generation

    pool = np.concatenate(vectors).astype(np.float32)
    k = codec_mod.n_centroids_for(int(functions * len(pool) / len(vectors)))
    n_kmeans = min(build.KMEANS_TOKENS_PER_CENTROID * k, build.KMEANS_TOKENS_MAX)
    n_resid = min(build.SAMPLE_TOKENS, len(pool) // 2)
    pick = np.random.default_rng(SEED).permutation(len(pool))[:n_resid + n_kmeans]
    resid, sample = (pool[np.sort(p)] for p in (pick[:n_resid], pick[n_resid:]))
    t = time.perf_counter()
    codec = codec_mod.train_named(build.DEFAULT_CODEC, sample, k, SEED, residual_sample=resid)
    train_s = time.perf_counter() - t
    cids, codes = codec.encode(pool)
    shutil.rmtree(index_dir, ignore_errors=True)
    tmp, final = store.new_generation(index_dir)
    writer = Writer(tmp / segment_name(1), codec)
    bounds = np.cumsum([0, *(len(v) for v in vectors)])
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        writer.add({"id": real["ids"][i], "code": real["texts"][i], "path": real["ids"][i].split("/")[0],
                    "line": None, "name": None}, cids[a:b], codes[a:b])
    write_generation(tmp, final, codec, [writer.finish()], {"kind": "records", "units": {}},
                     {**meta, "units_kind": "records", "source": "search_languages candidates",
                      "fusion": {"alpha": None, "source": "none"}, "search": {}})
    return {"centroids": k, "kmeans_tokens": len(sample), "residual_tokens": len(resid), "codec_train_s": train_s,
            "encode_s": time.perf_counter() - t - train_s}


def ranks(index, real: dict) -> tuple[list[float], list[float]]:
    """Reciprocal ranks (0 beyond 10) of each query's positive and of its family's first member."""
    from benchmarks.search_scale_synth import _is_family

    found = index.search_many(real["queries"], real["query_vectors"], "semantic", top_k=10)
    rr, family = [], []
    for hits, pos in zip(found, real["positives"], strict=True):
        ids = [index.record(d)["id"] for d, _ in hits]
        want = real["ids"][pos]
        rr.append(1.0 / (ids.index(want) + 1) if want in ids else 0.0)
        member = [_is_family(i, want) for i in ids]
        family.append(1.0 / (member.index(True) + 1) if any(member) else 0.0)
    return rr, family


def measure(index_dir: Path, real: dict, base: dict | None) -> tuple[dict, dict]:
    """An index's tokens, bytes and MRR@10 (+ the paired change from `base`'s reciprocal ranks)."""
    from mlxio.search import store
    from mlxio.search.index import Index

    index = Index(index_dir)
    t = time.perf_counter()
    rr, family = ranks(index, real)
    search_s = time.perf_counter() - t
    parts = store.bytes_by_part(index.gen)
    entry = {"functions": index.n_docs, "tokens": index.n_tokens, "centroids": len(index.codec.centroids),
             "bytes": sum(parts.values()), "token_bytes": parts["token codes"] + parts["centroid ids"], "parts": parts,
             "semantic": {"mrr@10": round(float(np.mean(rr)), 4)}, "family_mrr@10": round(float(np.mean(family)), 4),
             "search_s": round(search_s, 1), "nprobe": index.nprobe, "candidates": index.candidates}
    if base is not None:
        entry["semantic_minus_x1"] = sl.paired_difference(rr, base["rr"])
        entry["family_minus_x1"] = sl.paired_difference(family, base["family"])
    return entry, {"rr": rr, "family": family}


def run_factor(factor: int, real: dict, args, meta: dict, base: dict) -> dict:
    from benchmarks.search_scale_synth import phase_build
    from mlxio.search.pooling import pool_tokens

    work = Path(args.work) / f"pool_synth-x{factor}"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    vectors = [pool_tokens(v, factor) for v in real["vectors"]]
    pool_s = time.perf_counter() - t0
    codec = write_real_index(work / "index", real, vectors, args.functions, meta)
    say(f"x{factor}: real index written ({codec['centroids']} centroids; pooling {pool_s:.0f} s, codec "
        f"{codec['codec_train_s']:.0f} s, compression {codec['encode_s']:.0f} s)")
    offsets = np.cumsum([0, *(len(q) for q in real["query_vectors"])])
    (work / "queries.json").write_text(json.dumps(real["queries"]))
    np.savez(work / "queries_dev.npz", tokens=np.concatenate(real["query_vectors"]), offsets=offsets,
             positives=np.asarray(real["positives"], np.int64))
    built = phase_build(work, args.functions, args.workers, exact_scores=False)
    say(f"x{factor}: synthetic index of {args.functions} functions in {built['build_s']:.0f} s")
    entry = {"pool_factor": factor, "pool_s": round(pool_s, 1), **{k: round(v, 1) if isinstance(v, float) else v
                                                                 for k, v in codec.items()},
             "synthetic_build_s": round(built["build_s"], 1)}
    entry["real"], base_real = measure(work / "index", real, base.get("real"))
    entry["synthetic"], base_synth = measure(work / "synthetic", real, base.get("synthetic"))
    if factor == 1:
        base.update(real=base_real, synthetic=base_synth)
    if not args.keep:
        shutil.rmtree(work / "synthetic", ignore_errors=True)
    entry["seconds"] = round(time.perf_counter() - t0, 1)
    say(f"x{factor}: {entry['synthetic']['bytes'] / 1e6:.0f} MB, MRR@10 {entry['synthetic']['semantic']['mrr@10']:.4f} "
        f"(family {entry['synthetic']['family_mrr@10']:.4f}), {entry['seconds']:.0f} s")
    return entry


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--languages", default=",".join(package_sources.HELDOUT))
    parser.add_argument("--functions", type=int, default=100_000)
    parser.add_argument("--pool_factors", default="1,2,3")
    parser.add_argument("--max_queries", type=int, default=200, help="per language, as search_languages")
    parser.add_argument("--max_candidates", type=int, default=1000, help="per language, as search_languages")
    parser.add_argument("--max_doc_len", type=int, default=256)
    parser.add_argument("--max_query_len", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1, help="processes renaming the near-duplicates' text")
    parser.add_argument("--keep", action="store_true", help="keep the synthetic indexes in --work")
    parser.add_argument("--cache_dir", type=Path, default=Path("runs/cache"))
    parser.add_argument("--work", type=Path, default=Path("runs/bench_languages"))
    parser.add_argument("--machine", default="cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from mlxio.weights.encoders import default_encoder_path, load_encoder, model_digest

    args.languages = args.languages.split(",")
    factors = sorted({1, *(int(f) for f in args.pool_factors.split(","))})
    started = time.perf_counter()
    encoder = load_encoder(str(default_encoder_path()))
    real = real_functions(args, encoder)
    meta = {"model": str(default_encoder_path()), "model_digest": model_digest(encoder.path),
            "max_doc_len": args.max_doc_len, "max_query_len": args.max_query_len, "dim": int(real["vectors"][0].shape[1])}
    base: dict = {}
    entries = [run_factor(f, real, args, meta, base) for f in factors]
    out = args.out or Path("benchmarks/results") / args.machine / "search_pool_synth.json"
    write_result("search_pool_synth", {
        "model": "all-MiniLM-L6-v2", "functions": args.functions, "real_functions": len(real["ids"]),
        "queries": len(real["queries"]), "languages": real["languages"], "pool_factors": factors,
        "factors": entries, "seconds": round(time.perf_counter() - started, 1),
        "command": "python -m benchmarks.search_pool_synth " + " ".join(argv if argv is not None else sys.argv[1:]),
    }, args.machine, path=out)
    print(out)


MEASURES = ("Family MRR@10 counts the positive or any near-duplicate of it: the retrieval measure here. Positive-only "
            "MRR@10 counts a near-duplicate above the positive as a miss, so it measures how the index separates the "
            "positive from its own copies.")


def rows_of(payload: dict) -> list[dict]:
    """`search_languages.pooling_section` entries: the synthetic index by family MRR@10 (the
    positive or a near-duplicate of it) and by the positive alone, then the real-only index."""
    def family(entry: dict) -> dict:
        return {**entry, "semantic": {"mrr@10": entry["family_mrr@10"]}, "semantic_minus_x1": entry.get("family_minus_x1")}

    synthetic = [e["synthetic"] for e in payload["factors"]]
    factors = [str(e["pool_factor"]) for e in payload["factors"]]
    n = f"{payload['functions']:,}"
    return [{"index": f"synthetic, {n} functions: family", "pooling": dict(zip(factors, map(family, synthetic), strict=True))},
            {"index": f"synthetic, {n} functions: positive only", "pooling": dict(zip(factors, synthetic, strict=True)),
             "parts": False},
            {"index": f"real only, {payload['real_functions']:,} functions",
             "pooling": {f: e["real"] for f, e in zip(factors, payload["factors"], strict=True)}}]


def guide_section(payload: dict, machine: str) -> list[str]:
    """docs/code-search.md's pooling table of a search_pool_synth.json (no per-part table)."""
    return [f"The {payload['functions']:,}-function synthetic index and the real functions it is built from "
            f"({machine}, {payload['queries']:,} queries; benchmarks/search_pool_synth.py). {MEASURES}",
            *sl.pooling_section(rows_of(payload), payload["pool_factors"], label="index", parts=False)]


def section(payload: dict, machine: str) -> list[str]:
    """The docs' tables of a search_pool_synth.json (docs/performance.md, via benchmarks.make_table)."""
    rows = rows_of(payload)
    out = [f"### Token pooling on a {payload['functions']:,}-function synthetic index ({machine}, {payload['model']}, "
           "benchmarks/search_pool_synth.py)", "",
           f"{payload['real_functions']:,} real functions (search_languages' candidates in "
           f"{len(payload['languages'])} languages) and their {payload['queries']:,} queries, each with one known "
           "positive; the synthetic index adds near-duplicates of them (copied compressed tokens with 15% swapped "
           "and 5% altered, identifiers renamed), built per factor from the pooled real functions. " + MEASURES]
    out += sl.pooling_section(rows, payload["pool_factors"], label="index")
    return out + ["", "The real-only index uses the synthetic index's codec (its centroid count set by the synthetic "
                  f"index's tokens). `python -m benchmarks.search_pool_synth --functions {payload['functions']} "
                  f"--pool_factors {','.join(map(str, payload['pool_factors']))} --languages "
                  f"{','.join(e['language'] for e in payload['languages'])}` (after "
                  f"search_languages, whose document vectors it reuses): {payload['seconds'] / 60:.0f} min.", ""]


if __name__ == "__main__":
    main()
