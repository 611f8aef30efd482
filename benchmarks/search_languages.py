"""Code search per language on held-out packages, and what token pooling does to the index:
each language's documented functions (`mlxio.data.package_sources.HELDOUT`: PyPI, npm and
Debian packages, mined by `mlxio.data.pairs` with tree-sitter beyond Python) are indexed as
`code_search index` does (pq codec), then searched by their doc comments' first sentences.

    python -m benchmarks.search_languages [--model DIR] [--languages python,go] [--pool_factors 1,2,3]
        [--max_queries 200] [--max_candidates 1000] [--cache_dir runs/cache] [--work runs/bench_languages]
        [--per_query] [--out FILE]

Per language: MRR@10, P@1 and Recall@10 of the index's semantic, BM25 and hybrid (RRF) rankings
with --model (default: the embedded all-MiniLM-L6-v2), the queries and candidates (every
documented function of the packages, then their undocumented ones, topped up with their short
ones, a seeded sample of --max_candidates kept with every query's positive: `pairs.eval_set`
with every file held out), and each package's licence.
With several --pool_factors, an index per factor from the same document vectors
(`mlxio.search.pooling`): its bytes (all files, and the token payload alone) and its semantic
MRR@10. Writes benchmarks/results/<machine>/search_languages.json (--out to override) after
every language; run again, it goes on with the languages it lacks (document vectors are kept in
--work).
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.common import write_result
from mlxio.data import package_sources, pairs, polyglot

MODES = (("semantic", "interp"), ("bm25", "interp"), ("hybrid", "rrf"))


def suffixes_of(language: str) -> tuple[str, ...]:
    """The file suffixes mined for `language` (TypeScript: .ts and .tsx)."""
    return tuple(s for s in polyglot.SUFFIXES if polyglot.LANGUAGE_NAMES[polyglot.language_of(f"x{s}")] == language)


def metrics(ranked: list[list[str]], positives: list[str], per_query: bool = False) -> dict:
    """MRR@10, P@1 and Recall@10 of ranked id lists against each query's one positive id; with
    `per_query`, also "rr": each query's reciprocal rank (0 beyond rank 10), in query order."""
    ranks = [hits.index(p) + 1 if p in hits[:10] else None for hits, p in zip(ranked, positives, strict=True)]
    n = max(len(ranks), 1)
    out = {"mrr@10": round(sum(1.0 / r for r in ranks if r) / n, 4),
           "p@1": round(sum(r == 1 for r in ranks) / n, 4),
           "recall@10": round(sum(r is not None for r in ranks) / n, 4)}
    if per_query:
        out["rr"] = [round(1.0 / r, 4) if r else 0.0 for r in ranks]
    return out


def index_bytes(index_dir: Path) -> dict:
    """Bytes of the live generation: every file, and the token payload (centroid ids +
    residual codes) alone."""
    from mlxio.search import store

    gen = store.current(index_dir)
    files = [p for p in gen.rglob("*") if p.is_file()]
    tokens = sum(p.stat().st_size for p in files if p.name in ("cids.bin", "residuals.bin"))
    return {"bytes": sum(p.stat().st_size for p in files), "token_bytes": tokens}


def embedded(work: Path, encoder, texts: list[str], max_length: int) -> list[np.ndarray]:
    """float16 token vectors of `texts`, kept in work/vectors-KEY.npz for a resumed run (keyed by
    the model's weights, the texts and the length)."""
    import hashlib

    from mlxio.search.embed import Embedder
    from mlxio.weights.encoders import model_digest

    key = hashlib.sha256(json.dumps([model_digest(encoder.path), max_length, texts]).encode()).hexdigest()[:16]
    path = work / f"vectors-{key}.npz"
    if path.is_file():
        with np.load(path) as z:
            flat, offsets = z["flat"], z["offsets"]
        return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    vectors = Embedder(encoder, max_length, 32).embed(texts)
    offsets = np.cumsum([0, *(len(v) for v in vectors)])
    np.savez(work / f".{path.name}", flat=np.concatenate(vectors), offsets=offsets)
    (work / f".{path.name}").rename(path)
    return vectors


def evaluate_language(language: str, encoder, model: str, args) -> dict:
    from mlxio.search import build
    from mlxio.search.embed import Embedder
    from mlxio.search.index import Index
    from mlxio.search.pooling import pooled
    from mlxio.weights.encoders import model_digest

    started = time.perf_counter()
    sources = [package_sources.fetch_entry(e, args.cache_dir) for e in package_sources.HELDOUT[language]]
    corpus = pairs.mine_corpus([root for _, root in sources], suffixes=suffixes_of(language))
    task = pairs.eval_set(corpus, eval_fraction=1.0, min_queries=0, min_candidates=args.max_candidates,
                          max_queries=args.max_queries, max_candidates=args.max_candidates, strict=False)
    work = Path(args.work) / language
    work.mkdir(parents=True, exist_ok=True)
    corpus_file = work / "corpus.jsonl"
    ids = [str(j) for j in range(len(task.candidates))]
    corpus_file.write_text("".join(json.dumps({"id": i, "code": c}) + "\n" for i, c in zip(ids, task.candidates, strict=True)))
    t0 = time.perf_counter()
    vectors = dict(zip(task.candidates, embedded(work, encoder, list(task.candidates), args.max_doc_len), strict=True))
    embed_s = time.perf_counter() - t0
    queries = list(task.queries)
    q_vecs = [v.astype(np.float32) for v in Embedder(encoder, args.max_query_len, 32).embed(queries)]
    positives = [ids[p] for p in task.positives]
    meta = {"model": model, "model_digest": model_digest(encoder.path), "max_doc_len": args.max_doc_len,
            "max_query_len": args.max_query_len, "dim": next(iter(vectors.values())).shape[1]}

    def lookup(texts, progress=None):
        return [vectors[t] for t in texts]

    entry = {"language": language, "queries": len(queries), "candidates": len(task.candidates),
             "packages": [s.as_dict() | {"mined": str(root)} for s, root in sources],
             "pairs_mined": len(corpus.pairs), "embed_s": round(embed_s, 1), "pooling": {}}
    for factor in args.pool_factors:
        index_dir = work / f"index-pool{factor}"
        build.update(corpus_file, index_dir, pooled(lookup, factor), meta, rebuild=True)
        index = Index(index_dir)
        results = {}
        for mode, fusion in MODES if factor == 1 else MODES[:1]:
            ranked = index.search_many(queries, q_vecs, mode, top_k=10, fusion=fusion)
            results[mode if mode != "hybrid" else "hybrid_rrf"] = metrics(
                [[index.record(d)["id"] for d, _ in hits] for hits in ranked], positives, args.per_query and factor == 1)
        pooled_entry = {"tokens": index.n_tokens, **index_bytes(index_dir), "semantic": results["semantic"]}
        entry["pooling"][str(factor)] = pooled_entry
        if factor == 1:
            entry.update(results)
    entry["seconds"] = round(time.perf_counter() - started, 1)
    return entry


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="encoder directory (default: the embedded all-MiniLM-L6-v2)")
    parser.add_argument("--languages", default=",".join(package_sources.HELDOUT))
    parser.add_argument("--pool_factors", default="1,2,3")
    parser.add_argument("--max_queries", type=int, default=200)
    parser.add_argument("--max_candidates", type=int, default=1000, help="per language (a seeded sample)")
    parser.add_argument("--max_doc_len", type=int, default=256)
    parser.add_argument("--max_query_len", type=int, default=32)
    parser.add_argument("--cache_dir", type=Path, default=Path("runs/cache"))
    parser.add_argument("--work", type=Path, default=Path("runs/bench_languages"))
    parser.add_argument("--machine", default="cpu")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--per_query", action="store_true",
                        help="also record each query's reciprocal rank (for paired comparisons of models)")
    args = parser.parse_args(argv)
    from mlxio.weights.encoders import default_encoder_path, load_encoder

    args.pool_factors = [int(f) for f in args.pool_factors.split(",")]
    if 1 not in args.pool_factors:
        args.pool_factors.insert(0, 1)
    model = args.model or str(default_encoder_path())
    encoder = load_encoder(model)
    settings = {"model": "all-MiniLM-L6-v2" if args.model is None else model, "max_queries": args.max_queries,
                "max_candidates": args.max_candidates, "pool_factors": args.pool_factors}
    out = args.out or Path("benchmarks/results") / args.machine / "search_languages.json"
    done = json.loads(out.read_text()) if out.is_file() else {}
    entries = [e for e in done.get("languages", []) if all(done.get(k) == v for k, v in settings.items())]
    for language in args.languages.split(","):
        if any(e["language"] == language for e in entries):
            continue  # resumed: measured with these settings already
        entries.append(evaluate_language(language, encoder, model, args))
        write_result("search_languages", {**settings, "languages": entries}, args.machine, path=out)
        e = entries[-1]
        print(f"{language}: {e['queries']} queries / {e['candidates']} candidates: "
              + ", ".join(f"{m} {e[m]['mrr@10']:.3f}" for m in ("semantic", "bm25", "hybrid_rrf"))
              + "; pooling " + ", ".join(f"x{f}: {p['bytes'] / 1e6:.2f} MB {p['semantic']['mrr@10']:.3f}"
                                         for f, p in e["pooling"].items()), flush=True)
    print(out)



def section(payload: dict, machine: str) -> list[str]:
    """The docs' tables of a search_languages.json (docs/performance.md, via benchmarks.make_table)."""
    out = [f"### Code search per language on held-out packages ({machine}, {payload['model']}, "
           "benchmarks/search_languages.py)", "",
           "| language | packages (licence) | queries / candidates | MRR@10 semantic | BM25 | hybrid (RRF) |",
           "|---|---|---|---|---|---|"]
    for e in payload["languages"]:
        packages = ", ".join(f"{p['name']} {p['version']} ({p['licence'].split(' (')[0]})" for p in e["packages"])
        out.append(f"| {e['language']} | {packages} | {e['queries']} / {e['candidates']} | {e['semantic']['mrr@10']:.3f} "
                   f"| {e['bm25']['mrr@10']:.3f} | {e['hybrid_rrf']['mrr@10']:.3f} |")
    factors = [str(f) for f in payload["pool_factors"]]
    out += ["", "Token pooling (`index --pool-factor`): index bytes (all files, and the token payload: centroid "
            "ids + PQ codes; the code text and BM25 postings do not shrink) and semantic MRR@10 by pool factor.", "",
            "| language | " + " | ".join(f"x{f} bytes | x{f} MRR@10" for f in factors) + " |",
            "|---|" + "---|---|" * len(factors)]
    for e in payload["languages"]:
        cells = []
        for f in factors:
            p = e["pooling"][f]
            one = e["pooling"]["1"]
            cells += [f"{p['bytes'] / 1e6:.2f} MB ({p['bytes'] / one['bytes']:.0%}; tokens "
                      f"{p['token_bytes'] / one['token_bytes']:.0%})",
                      f"{p['semantic']['mrr@10']:.3f}"]
        out.append(f"| {e['language']} | " + " | ".join(cells) + " |")
    return out + ["", "Queries: the first sentence of each documented function's doc comment; candidates: the "
                  "packages' functions (a seeded sample with every positive), indexed as `code_search index` does "
                  "(pq codec, 256 tokens).", ""]


if __name__ == "__main__":
    main()
