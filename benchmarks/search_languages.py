"""Code search per language on held-out packages, and what token pooling does to the index:
each language's documented functions (`mlxio.data.package_sources.HELDOUT`: PyPI, npm and
Debian packages, mined by `mlxio.data.pairs` with tree-sitter beyond Python) are indexed as
`code_search index` does (pq codec), then searched by their doc comments' first sentences.

    python -m benchmarks.search_languages [--model DIR] [--languages python,go] [--pool_factors 1,2,3]
        [--codecs pq,pq32] [--max_queries 200] [--max_candidates 1000] [--cache_dir runs/cache] [--work runs/bench_languages]
        [--per_query] [--out FILE]

Per language: MRR@10, P@1 and Recall@10 of the index's semantic, BM25 and hybrid (RRF) rankings
with --model (default: the embedded all-MiniLM-L6-v2), the queries and candidates (every
documented function of the packages, then their undocumented ones, topped up with their short
ones, a seeded sample of --max_candidates kept with every query's positive: `pairs.eval_set`
with every file held out), and each package's licence.
With several --pool_factors, an index per factor from the same document vectors
(`mlxio.search.pooling`): its bytes (all files, the token payload alone, and by part) and its
semantic MRR@10; with --codecs, the same for each residual code, against the default codec at
factor 1. Writes benchmarks/results/<machine>/search_languages.json (--out to override) after
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


def reciprocal_ranks(ranked: list[list[str]], positives: list[str]) -> list[float]:
    """1 / rank of each query's one positive id in its ranked ids, 0 beyond the 10th."""
    return [1.0 / (hits.index(p) + 1) if p in hits[:10] else 0.0 for hits, p in zip(ranked, positives, strict=True)]


def metrics(ranked: list[list[str]], positives: list[str], per_query: bool = False) -> dict:
    """MRR@10, P@1 and Recall@10 of ranked id lists against each query's one positive id; with
    `per_query`, also "rr": each query's reciprocal rank (0 beyond rank 10), in query order."""
    rr = reciprocal_ranks(ranked, positives)
    n = max(len(rr), 1)
    out = {"mrr@10": round(sum(rr) / n, 4), "p@1": round(sum(r == 1.0 for r in rr) / n, 4),
           "recall@10": round(sum(r > 0 for r in rr) / n, 4)}
    if per_query:
        out["rr"] = [round(r, 4) for r in rr]
    return out


def paired_difference(rr: list[float], rr_base: list[float]) -> dict:
    """Mean per-query difference of reciprocal ranks (rr - rr_base, the same queries) and its
    standard error."""
    diff = np.asarray(rr, np.float64) - np.asarray(rr_base, np.float64)
    se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else None
    return {"mrr@10": round(float(diff.mean()), 4) if len(diff) else None, "se": None if se is None else round(se, 4)}


def index_bytes(index_dir: Path) -> dict:
    """Bytes of the live generation: every file, the token payload (centroid ids + residual
    codes) alone, and every part (`store.bytes_by_part`)."""
    from mlxio.search import store

    parts = store.bytes_by_part(store.current(index_dir))
    return {"bytes": sum(parts.values()), "token_bytes": parts["token codes"] + parts["centroid ids"], "parts": parts}


def language_task(language: str, args):
    """(sources, mined corpus, evaluation task) of a language's held-out packages: every
    documented function a query, candidates as the module doc says."""
    sources = [package_sources.fetch_entry(e, args.cache_dir) for e in package_sources.HELDOUT[language]]
    corpus = pairs.mine_corpus([root for _, root in sources], suffixes=suffixes_of(language))
    task = pairs.eval_set(corpus, eval_fraction=1.0, min_queries=0, min_candidates=args.max_candidates,
                          max_queries=args.max_queries, max_candidates=args.max_candidates, strict=False)
    return sources, corpus, task


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
    sources, corpus, task = language_task(language, args)
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
    rr_one = None
    for codec in args.codecs:  # the default first: the base of every comparison
        for factor in args.pool_factors:
            default = codec == args.codecs[0]
            index_dir = work / (f"index-pool{factor}" if default else f"index-{codec}-pool{factor}")
            build.update(corpus_file, index_dir, pooled(lookup, factor), meta, codec=codec, rebuild=True)
            index = Index(index_dir)
            results = {}
            for mode, fusion in MODES if default and factor == 1 else MODES[:1]:
                ranked = index.search_many(queries, q_vecs, mode, top_k=10, fusion=fusion)
                ids_ranked = [[index.record(d)["id"] for d, _ in hits] for hits in ranked]
                results[mode if mode != "hybrid" else "hybrid_rrf"] = metrics(
                    ids_ranked, positives, args.per_query and default and factor == 1)
                if mode == "semantic":
                    rr = reciprocal_ranks(ids_ranked, positives)
            rr_one = rr if rr_one is None else rr_one
            pooled_entry = {"tokens": index.n_tokens, "centroids": len(index.codec.centroids), "codec": index.codec.name,
                            **index_bytes(index_dir), "semantic": results["semantic"],
                            "semantic_minus_x1": paired_difference(rr, rr_one)}
            if default:
                entry["pooling"][str(factor)] = pooled_entry
            else:
                entry.setdefault("codecs", {}).setdefault(index.codec.name, {})[str(factor)] = pooled_entry
            if default and factor == 1:
                entry.update(results)
    entry["seconds"] = round(time.perf_counter() - started, 1)
    return entry


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="encoder directory (default: the embedded all-MiniLM-L6-v2)")
    parser.add_argument("--languages", default=",".join(package_sources.HELDOUT))
    parser.add_argument("--pool_factors", default="1,2,3")
    parser.add_argument("--codecs", default="pq", help="residual codes, the default (pq) first: pool factors x codecs "
                                                       "(e.g. pq,pq48,pq32), each against the default at factor 1")
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

    args.pool_factors = sorted({1, *(int(f) for f in args.pool_factors.split(","))})  # factor 1 first: the base
    model = args.model or str(default_encoder_path())
    encoder = load_encoder(model)
    args.codecs = list(dict.fromkeys(["pq", *args.codecs.split(",")]))
    settings = {"model": "all-MiniLM-L6-v2" if args.model is None else model, "max_queries": args.max_queries,
                "max_candidates": args.max_candidates, "pool_factors": args.pool_factors, "codecs": args.codecs}
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
    out += ["", "Queries: the first sentence of each documented function's doc comment; candidates: the packages' "
            "functions (a seeded sample with every positive), indexed as `code_search index` does (pq codec, 256 tokens)."]
    return out + pooling_section(codec_rows(payload["languages"]), payload["pool_factors"])


def codec_rows(entries: list[dict]) -> list[dict]:
    """`pooling_section` entries: each language's default codec, then its other codecs (each
    against the default codec's factor 1)."""
    rows = []
    for e in entries:
        rows.append(e)
        rows += [{"language": f"{e['language']}, {codec}", "base": e["pooling"]["1"], "pooling": by_factor}
                 for codec, by_factor in e.get("codecs", {}).items()]
    return rows


def guide_section(payload: dict, machine: str) -> list[str]:
    """docs/code-search.md's pooling table of a search_languages.json (no per-part table)."""
    return [f"Held-out packages, one index per language ({machine}, {payload['model']}, "
            "benchmarks/search_languages.py):", *pooling_section(codec_rows(payload["languages"]), payload["pool_factors"],
                                                                  parts=False)]


PARTS = ("token codes", "centroid ids", "codec", "records", "bm25", "inverted lists", "other")


def target_met(entry: dict, factor: str) -> str:
    """Whether factor's index holds <= 50% of the base's bytes (entry["base"], default factor 1's)
    at an MRR@10 loss <= 1%, read as relative (<= 1% of the base's MRR) and as absolute (<= 0.01):
    "yes / no" in that order."""
    one, p = entry.get("base") or entry["pooling"]["1"], entry["pooling"][factor]
    small = p["bytes"] <= 0.5 * one["bytes"]
    loss = one["semantic"]["mrr@10"] - p["semantic"]["mrr@10"]
    return " / ".join("yes" if small and loss <= bound else "no"
                      for bound in (0.01 * one["semantic"]["mrr@10"], 0.01))


def pooling_section(entries: list[dict], pool_factors: list[int], label: str = "language",
                    parts: bool = True) -> list[str]:
    """Tables of pooled indexes (each entry: {label, "pooling": {factor: index_bytes() + semantic
    metrics + semantic_minus_x1}, optionally "base": the index its bytes and MRR are compared with,
    default its factor 1}): bytes and MRR@10 by factor, the target's verdict, and (`parts`) where
    the bytes go."""
    factors = [str(f) for f in pool_factors]
    out = ["", "Token pooling (`index --pool-factor`): index bytes (share of the default codec's index at factor 1) and "
           "semantic MRR@10, with its paired change from that index (± its standard error over the queries); target: <= 50% "
           "of the bytes at <= 1% MRR@10 loss, read as relative (1% of the MRR@10) / absolute (0.01).", "",
           f"| {label} | " + " | ".join(f"x{f} bytes | x{f} MRR@10 | x{f} target" for f in factors) + " |",
           "|---|" + "---|---|---|" * len(factors)]
    for e in entries:
        cells, one = [], e.get("base") or e["pooling"]["1"]
        for f in factors:
            p = e["pooling"][f]
            diff = p.get("semantic_minus_x1") or {}
            base = p is one
            change = f" ({diff['mrr@10']:+.3f} ± {diff['se']:.3f})" if not base and diff.get("se") is not None else ""
            cells += [f"{p['bytes'] / 1e6:.2f} MB ({p['bytes'] / one['bytes']:.0%})",
                      f"{p['semantic']['mrr@10']:.3f}{change}", "-" if base else target_met(e, f)]
        out.append(f"| {e[label]} | " + " | ".join(cells) + " |")
    rows = [(e[label], f, e["pooling"][f]["parts"]) for e in entries for f in factors
            if parts and e.get("parts", "base" not in e) and e["pooling"][f].get("parts")]
    if rows:
        out += ["", "Where the bytes go (`store.bytes_by_part`: token codes = PQ codes, codec = centroids + rotation + "
                "codebooks, records = the code text, other = token offsets, units, manifest):", "",
                f"| {label} | factor | all | " + " | ".join(PARTS) + " |", "|---|---|---|" + "---|" * len(PARTS)]
        for name, f, parts in rows:
            total = sum(parts.values())
            out.append(f"| {name} | x{f} | {total / 1e6:.2f} MB | "
                       + " | ".join(f"{parts.get(k, 0) / 1e3:,.0f} KB ({parts.get(k, 0) / total:.0%})" for k in PARTS) + " |")
    return out + [""]


if __name__ == "__main__":
    main()
