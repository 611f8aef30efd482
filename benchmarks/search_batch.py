"""Batched search: `code_search search --queries` over N queries and N functions, against the
same queries searched one at a time; writes benchmarks/results/<machine>/search_batch.json.

    PYTHONPATH=. python -m benchmarks.search_batch [--functions 1000] [--machine cpu]

Corpus: a seeded sample of N documented standard-library functions (`pairs.mine_corpus`), each
with its docstring's first sentence as a query, so N queries over N functions (the issue's
1,098 x 1,098 run was held-out package pairs of the same kind). Indexed by `code_search index`
with the embedded MiniLM (256 document tokens, default pq codec and search settings).

Measured in one process, on whatever cores the machine gives it (`load_avg` records how busy
it was; wall and CPU seconds both):
- batched: what the CLI `code_search search --index I --queries Q --output R --mode M` does
  (mlxio.search.query_files: read the queries, search, write the rankings), end to end
  (model load, query encoding in batches of 32, `Index.search_many`), per mode;
- one at a time (the peer, what `--queries` did before): the same batch-encoded query vectors,
  `Index.search` per query; `identical`: every query's (document, score) list equal, bit for bit
  (what BLAS kernels that round alike give), `same_documents`: the same documents in the same
  order, `max_score_difference` (what the search promises: at most `index_scoring.score_tolerance`);
- single-query latency: `Index.search` (one product per ~1,024-token block, `index_scoring.product`,
  one BLAS thread per worker) against the re-rank before batched
  search (`legacy_search`: one plain product per ~1,024-token chunk, allocating its arrays), as
  it ran (OpenBLAS's default threads) and on one BLAS thread, interleaved query by query;
- encoding alone: how many queries rank differently when each is encoded alone (batch of 1,
  its own padding) rather than in a batch: the encoder's rounding, not the search's.
This machine cannot measure the H100 host's figure (no GPU here); the issue's 64-79 s there
was the one-at-a-time path.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, load, machine, versions
from mlxcore.retrieval import index_scoring
from mlxio import blas
from mlxio.search.index import Index, _top

ROOT = Path(__file__).resolve().parent.parent


def prepare(work: Path, n: int, seed: int = 0) -> tuple[Path, Path, float | None]:
    """(index dir, queries JSONL, seconds to build it or None when reused) for n stdlib pairs."""
    from mlxio.data import pairs
    from mlxio.search.searcher import build_index
    from mlxio.weights.encoders import default_encoder_path

    work.mkdir(parents=True, exist_ok=True)
    corpus = pairs.mine_corpus(cache_dir=work / "mine", extras=False)
    pick = np.random.default_rng(seed).choice(len(corpus.pairs), n, replace=False)
    chosen = [corpus.pairs[i] for i in sorted(pick)]
    docs = "".join(json.dumps({"id": f"{p.source}:{p.line}:{p.name}", "code": p.code}) + "\n" for p in chosen)
    queries = "".join(json.dumps({"id": i, "query": p.query}) + "\n" for i, p in enumerate(chosen))
    corpus_path, queries_path, index = work / f"corpus_{n}.jsonl", work / f"queries_{n}.jsonl", work / f"index_{n}"
    if corpus_path.is_file() and corpus_path.read_text() == docs and (index / "CURRENT").is_file():
        return index, queries_path, None
    corpus_path.write_text(docs)
    queries_path.write_text(queries)
    t = time.perf_counter()
    build_index(corpus_path, str(default_encoder_path()), index, rebuild=True, progress=False)
    return index, queries_path, time.perf_counter() - t


def legacy_maxsim(index: Index, q: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """The re-rank before batched search: one product per chunk of ~CHUNK_TOKENS tokens."""
    out = np.zeros(len(docs), np.float32)
    q = index.codec.rotate(q)
    for seg, _, where, local in index._by_segment(np.asarray(docs, np.int64)):
        positions, starts = seg.tokens(local)
        ends = np.r_[starts[1:], len(positions)]
        for lo, hi in index_scoring.doc_chunks(ends - starts):
            rows = positions[starts[lo]:ends[hi - 1]]
            vectors, norms = index.codec.decode_rotated(seg.cids[rows], seg.residuals[rows], normalise=False)
            sims = vectors @ q.T
            sims /= norms[:, None]
            out[where[lo:hi]] = np.maximum.reduceat(sims, starts[lo:hi] - starts[lo], axis=0).mean(axis=1)
    return out


def legacy_search(index: Index, q: np.ndarray, top_k: int = 10) -> list[tuple[int, float]]:
    pool = index.generate(q, index.nprobe, max(index.candidates, top_k))
    return _top(pool, legacy_maxsim(index, q, pool), top_k)


def timed(fn):
    """(result, wall seconds, CPU seconds of this process, all threads)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--functions", type=int, default=1000, help="functions indexed = queries searched")
    ap.add_argument("--work", type=Path, default=Path("/tmp/search_batch"))
    ap.add_argument("--machine", default="cpu")
    ap.add_argument("--latency-queries", type=int, default=200, help="queries timed one at a time, new vs legacy")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cli-only", action="store_true", help="time the CLI per mode and stop (no one-at-a-time "
                                                            "peer, no single-query latency)")
    args = ap.parse_args(argv)
    if args.functions < 1 or args.latency_queries < 1:
        raise SystemExit("--functions and --latency-queries must be >= 1")
    from mlxio.search import query_files
    from mlxio.search.searcher import Searcher

    index_dir, queries_path, build_s = prepare(args.work, args.functions)
    rows = [json.loads(line) for line in queries_path.read_text().splitlines()]
    texts = [r["query"] for r in rows]
    result: dict = {"functions": args.functions, "queries": len(texts), "index_build_s": build_s,
                    "load_avg_start": os.getloadavg(), "cores": len(os.sched_getaffinity(0)), "modes": {}}
    searcher = Searcher(index_dir)
    index = searcher.index
    result.update(tokens=int(index.n_tokens), nprobe=index.nprobe, candidates=index.candidates, codec=index.codec.name)
    vecs = [v.astype(np.float32) for v in searcher.embedder.embed(texts)]
    for mode in ("semantic", "hybrid"):
        out = args.work / f"rankings_{mode}.jsonl"
        _, wall, cpu = timed(lambda mode=mode, out=out: query_files.write_rankings(out, query_files.ranking_lines(
            index_dir, query_files.read_queries(queries_path), mode)))  # `code_search search --queries --output`'s work
        if args.cli_only:
            result["modes"][mode] = {"cli_wall_s": wall, "cli_cpu_s": cpu}
            continue
        many, search_wall, search_cpu = timed(lambda mode=mode: index.search_many(texts, vecs, mode))
        one, one_wall, one_cpu = timed(lambda mode=mode: [index.search(t, v, mode) for t, v in zip(texts, vecs, strict=True)])
        result["modes"][mode] = {
            "cli_wall_s": wall, "cli_cpu_s": cpu, "search_many_wall_s": search_wall, "search_many_cpu_s": search_cpu,
            "one_at_a_time_wall_s": one_wall, "one_at_a_time_cpu_s": one_cpu, "speedup_search": one_wall / search_wall,
            "identical": many == one, "queries_differing": sum(a != b for a, b in zip(many, one, strict=True)),
            "same_documents": [[d for d, _ in hits] for hits in many] == [[d for d, _ in hits] for hits in one],
            "max_score_difference": max((abs(x - y) for a, b in zip(many, one, strict=True)
                                         for (_, x), (_, y) in zip(a, b, strict=False)), default=0.0),
            "cli_rankings_match": [json.loads(line)["doc_ids"] for line in out.read_text().splitlines()]
                                  == [[index.record(d)["id"] for d, _ in hits] for hits in many],
        }
        print(mode, json.dumps(result["modes"][mode]), file=sys.stderr, flush=True)
    if args.cli_only:
        return finish(result, args)
    _, encode_wall, encode_cpu = timed(lambda: searcher.embedder.embed(texts))
    result["encode_batched_wall_s"], result["encode_batched_cpu_s"] = encode_wall, encode_cpu
    new_ms, old_ms, old1_ms, alone_ms, differ = [], [], [], [], 0
    for i, (text, v) in enumerate(zip(texts[:args.latency_queries], vecs, strict=False)):
        t = time.perf_counter()
        alone = searcher.embedder.embed([text])[0].astype(np.float32)
        alone_ms.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        index.search(text, v, "semantic")
        new_ms.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        legacy_search(index, v)
        old_ms.append((time.perf_counter() - t) * 1e3)
        with blas.one_thread():
            t = time.perf_counter()
            legacy_search(index, v)
            old1_ms.append((time.perf_counter() - t) * 1e3)
        differ += [d for d, _ in index.search(text, alone, "semantic")] != [d for d, _ in index.search(text, v, "semantic")]
        if i == 0:
            new_ms, old_ms, old1_ms, alone_ms = [], [], [], []  # warm-up
    result["single_query"] = {
        "queries": len(new_ms), "p50_search_ms": float(np.median(new_ms)), "p50_legacy_search_ms": float(np.median(old_ms)),
        "p50_legacy_one_blas_thread_ms": float(np.median(old1_ms)),
        "p95_search_ms": float(np.percentile(new_ms, 95)), "p95_legacy_search_ms": float(np.percentile(old_ms, 95)),
        "p95_legacy_one_blas_thread_ms": float(np.percentile(old1_ms, 95)),
        "p50_encode_alone_ms": float(np.median(alone_ms)),
        "rankings_differing_when_encoded_alone": int(differ),
        "note": "semantic mode, batch-encoded query vectors; new, legacy (OpenBLAS's default threads, as the "
                "previous code ran) and legacy on one BLAS thread interleaved query by query; "
                "rankings_differing_when_encoded_alone: top-10 ids of a query encoded alone vs in a batch",
    }
    return finish(result, args)


def finish(result: dict, args) -> dict:
    """`result` with the machine and command, written to --out (default: results/<machine>/search_batch.json;
    `--cli-only`: appended to the list in search_batch_cli.json)."""
    result.update(load_avg_end=os.getloadavg(), machine=machine(), versions=versions(),
                  blas_threads=os.environ.get("OPENBLAS_NUM_THREADS", "default"),
                  command=f"PYTHONPATH=. python -m benchmarks.search_batch --functions {args.functions} "
                          f"--machine {args.machine}" + (" --cli-only" if args.cli_only else ""))
    path = args.out or ROOT / "benchmarks" / "results" / args.machine / ("search_batch_cli.json" if args.cli_only
                                                                           else "search_batch.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = result
    if args.cli_only:  # repeats of the CLI alone accumulate: a list of runs
        earlier = json.loads(path.read_text()) if path.is_file() else []
        saved = (earlier if isinstance(earlier, list) else [earlier]) + [result]
    path.write_text(json.dumps(saved, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


def _same_results(mode: dict) -> str:
    """The batched-search table's last column: bit for bit, or the same documents with the largest
    score difference (what the search promises: within `scoring.score_tolerance`), or not."""
    if mode["identical"]:
        return "yes, bit for bit"
    if mode.get("same_documents"):
        return f"the same documents, scores within {mode['max_score_difference']:.1e}"
    return "NO"


def results_section() -> list[str]:
    """`code_search search --queries`: batched against one query at a time (<machine>/search_batch.json)."""
    out = []
    for host in ("cpu", "h100", "h200"):
        b = load(host, "search_batch")
        if not b:
            continue
        out += [f"### Batched search: {b['queries']:,} queries over {b['functions']:,} functions ({host}, "
                f"{b['cores']} cores, benchmarks/search_batch.py)", "",
                "| mode | CLI end to end s (wall / CPU) | re-rank batched s | one at a time s | same results |",
                "|---|---|---|---|---|"]
        for mode, m in b["modes"].items():
            out.append(f"| {mode} | {m['cli_wall_s']:.1f} / {m['cli_cpu_s']:.1f} | {m['search_many_wall_s']:.1f} "
                       f"| {m['one_at_a_time_wall_s']:.1f} | {_same_results(m)} |")
        cli = load(host, "search_batch_cli")
        if cli:  # the CLI alone (`--cli-only`), each run appended: the spread of one run to the next
            runs = cli if isinstance(cli, list) else [cli]
            out += ["", f"The CLI alone, {len(runs)} runs (`--cli-only`, {host}/search_batch_cli.json): "
                    + "; ".join(f"{mode} " + ", ".join(f"{r['modes'][mode]['cli_wall_s']:.1f}" for r in runs) + " s"
                                for mode in runs[0]["modes"])
                    + " (load " + ", ".join(f"{r['load_avg_start'][0]:.1f}" for r in runs) + " at their starts)."]
        workers = json.loads(path.read_text()) if (path := RESULTS.parent.parent / "dev" / "results" / host
                                                    / "search_workers.json").exists() else None
        if workers:
            out += ["", "By scoring threads (dev/search_workers.py): 300 queries "
                    + ", ".join(f"{t} s" for t in workers["search_many_300_s"].values()) + "; one query's p50 "
                    + ", ".join(f"{t} ms" for t in workers["single_p50_ms"].values()) + " on "
                    + " / ".join(workers["single_p50_ms"]) + " threads."]
        s = b["single_query"]
        legacy1 = s.get("p50_legacy_one_blas_thread_ms")
        out += ["", f"One query at a time (semantic, p50): {s['p50_search_ms']:.0f} ms, against "
                f"{s['p50_legacy_search_ms']:.0f} ms for the re-rank before batched search with OpenBLAS's default threads"
                + (f" and {legacy1:.0f} ms on one BLAS thread" if legacy1 else "") +
                f" (load {b['load_avg_start'][0]:.1f} at the start; CPU seconds are this process's).", ""]
    return out


if __name__ == "__main__":
    main()
